"""Ctrl-C and SIGTERM during a real run: the run ends within seconds with one line on stderr and
exit status 130 / 143, the running target's record says why, its kernel is gone, no
``*.partial.ipynb`` is left and results.md is regenerated."""
import getpass
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import nbformat
import pytest

from common import results
from common.processes import host_id, process_start_time
from tests.conftest import ROOT

STARTUP_S = 600      # environment check, kernel start and the first cell, on a busy 2-core machine
STOP_S = 30          # "within seconds": from the signal to the exit of run_all.py


def processes():
    """{pid: (ppid, pgid, state, args)} of every process, from ps."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid=,ppid=,pgid=,stat=,args="], stdout=subprocess.PIPE,
                         universal_newlines=True).stdout
    procs = {}
    for line in out.splitlines():
        pid, ppid, pgid, stat, args = (line.split(None, 4) + [""])[:5]
        procs[int(pid)] = (int(ppid), int(pgid), stat, args)
    return procs


def kernels_of(pid):
    """The Jupyter kernels run_all.py (``pid``) started: its children running ipykernel."""
    return [k for k, (ppid, _, _, args) in processes().items() if ppid == pid and "ipykernel" in args]


def alive(pgids):
    """Processes (not zombies) still in any of the process groups ``pgids``."""
    return [(pid, args) for pid, (_, pgid, stat, args) in processes().items() if pgid in pgids and
            not stat.startswith("Z")]


def executed_cells(path):
    try:
        with open(path) as f:
            nb = json.load(f)
    except (OSError, ValueError):      # not there yet, or being written
        return 0
    return sum(1 for c in nb["cells"] if c["cell_type"] == "code" and c.get("execution_count"))


def tmp_of(results_dir):
    """The temporary folder of the run writing into ``results_dir``: beside it, empty."""
    tmp = os.path.join(os.path.dirname(results_dir), "tmp")
    os.makedirs(tmp, exist_ok=True)
    return tmp


def start_pytorch_run(results_dir):
    """run_all.py in a session of its own (like a terminal's job), stopped once its notebook runs."""
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "run_all.py"), "--preset", "smoke", "--frameworks",
                             "pytorch", "--no-progress", "--results-dir", results_dir], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                            start_new_session=True, env=dict(os.environ, TMPDIR=tmp_of(results_dir)))
    deadline = time.time() + STARTUP_S
    partial = os.path.join(results_dir, "notebooks", "*.partial.ipynb")
    while time.time() < deadline:
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail("run_all.py ended before its notebook ran (%s):\n%s\n%s" % (proc.returncode, out, err))
        hits = glob.glob(partial)
        kernels = kernels_of(proc.pid)
        if hits and kernels and executed_cells(hits[0]) >= 2:
            return proc, kernels
        time.sleep(0.2)
    proc.kill()
    pytest.fail("the notebook did not start running within %d s" % STARTUP_S)


