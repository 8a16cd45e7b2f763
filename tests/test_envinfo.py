import os
import stat

from common import envinfo


def test_collect_on_this_machine():
    info = envinfo.collect(extra={"cudnn": None})
    assert info["python"].count(".") == 2 and info["cpu"] and info["cpu_count"] >= 1
    assert isinstance(info["gpus"], list) and "cudnn" in info
    assert envinfo.host_peak_rss_bytes() > 1 << 20


def test_gpu_facts_from_nvidia_smi(tmp_path, monkeypatch):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\n"
                    "case \"$1\" in\n"
                    "  --query-gpu=*) echo 'NVIDIA H100 80GB HBM3, 575.57.08, 81559, 9.0' ;;\n"
                    "  *) echo '| NVIDIA-SMI 575.57.08   Driver Version: 575.57.08   CUDA Version: 12.9 |' ;;\n"
                    "esac\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + os.environ["PATH"])
    (gpu,) = envinfo.gpus()
    assert gpu == {"name": "NVIDIA H100 80GB HBM3", "driver": "575.57.08", "memory_mib": 81559,
                   "compute_capability": "9.0"}
    assert envinfo.compute_capability(gpu) == 9.0
    assert envinfo.cuda_driver_version() == "12.9"


def test_no_nvidia_smi(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert envinfo.gpus() == [] and envinfo.cuda_driver_version() is None
