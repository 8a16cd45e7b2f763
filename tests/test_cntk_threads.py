"""CNTK: the notebook trains whatever CPU thread count the process starts with.

CNTK 2.7's first ``Trainer`` sets CNTK's CPU threads to the machine's core count unless they were set, and its MKL
convolution keeps the thread count of its first use and divides by zero when that count changes (SIGFPE: the kernel
dies with no traceback).  With ``OMP_NUM_THREADS=1`` on a machine of 2 cores or more, section 6's forward pass ran at
1 thread and the warm-up's first new batch shape at the Trainer's count: the kernel died in section 8.  The notebook
sets the threads once, in section 2, to the count the process starts with (the CNTK notebook's defaults table).

The default tier runs the notebook's code cells, sections 1 through 9 (smoke: the check, the warm-up, the timed
epoch), as one script in the CNTK environment with ``OMP_NUM_THREADS=1`` (a few seconds); ``--full`` adds
``MKL_NUM_THREADS=1`` and ``taskset -c 0`` (which died the same way), and ``run_all.py`` on the smoke preset with
``OMP_NUM_THREADS=1``, the whole notebook in its Jupyter kernel.  An environment that is not there is made first."""
import json
import math
import os
import shutil
import signal
import subprocess

import pytest

from runner.envs.definitions import ENVS
from runner.run.targets import TARGETS

from .conftest import ROOT, RunAll, cpu_env, ok_record, selected_targets

NOTEBOOK = os.path.join(ROOT, "notebooks", "CNTK_DS2.ipynb")

#: appended after section 9's cell: what the test reads (one JSON line), then the end of the script
REPORT = '''
import json as _json
print("RESULT " + _json.dumps({"cpu_threads": cpu_threads, "cntk_threads_now": C.cntk_py.get_max_num_cputhreads(),
                               "warmup_steps": len(timer.warmup_losses), "steps": len(timer.steps),
                               "batches": len(train_data), "losses": [float(s.loss) for s in timer.steps]}))
raise SystemExit(0)
'''


def sections_1_to_9(result_path):
    """The notebook's code cells from the first through section 9's (``rosetta:epoch``) as one script: the
    parameters cell's values followed by the smoke preset on the CPU, as papermill would inject them."""
    with open(NOTEBOOK, encoding="utf-8") as f:
        cells = [c for c in json.load(f)["cells"] if c["cell_type"] == "code"]
    parts = []
    for cell in cells:
        tags = cell.get("metadata", {}).get("tags", [])
        parts.append("".join(cell["source"]))
        if "parameters" in tags:
            parts.append("preset = 'smoke'\ndevice = 'cpu'\nresult_path = %r\n" % result_path)
        if "rosetta:epoch" in tags:
            parts.append(REPORT)
            return "\n\n".join(parts)
    raise AssertionError("no cell tagged rosetta:epoch in %s" % NOTEBOOK)


def cntk_python():
    """The CNTK CPU environment and its interpreter (:func:`tests.conftest.cpu_env`: made when not there yet)."""
    if "cntk" not in selected_targets():
        pytest.skip("cntk is not among DS2_TEST_FRAMEWORKS")
    return cpu_env("cntk")


def run_sections(tmp_path, prefix=(), **environ):
    venv, python = cntk_python()
    script = tmp_path / "cntk_sections_1_to_9.py"
    script.write_text(sections_1_to_9(str(tmp_path / "record.json")), encoding="utf-8")
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", CUDA_VISIBLE_DEVICES="", **environ)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        if name not in environ:
            env.pop(name, None)
    env.update(ENVS[TARGETS["cntk"].env].kernel_env(venv))
    proc = subprocess.run(list(prefix) + [python, "-X", "faulthandler", str(script)],
                          cwd=os.path.join(ROOT, "notebooks"), env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, timeout=600)
    died = (" (died of %s)" % signal.Signals(-proc.returncode).name) if proc.returncode < 0 else ""
    assert proc.returncode == 0, "exit %d%s:\n%s" % (proc.returncode, died, proc.stdout[-3000:])
    result = json.loads(proc.stdout.split("RESULT ")[-1])
    assert result["warmup_steps"] > 0 and result["steps"] == result["batches"] > 0, result
    assert all(math.isfinite(loss) for loss in result["losses"]), result
    return result


def test_one_openmp_thread_trains_on_one_thread(tmp_path):
    """OMP_NUM_THREADS=1: sections 1-9 complete (the warm-up died of SIGFPE before the notebook set the threads),
    on one thread, which the Trainer left as it was."""
    result = run_sections(tmp_path, OMP_NUM_THREADS="1")
    assert result["cpu_threads"] == result["cntk_threads_now"] == 1, result


@pytest.mark.full
def test_one_mkl_thread_or_one_core_trains(tmp_path):
    """MKL_NUM_THREADS=1 (MKL's count was 1, the Trainer's 2) and taskset -c 0 (OpenMP's count 1, the Trainer's the
    machine's cores) died the same way: both complete, with the count the process started with."""
    mkl = run_sections(tmp_path, MKL_NUM_THREADS="1")
    assert mkl["cpu_threads"] == mkl["cntk_threads_now"] >= 1, mkl
    if not shutil.which("taskset"):
        pytest.skip("no taskset (util-linux) for the one-core run")
    one_core = run_sections(tmp_path, prefix=("taskset", "-c", str(min(os.sched_getaffinity(0)))))
    assert one_core["cpu_threads"] == one_core["cntk_threads_now"] == 1, one_core
    assert one_core["losses"] == pytest.approx(mkl["losses"], rel=1e-4)    # the thread count changes no loss


@pytest.mark.full
def test_run_all_with_one_openmp_thread(tmp_path):
    """run_all.py --frameworks cntk on the smoke preset with OMP_NUM_THREADS=1: the whole notebook in its Jupyter
    kernel; the record says it ran on one thread."""
    cntk_python()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        run = RunAll(["--preset", "smoke", "--device", "cpu", "--frameworks", "cntk", "--timeout", "900"], tmp_path)
    rec = ok_record(run, "cntk")                # skipped with the runner's reason when it skipped the row
    assert rec["options"]["cpu_threads"] == 1, rec["options"]