def stop_and_check(proc, kernels, results_dir, send, status, reason):
    t0 = time.time()
    send(proc)
    try:
        out, err = proc.communicate(timeout=STOP_S + 30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail("run_all.py did not end after the signal:\n%s\n%s" % (out, err))
    took = time.time() - t0
    print(out, err)
    # exit status, one line on stderr, within seconds
    assert proc.returncode == status, (proc.returncode, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("run_all.py: %s" % reason), err
    assert "during pytorch fp32" in lines[0] and "regenerated" in lines[0]
    assert took < STOP_S, "took %.1f s to stop" % took
    # the running target's record
    recs = results.read_records(os.path.join(results_dir, "records"))
    assert len(recs) == 1, recs
    rec = recs[0]
    assert rec["target"] == "pytorch" and rec["status"] == "failed" and rec["error"].startswith(reason), rec["error"]
    # the executed part of the notebook, under its final name; no partial files
    notebooks = os.listdir(os.path.join(results_dir, "notebooks"))
    assert not [n for n in notebooks if "partial" in n], notebooks
    leftovers = [p for p in glob.glob(os.path.join(results_dir, "**", "*"), recursive=True) if ".partial" in p]
    assert not leftovers, leftovers
    assert notebooks == [os.path.basename(rec["run"]["executed_notebook"])], (notebooks, rec["run"])
    nb = nbformat.read(os.path.join(results_dir, "notebooks", notebooks[0]), as_version=4)
    assert sum(1 for c in nb.cells if c.cell_type == "code" and c.get("execution_count")) >= 2
    # results.md regenerated from the record
    with open(os.path.join(results_dir, "results.md")) as f:
        md = f.read()
    assert "not finished (interrupted): %s" % reason in md, md
    # no kernel (nor anything it started) survives
    deadline = time.time() + 5
    while alive(kernels) and time.time() < deadline:
        time.sleep(0.1)
    assert not alive(kernels), alive(kernels)
    assert not alive([proc.pid]), alive([proc.pid])
    assert os.listdir(tmp_of(results_dir)) == [], "the run left %s" % os.listdir(tmp_of(results_dir))


def test_ctrl_c_in_a_terminal(tmp_path):
    """A terminal sends SIGINT to the foreground process group."""
    results_dir = str(tmp_path / "results")
    proc, kernels = start_pytorch_run(results_dir)
    stop_and_check(proc, kernels, results_dir, lambda p: os.killpg(p.pid, signal.SIGINT), 130, "interrupted")


def test_sigterm_as_timeout_sends_it(tmp_path):
    """``timeout`` signals run_all.py only (which re-executed itself into the runner's Python, same pid)."""
    results_dir = str(tmp_path / "results")
    proc, kernels = start_pytorch_run(results_dir)
    stop_and_check(proc, kernels, results_dir, lambda p: os.kill(p.pid, signal.SIGTERM), 143, "terminated")


def test_a_row_whose_runner_was_killed_outright_is_recorded_by_the_next_run(tmp_path):
    """SIGKILL to run_all.py alone (the out-of-memory killer, ``kill -9``): it can write nothing, and its kernel
    stops itself.  The next run into the same results directory writes the row's failed record, prepared when the
    row started, keeps the part of the notebook that ran, and results.md says the row did not finish (an earlier
    run's record of it would otherwise stand for it)."""
    results_dir = str(tmp_path / "results")
    proc, kernels = start_pytorch_run(results_dir)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=STOP_S)
    deadline = time.time() + 10
    while alive(kernels) and time.time() < deadline:
        time.sleep(0.1)
    assert not alive(kernels), "the kernel outlived its runner by 10 s: %s" % alive(kernels)
    assert results.read_records(os.path.join(results_dir, "records")) == []
    stem = "pytorch_smoke_fp32_bs8_cpu"
    assert sorted(os.listdir(os.path.join(results_dir, ".staging"))) == [stem + ".killed.json", stem + ".owner"]
    # the next run, of another row
    nxt = subprocess.run([sys.executable, os.path.join(ROOT, "run_all.py"), "--preset", "smoke", "--frameworks",
                          "mxnet", "--no-progress", "--results-dir", results_dir], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, timeout=STARTUP_S,
                         env=dict(os.environ, TMPDIR=tmp_of(results_dir)))
    assert nxt.returncode == 0, nxt.stdout
    recs = {r["target"]: r for r in results.read_records(os.path.join(results_dir, "records"))}
    assert recs["mxnet"]["status"] == "ok", recs["mxnet"]
    rec = recs["pytorch"]
    assert rec["status"] == "failed" and rec["error"].startswith("the runner (pid %d) ended while this row ran"
                                                                 % proc.pid), rec
    assert rec["run"]["executed_notebook"].endswith("notebooks/%s.ipynb" % stem), rec["run"]
    notebooks = os.listdir(os.path.join(results_dir, "notebooks"))
    assert stem + ".ipynb" in notebooks and not [n for n in notebooks if "partial" in n], notebooks
    nb = nbformat.read(os.path.join(results_dir, "notebooks", stem + ".ipynb"), as_version=4)
    assert sum(1 for c in nb.cells if c.cell_type == "code" and c.get("execution_count")) >= 2
    assert os.listdir(os.path.join(results_dir, ".staging")) == []
    with open(os.path.join(results_dir, "results.md")) as f:
        assert "not finished (interrupted): the runner (pid %d)" % proc.pid in f.read()
    assert os.listdir(tmp_of(results_dir)) == [], "left %s" % os.listdir(tmp_of(results_dir))


def test_a_kernel_stopped_outright_leaves_nothing_in_the_temporary_folder(tmp_path, monkeypatch):
    """Each notebook's kernel gets a temporary folder of its own, removed when the notebook ends, even when the
    kernel was killed (it cannot clean up then: TensorFlow's AutoGraph sources, a profiler's trace folder were
    left).  PyTorch Inductor's compile cache stays at its default place, in the caller's temporary folder."""
    from common.spec import get_preset
    from runner.run import execute
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    nb.cells = [nbformat.v4.new_code_cell("import os, tempfile\n"
                                          "print(tempfile.mkdtemp(prefix='left-'), os.environ['TORCHINDUCTOR_CACHE_DIR'])"),
                nbformat.v4.new_code_cell("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")]
    nbformat.write(nb, str(tmp_path / "in.ipynb"))
    opts = execute.RunOptions(get_preset("smoke"), "fp32", 0, "cpu", str(tmp_path), timeout=STARTUP_S,
                              progress=False)
    error = execute.run_papermill(str(tmp_path / "in.ipynb"), str(tmp_path / "out.ipynb"), {}, "python3",
                                  str(tmp_path), opts, str(tmp_path / "kernel.log"))
    assert type(error).__name__ == "DeadKernelError", error
    left, cache = nbformat.read(str(tmp_path / "out.ipynb"), as_version=4).cells[0].outputs[0]["text"].split()
    assert os.path.dirname(os.path.dirname(left)) == str(tmp), left
    assert os.path.basename(os.path.dirname(left)).startswith("ds2-kernel-"), left
    assert os.listdir(str(tmp)) == [], "the notebook left %s" % os.listdir(str(tmp))
    assert cache == os.path.join(str(tmp), "torchinductor_" + getpass.getuser()), cache


KILLED_RUNNER = textwrap.dedent("""
    import sys, tempfile
    sys.path.insert(0, %r)
    import nbformat
    from common.spec import get_preset
    from runner.run import execute
    work, tmp, cell = sys.argv[1:4]
    tempfile.tempdir = tmp
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    nb.cells = [nbformat.v4.new_code_cell(cell)]
    nbformat.write(nb, work + "/in.ipynb")
    opts = execute.RunOptions(get_preset("smoke"), "fp32", 0, "cpu", work, timeout=600, progress=False)
    execute.run_papermill(work + "/in.ipynb", work + "/out.ipynb", {}, "python3", work, opts, work + "/kernel.log")
""" % ROOT)
#: the notebook's one cell: it writes its pid and a temporary folder of its own, then runs on
KERNEL_CELL = ("import os, tempfile, time\n"
               "open(%r + '.part', 'w').write('%%d %%s' %% (os.getpid(), tempfile.mkdtemp()))\n"
               "os.rename(%r + '.part', %r)\n"
               "time.sleep(300)")


def test_what_a_runner_killed_outright_left_the_next_run_removes(tmp_path):
    """A runner SIGKILLed during a notebook (the OOM killer): its kernel stops itself (ipykernel watches its
    parent), and the kernel's temporary folder -- its connection file, what it wrote there -- is what the next
    run's temporary folder removes, because its name says that runner is gone.  A live runner's is kept."""
    from runner import interrupt
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    marker = tmp_path / "kernel"
    cell = KERNEL_CELL % (str(marker), str(marker), str(marker))
    runner = subprocess.Popen([sys.executable, "-c", KILLED_RUNNER, str(tmp_path), str(tmp), cell])
    try:
        deadline = time.time() + STARTUP_S
        while not marker.exists() and time.time() < deadline and runner.poll() is None:
            time.sleep(0.2)
        kernel, left = marker.read_text().split()
    finally:
        runner.kill()
        runner.wait()
    deadline = time.time() + 10
    while alive_pid(int(kernel)) and time.time() < deadline:
        time.sleep(0.1)
    assert not alive_pid(int(kernel)), "the kernel outlived its runner by 10 s"
    folders = os.listdir(str(tmp))
    assert len(folders) == 1 and folders[0].startswith("ds2-kernel-%s.%d." % (host_id(), runner.pid)), folders
    assert os.path.dirname(left) == str(tmp / folders[0])
    assert "kernel-connection.json" in os.listdir(str(tmp / folders[0]))
    live = tmp / ("ds2-kernel-%s.%d.%s-x" % (host_id(), os.getpid(), process_start_time(os.getpid())))
    elsewhere = tmp / ("ds2-kernel-%s.%d.1-x" % ("0" * 8 if host_id() != "0" * 8 else "1" * 8, runner.pid))
    kept = [live.name, elsewhere.name, "ds2-kernel-made-by-hand"]     # another host's (or container's) is not judged
    for name in kept:
        (tmp / name).mkdir()
    with interrupt.temporary_folder("ds2-kernel-", str(tmp)) as mine:
        assert sorted(os.listdir(str(tmp))) == sorted(kept + [os.path.basename(mine)])
    assert sorted(os.listdir(str(tmp))) == sorted(kept)


def alive_pid(pid):
    return bool(alive_pids([pid]))


def alive_pids(pids):
    return [pid for pid, (_, _, stat, _) in processes().items() if pid in pids and not stat.startswith("Z")]


SECOND_SIGNAL = textwrap.dedent("""
    import os, signal, sys, time
    sys.path.insert(0, %r)
    from runner import interrupt
    interrupt.install()
    try:
        print("ready", flush=True)               # the handler is in place: the test signals only now
        time.sleep(30)
    except interrupt.Interrupted as e:
        print("cleaning up after", e.reason, flush=True)
        os.kill(os.getpid(), signal.SIGINT)      # the user presses Ctrl-C again
        time.sleep(30)                           # a slow clean-up
        print("clean-up finished")
""" % ROOT)


def test_a_second_ctrl_c_during_the_clean_up_exits_at_once():
    proc = subprocess.Popen([sys.executable, "-c", SECOND_SIGNAL], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            universal_newlines=True)
    assert proc.stdout.readline().strip() == "ready"   # not a sleep: a loaded machine may take longer to get there
    t0 = time.time()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert time.time() - t0 < 10
    assert proc.returncode == 130
    assert out.strip() == "cleaning up after interrupted (SIGINT)"
    assert err.strip() == "run_all.py: SIGINT again during the clean-up; stopped at once"


HARD_STOP = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    sys.path.insert(0, %r)
    from runner import interrupt
    interrupt.install()
    # a worker that ignores SIGTERM (as JAX's preemption notifier makes one), in a session of its own
    child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                              "signal.SIG_IGN); print('ready', flush=True); time.sleep(120)"],
                             stdout=subprocess.PIPE, start_new_session=True)
    child.stdout.readline()
    interrupt.track_run("run", lambda sig: os.killpg(child.pid, sig))
    try:
        print(child.pid, flush=True)             # inside the try: the test's SIGINT may follow at once
        time.sleep(30)
    except interrupt.Interrupted:
        os.killpg(child.pid, signal.SIGTERM)     # the clean-up's polite first step: ignored
        time.sleep(30)                           # waiting for it; the second signal comes now
