"""The developer check of the GPU environments (tools/check_gpu_envs.py) without building any: which
libraries it looks at, which missing ones it forgives (the driver's), and the library path it uses; the AVX2-only
wrapper; tools/compare_runs.py (the same rows on two machines)."""
import os
import shutil
import sys

import pytest

from runner.envs.definitions import ENVS
from tests.conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "tools"))
import check_gpu_envs  # noqa: E402


def test_driver_libraries_are_forgiven_nothing_else():
    for name in ("libcuda.so.1", "libnvidia-ml.so.1", "libnvidia-ptxjitcompiler.so.1"):
        assert check_gpu_envs.is_driver_library(name)
    for name in ("libcudart.so.11.0", "libcudnn.so.8", "libmpi.so.12", "libcublas.so.13"):
        assert not check_gpu_envs.is_driver_library(name)


def test_it_checks_elf_shared_libraries_only(tmp_path):
    lib = tmp_path / "lib" / "python3.11" / "site-packages" / "pkg"
    lib.mkdir(parents=True)
    (lib / "a.so").write_bytes(b"\x7fELF....")
    (lib / "b.so.12").write_bytes(b"\x7fELF....")
    (lib / "c.so.txt").write_bytes(b"\x7fELF....")       # not a library name
    (lib / "d.so").write_text("INPUT(-lfoo)")           # a linker script
    os.symlink(str(lib / "a.so"), str(lib / "a.so.1"))  # links are their targets, counted once
    assert sorted(os.path.basename(p) for p in check_gpu_envs.shared_libraries(str(tmp_path))) == ["a.so", "b.so.12"]


@pytest.mark.skipif(shutil.which("ldd") is None, reason="no ldd on this machine")
def test_missing_libraries_of_a_real_library():
    import ctypes.util
    libc = ctypes.util.find_library("c")
    path = next((os.path.join(d, libc) for d in ("/lib/x86_64-linux-gnu", "/usr/lib64", "/lib64", "/usr/lib")
                 if libc and os.path.exists(os.path.join(d, libc))), None)
    if path is None:
        pytest.skip("libc not found at a usual place")
    assert check_gpu_envs.missing_libraries(path, "") == []


