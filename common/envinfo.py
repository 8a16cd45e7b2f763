"""Where a run happened: OS, Python, CPU, GPU, driver, CUDA -- framework-free.

GPU facts come from ``nvidia-smi`` when it is on PATH; cuDNN and the CUDA a framework was
built against are known only to the framework, so notebooks add those themselves.
Only the standard library is used (run_all.py calls this before any framework exists).
"""
import os
import platform
import re
import subprocess
import sys
from typing import List, Optional


def _run(args: List[str], timeout: float = 20.0) -> Optional[str]:
    try:
        proc = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              universal_newlines=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


GPU_FIELDS = ["name", "driver_version", "memory.total", "compute_cap"]


def parse_gpus(text: Optional[str]) -> List[dict]:
    """What ``nvidia-smi --query-gpu=name,driver_version,memory.total[,compute_cap]
    --format=csv,noheader,nounits`` printed -> one dict per GPU: name, driver, memory_mib,
    compute_capability (absent when the driver is too old to report it)."""
    result = []
    for line in (text or "").strip().splitlines():
        values = [v.strip() for v in line.split(",")]
        if not values[0]:
            continue
        gpu = dict(zip(["name", "driver", "memory_mib", "compute_capability"], values))
        if "memory_mib" in gpu:
            try:
                gpu["memory_mib"] = int(float(gpu["memory_mib"]))
            except ValueError:
                pass
        result.append(gpu)
    return result


def gpus() -> List[dict]:
    """NVIDIA GPUs visible to nvidia-smi (the first one on PATH): name, driver, memory (MiB), compute capability."""
    out = _run(["nvidia-smi", "--query-gpu=" + ",".join(GPU_FIELDS), "--format=csv,noheader,nounits"])
    if out is None:  # drivers older than 510 do not know compute_cap
        out = _run(["nvidia-smi", "--query-gpu=" + ",".join(GPU_FIELDS[:3]), "--format=csv,noheader,nounits"])
    return parse_gpus(out)


def cuda_driver_version() -> Optional[str]:
    """The CUDA version the installed driver supports (nvidia-smi's header)."""
    out = _run(["nvidia-smi"])
    m = re.search(r"CUDA Version:\s*([\d.]+)", out or "")
    return m.group(1) if m else None


def compute_capability(gpu: dict) -> Optional[float]:
    try:
        return float(gpu.get("compute_capability", ""))
    except ValueError:
        return None


def collect(extra: Optional[dict] = None) -> dict:
    """Facts about this machine for a result record; ``extra`` (e.g. cuDNN) is merged in."""
    info = {
        "os": platform.platform(),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "gpus": gpus(),
        "cuda_driver": cuda_driver_version(),
    }
    if extra:
        info.update(extra)
    return info


def host_peak_rss_bytes() -> Optional[int]:
    """Peak resident memory of this process (Linux: ru_maxrss is in KiB)."""
    try:
        import resource
    except ImportError:
        return None
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss) * (1 if sys.platform == "darwin" else 1024)