""" % ROOT)


def test_a_second_signal_sigkills_every_tracked_run_before_the_runner_exits():
    proc = subprocess.Popen([sys.executable, "-c", HARD_STOP], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            universal_newlines=True)
    child = int(proc.stdout.readline())
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=20)
    assert time.time() - t0 < 10 and proc.returncode == 130        # at once, not after the clean-up's 30-s wait
    assert err.strip() == "run_all.py: SIGTERM again during the clean-up; stopped at once"
    deadline = time.time() + 5
    while time.time() < deadline and alive([child]):
        time.sleep(0.05)
    assert not alive([child]), "the worker that ignores SIGTERM outlived the runner"


DEFERRED = textwrap.dedent("""
    import os, signal, sys, time
    sys.path.insert(0, %r)
    from runner import interrupt
    interrupt.install()
    interrupt.GRACE_S = 2
    try:
        with interrupt.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            print("the block goes on", flush=True)
            time.sleep(0.2)
            print("and ends", flush=True)
        print("not reached")
    except interrupt.Interrupted as e:
        print(e.reason, e.exit_status)
    try:
        interrupt._state["signum"] = None
        with interrupt.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(20)                       # a block that does not end: cut short after the grace
    except interrupt.Interrupted as e:
        print("cut short:", e.reason)