def test_kernel_library_path_is_the_kernels(tmp_path, monkeypatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", "/machine/lib")
    venv = tmp_path / "venv"
    (venv / "lib" / "python3.11" / "site-packages" / "nvidia" / "cudnn" / "lib").mkdir(parents=True)
    path = check_gpu_envs.kernel_library_path(ENVS["mxnet"], str(venv))
    assert path.split(os.pathsep) == [str(venv / "lib" / "python3.11" / "site-packages" / "nvidia" / "cudnn" / "lib"),
                                      "/machine/lib"]
    assert check_gpu_envs.kernel_library_path(ENVS["pytorch"], str(venv)) == "/machine/lib"
    assert check_gpu_envs.kernel_library_path(ENVS["cntk"], str(venv)).split(os.pathsep)[0] == str(venv / "mpi-compat")


def test_dest_inside_the_repository_is_refused(capsys):
    """A folder of the checkout that exists (so no other refusal, such as --no-build's "no such directory", can
    stand in for this one)."""
    with pytest.raises(SystemExit) as stop:
        check_gpu_envs.main(["--dest", os.path.join(ROOT, "results"), "--no-build"])
    lines = capsys.readouterr().err.splitlines()
    assert stop.value.code == 2 and len(lines) == 1 and "--dest must lie outside the repository" in lines[0], lines


# ---- tools/avx2_only.sh: the tier as on an AVX2-only CPU ------------------------------------------------------
def test_avx2_only_hides_avx512_from_the_runner_and_caps_the_libraries():
    """Under tools/avx2_only.sh the runner reads a CPU without AVX-512 (MXNet's bf16 row is skipped with its reason,
    as on an AMD EPYC) and the libraries get their AVX2 caps; the real /proc/cpuinfo is untouched afterwards."""
    import subprocess
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("tools/avx2_only.sh needs root and unshare for its mount namespace")
    probe = ("import os; from common.envinfo import cpu_flags; from runner.run.targets import TARGETS; "
             "print(sorted(f for f in cpu_flags() if f.startswith(('avx512', 'amx'))), "
             "TARGETS['mxnet'].cpu_precision_reason('bf16') is not None, os.environ['XLA_FLAGS'], "
             "os.environ['ONEDNN_MAX_CPU_ISA'])")
    script = os.path.join(ROOT, "tools", "avx2_only.sh")
    # once, and nested (as when the tier that holds this test runs under the script): the caps are not repeated
    for argv in ([script], [script, script]):
        out = subprocess.run(argv + [sys.executable, "-c", probe], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["[]", "True", "--xla_cpu_max_isa=AVX2", "AVX2"], (argv, out.stdout)
    refused = subprocess.run([script], stderr=subprocess.PIPE,
                             universal_newlines=True)
    assert refused.returncode == 2 and refused.stderr.startswith("usage: tools/avx2_only.sh")


# ---- tools/compare_runs.py: the same rows on two machines ------------------------------------------------------
def _write_record(folder, name, machine, wall, warmup, speed, status="ok"):
    from common import results
    folder.mkdir(parents=True, exist_ok=True)
    results.write_record(str(folder / (name + ".json")), dict(
        schema_version=results.SCHEMA_VERSION, status=status, target=name.split("_")[0], framework="F",
        error=None if status == "ok" else "it failed", device={"type": "cpu", "name": machine},
        run={"wall_s": wall}, timing={"warmup_s": warmup, "audio_s_per_s": speed}))


def test_compare_runs_puts_the_rows_both_ran_side_by_side_with_their_ratios(tmp_path, capsys):
    import compare_runs
    a, b = tmp_path / "a", tmp_path / "b"
    _write_record(a, "pytorch_smoke_fp32_bs8_cpu", "AMD EPYC", 60.0, 3.0, 200.0)
    _write_record(b, "pytorch_smoke_fp32_bs8_cpu", "Xeon", 30.0, 2.0, 400.0)
    _write_record(a, "jax_smoke_fp32_bs8_cpu", "AMD EPYC", 40.0, 20.0, 100.0)
    _write_record(b, "jax_smoke_fp32_bs8_cpu", "Xeon", 40.0, 20.0, 100.0, status="failed")   # not compared
    _write_record(a, "mxnet_smoke_fp32_bs8_cpu", "AMD EPYC", 10.0, 1.0, 50.0)                 # A only
    assert compare_runs.main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("A: AMD EPYC (%s); B: Xeon (%s)" % (a, b))
    assert "| pytorch_smoke_fp32_bs8_cpu | 60.0 | 30.0 | 2.00 | 3.0 | 2.0 | 1.50 | 200.0 | 400.0 | 2.00 |" in out
    assert "jax_" not in out and "mxnet_" not in out and "| all (1) | 60.0 | 30.0 | 2.00 |" in out


def test_compare_runs_refuses_a_missing_folder_and_folders_with_nothing_in_common(tmp_path, capsys):
    import compare_runs
    _write_record(tmp_path / "a", "pytorch_smoke_fp32_bs8_cpu", "A", 1.0, 1.0, 1.0)
    _write_record(tmp_path / "b", "jax_smoke_fp32_bs8_cpu", "B", 1.0, 1.0, 1.0)
    assert compare_runs.main([str(tmp_path / "a"), str(tmp_path / "nope")]) == 2
    assert compare_runs.main([str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    assert compare_runs.main([str(tmp_path / "a")]) == 2
    (tmp_path / "b" / "broken.json").write_text('{"status": "ok"}')            # not a record of this schema
    assert compare_runs.main([str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "compare_runs.py: error: no folder %s" % (tmp_path / "nope")
    assert err[1].startswith("compare_runs.py: error: no ok record of the same name in ")
    assert err[2] == ("compare_runs.py: error: expected two record folders, got %s: usage: compare_runs.py RECORDS_A "
                      "RECORDS_B" % (tmp_path / "a"))
    assert err[3].startswith("compare_runs.py: error: record schema_version None") and len(err) == 4
    readme = os.path.join(ROOT, "README.md")
    assert compare_runs.main(["", str(tmp_path / "a")]) == compare_runs.main([readme, str(tmp_path / "a")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "compare_runs.py: error: '' is empty: an empty path names no folder",
        "compare_runs.py: error: %s is not a folder: name a folder of records (results/records)" % readme]
    assert compare_runs.main(["--help"]) == 0 and capsys.readouterr().out.startswith("usage: compare_runs.py")
