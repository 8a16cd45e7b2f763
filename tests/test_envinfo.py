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


def test_collect_asks_nvidia_smi_once_per_process_and_path(tmp_path, monkeypatch):
    """A runner writes a record per row (and prepares one at each row's start): the GPU facts are asked once."""
    calls = tmp_path / "calls"
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho \"$1\" >> %s\n"
                    "case \"$1\" in\n"
                    "  --query-gpu=*) echo 'NVIDIA H200, 575.57.08, 143771, 9.0' ;;\n"
                    "  *) echo '| NVIDIA-SMI 575.57.08   Driver Version: 575.57.08   CUDA Version: 12.9 |' ;;\n"
                    "esac\n" % calls)
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + os.environ["PATH"])
    first, second = envinfo.collect(), envinfo.collect()
    assert first["gpus"][0]["name"] == "NVIDIA H200" and first["cuda_driver"] == "12.9"
    first["gpus"][0]["name"] = "changed by a caller"          # each record has its own copy
    assert second["gpus"][0]["name"] == "NVIDIA H200" and envinfo.collect()["gpus"][0]["name"] == "NVIDIA H200"
    assert len(calls.read_text().splitlines()) == 2            # the query and the header, once
    monkeypatch.setenv("PATH", os.environ["PATH"].split(os.pathsep, 1)[1])      # another PATH: asked again
    assert envinfo.collect()["gpus"] == []
