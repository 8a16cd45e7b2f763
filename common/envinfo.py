"""Where a run happened: OS, Python, CPU, GPU, driver, CUDA -- framework-free.

GPU facts come from ``nvidia-smi`` when it is on PATH; cuDNN and the CUDA a framework was
built against are known only to the framework, so notebooks add those themselves.
Only the standard library is used (run_all.py calls this before any framework exists).
"""
import functools
import json
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


@functools.lru_cache(maxsize=None)
def _gpu_facts(path: str) -> str:
    """:func:`gpus` and :func:`cuda_driver_version` as JSON, asked once per process and PATH (which nvidia-smi
    answers): a runner writes a record per row, and each answer costs two runs of nvidia-smi."""
    return json.dumps({"gpus": gpus(), "cuda_driver": cuda_driver_version()})


def collect(extra: Optional[dict] = None) -> dict:
    """Facts about this machine for a result record; ``extra`` (e.g. cuDNN) is merged in."""
    info = {
        "os": platform.platform(),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
    }
    info.update(json.loads(_gpu_facts(os.environ.get("PATH", ""))))     # a fresh copy for each record
    if extra:
        info.update(extra)
    return info


def cpu_flags() -> set:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_clock_hz() -> Optional[float]:
    """The highest clock the OS reports: lscpu's "CPU max MHz" where known, else /proc/cpuinfo's "cpu MHz"."""
    out = _run(["lscpu"]) or ""
    m = re.search(r"CPU max MHz:\s*([\d.]+)", out)
    if m and float(m.group(1)) > 0:
        return float(m.group(1)) * 1e6
    try:
        with open("/proc/cpuinfo") as f:
            mhz = [float(line.split(":", 1)[1]) for line in f if line.lower().startswith("cpu mhz")]
        return max(mhz) * 1e6 if mhz else None
    except (OSError, ValueError):
        return None


def cpu_count() -> int:
    """Logical CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpu_theoretical_peak(precision: str = "fp32") -> Optional[dict]:
    """The CPU's theoretical dense FLOP/s, labelled with its assumptions: logical CPUs x FMA units x
    SIMD lanes x 2 FLOPs per FMA x clock, from /proc/cpuinfo and lscpu.

    Assumed (not readable from the OS): 2 FMA units per core (Intel Xeon since Skylake-SP, AMD Zen
    2-5) and one logical CPU per physical core (a VM's vCPU may be a hyperthread sharing its core's
    units). bf16: AMX (``amx_bf16``: 1024 FLOPs per cycle per core, Intel's figure for Sapphire Rapids)
    or AVX-512 BF16 (twice fp32's rate); tf32 has no CPU form (None).
    """
    if precision == "tf32":
        return None
    flags = cpu_flags()
    clock = cpu_clock_hz()
    if not flags or not clock:
        return None
    cores = cpu_count()
    fma_units = 2
    if "avx512f" in flags:
        isa, lanes = "AVX-512", 16
    elif "avx2" in flags and "fma" in flags:
        isa, lanes = "AVX2+FMA", 8
    else:
        isa, lanes, fma_units = "SSE", 4, 1
    per_cycle = fma_units * lanes * 2
    basis = "%d logical CPUs x %d FMA units x %d fp32 lanes (%s) x 2 FLOPs x %.2f GHz" % (
        cores, fma_units, lanes, isa, clock / 1e9)
    if precision == "fp64":                # the float64 control: half the lanes
        per_cycle //= 2
        basis = basis.replace("%d fp32 lanes" % lanes, "%d fp64 lanes" % (lanes // 2))
    if precision == "bf16":
        if "amx_bf16" in flags:
            per_cycle, basis = 1024, "%d logical CPUs x 1024 bf16 FLOPs per cycle (AMX) x %.2f GHz" % (cores, clock / 1e9)
        elif "avx512_bf16" in flags:
            per_cycle *= 2
            basis = basis.replace("fp32 lanes", "bf16 pairs") + " (AVX-512 BF16: 2 products per lane)"
    return {"flops_per_s": float(cores * per_cycle * clock), "precision": precision, "basis": basis,
            "assumptions": "2 FMA units per core and one logical CPU per core; clock as the OS reports it "
                           "(turbo and AVX-512 down-clocking not modelled)", "label": "theoretical"}


def host_peak_rss_bytes() -> Optional[int]:
    """Peak resident memory of this process (Linux: ru_maxrss is in KiB)."""
    try:
        import resource
    except ImportError:
        return None
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss) * (1 if sys.platform == "darwin" else 1024)


def device_slug(name: str) -> str:
    """A device's name as the records' file names spell it: ``NVIDIA H200`` -> ``nvidia-h200``."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