""" % ROOT)


def test_a_deferred_block_finishes_then_the_signal_is_raised():
    proc = subprocess.run([sys.executable, "-c", DEFERRED], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=30)
    assert proc.stdout.splitlines() == ["the block goes on", "and ends", "terminated (SIGTERM) 143",
                                        "cut short: terminated (SIGTERM)"], (proc.stdout, proc.stderr)


def test_sigterm_while_the_runner_environment_is_created(tmp_path):
    """Before run_all.py re-executes itself in .venvs/runner: one line, 143, and no stamp (rebuilt next time)."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    (tmp_path / "tmp").mkdir()
    env = dict(os.environ, DS2_ENVS_DIR=str(tmp_path / "venvs"), TMPDIR=str(tmp_path / "tmp"))
    env.pop("DS2_RUNNER", None)
    proc = subprocess.Popen([base, os.path.join(ROOT, "run_all.py"), "--frameworks", "pytorch"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                            start_new_session=True)
    deadline = time.time() + 120
    while not os.path.exists(str(tmp_path / "venvs" / "runner.log")) and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(1)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, (out, err)
    lines = err.strip().splitlines()
    assert lines[0].startswith("Creating the runner environment") and len(lines) == 2, err
    assert lines[1] == "run_all.py: terminated (SIGTERM) while creating the runner environment"
    assert not os.path.exists(str(tmp_path / "venvs" / "runner" / ".ds2-stamp.json"))
    assert not alive([proc.pid])           # pip, venv: nothing of its session is left
    # nor of the stopped pip's files (its download, unpack and build folders were left in TMPDIR)
    assert os.listdir(str(tmp_path / "tmp")) == [], os.listdir(str(tmp_path / "tmp"))
