"""tools/gpu_session.py, a device session in one call, on the CPU.

The dry run (``--dry-run``: ``--device cpu``, the smoke preset) with a fake ``nvidia-smi`` on PATH (what the session
and the runner read of it: the ``--query-gpu`` lines and ``-q``), the pytorch row in the session's PyTorch
environment as installed (``--use-installed``, the runner in this interpreter), and a second row whose estimate
exceeds the deadline: the row runs with ``--skip export,onnx,forward`` and its record, executed notebook and logs
land in the tarball; the TSV has a line per row with the card and the status; the row that does not fit is not
started, and says why; at most 8 files come back.  Then the rule itself: the estimates from the committed records,
the deadline, a process stopped at it (its group and what it started in a session of its own), the tarball
appended whole."""
import csv
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
import uuid

import pytest

from common.envinfo import cpu_model, device_slug
from runner.envs import framework_envs
from runner.envs.bootstrap import env_python
from runner.envs.definitions import ENVS
from tests.conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "tools"))
import gpu_session  # noqa: E402

SCRIPT = os.path.join(ROOT, "tools", "gpu_session.py")
CARD = "NVIDIA H100 80GB HBM3"
#: what nvidia-smi prints: the session's clocks query, the runner's facts (common/envinfo.py), -q, the header
FAKE_NVIDIA_SMI = """#!/bin/sh
case "$*" in
  *clocks.sm*) echo "name, clocks.current.sm [MHz]"; echo "%(card)s, 1980 MHz" ;;
  *--query-gpu*) echo "%(card)s, 580.159.04, 81559, 9.0" ;;
  *-q*) printf '==============NVSMI LOG==============\\nProduct Name : %(card)s\\nClocks\\n    SM : 1980 MHz\\n' ;;
  *) echo "| NVIDIA-SMI 580.159.04    Driver Version: 580.159.04    CUDA Version: 13.0 |" ;;
esac
""" % {"card": CARD}
SKIP = ["export", "onnx", "forward"]


def fake_gpu_path(directory):
    """PATH with a fake nvidia-smi first."""
    os.makedirs(str(directory), exist_ok=True)
    fake = os.path.join(str(directory), "nvidia-smi")
    with open(fake, "w") as f:
        f.write(FAKE_NVIDIA_SMI)
    os.chmod(fake, 0o755)
    return str(directory) + os.pathsep + os.environ.get("PATH", "")


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """One dry run: pytorch:fp32 (runs), keras-jax:fp32 (its estimate, given, exceeds the deadline)."""
    framework_envs.ensure(ENVS["pytorch"], "cpu")                   # the session's PyTorch environment, "preinstalled"
    python = env_python(framework_envs.env_path(ENVS["pytorch"], "cpu"))
    tmp = tmp_path_factory.mktemp("gpu_session")
    out = tmp / "out"
    env = dict(os.environ, PATH=fake_gpu_path(tmp / "bin"), PYTHONPATH=ROOT)
    env.pop("DS2_RUNNER", None)
    t0 = time.time()
    proc = subprocess.run([sys.executable, SCRIPT, "--dry-run", "--out", str(out), "--python", python, "--rows",
                           "pytorch:fp32,keras-jax:fp32", "--estimate", "keras-jax:fp32=9999", "--deadline-s", "240"],
                          cwd=str(tmp), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=600)
    with open(str(out / "summary.tsv")) as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    with tarfile.open(str(out / "session.tar")) as t:
        names = t.getnames()
        rec = json.load(t.extractfile("records/pytorch_smoke_fp32_bs8_cpu.json"))
    return {"proc": proc, "out": out, "rows": rows, "names": names, "record": rec, "python": python,
            "wall_s": time.time() - t0, "tmp": tmp}


def test_the_dry_run_runs_the_row_and_returns_at_most_8_files(session):
    proc, out = session["proc"], session["out"]
    assert proc.returncode == 0, proc.stdout[-4000:]
    files = sorted(os.listdir(str(out)))
    assert files == sorted(gpu_session.OUT_FILES) and len(files) <= gpu_session.MAX_OUT_FILES
    assert all(os.path.isfile(str(out / f)) for f in files)       # no folder: nothing nested past what returns


def test_the_tarball_holds_the_rows_record_notebook_and_logs(session):
    stem = "pytorch_smoke_fp32_bs8_cpu"
    assert {"records/%s.json" % stem, "notebooks/%s.ipynb" % stem, "logs/%s.kernel.log" % stem,
            "logs/pytorch_fp32.run_all.log", "latency/rnn_latency.json", "logs/rnn_latency.log"} <= \
        set(session["names"]), session["names"]
    assert not [n for n in session["names"] if "keras-jax" in n]              # not started: nothing of it


def test_the_record_says_what_was_skipped_and_ran_as_installed(session):
    rec = session["record"]
    assert rec["status"] == "ok", rec.get("error")
    assert rec["options"]["skipped"] == SKIP
    assert rec["export"]["status"] == "skipped" and rec["onnx"]["status"] == "skipped"
    assert "skip=export,onnx,forward" in rec["onnx"]["reason"]
    assert rec["timing"]["forward_ms"] == {} and rec["timing"]["forward_repeats"] is None
    assert rec["as_is"] is True and rec["run"]["installed"]["python"] == session["python"]
    assert "--skip export,onnx,forward" in rec["run"]["command"] and "--device cpu" in rec["run"]["command"]
    assert rec["environment"]["gpus"][0]["name"] == CARD          # the runner saw the fake GPU, and ran on the CPU
    assert rec["device"] == {"type": "cpu", "name": cpu_model()}


def test_the_tsv_has_a_line_per_row_with_card_and_status(session):
    rows, rec = session["rows"], session["record"]
    assert list(rows[0]) == list(gpu_session.COLUMNS)
    assert [(r["row"], r["precision"]) for r in rows] == [("pytorch", "fp32"), ("keras-jax", "fp32")]
    ran, waiting = rows
    assert ran["status"] == "ok" and ran["card"] == rec["device"]["name"] == cpu_model()
    assert float(ran["audio_s_per_s"]) == pytest.approx(rec["timing"]["audio_s_per_s"], rel=1e-5)
    assert float(ran["first_loss"]) == pytest.approx(rec["losses"]["first"], rel=1e-5)
    assert float(ran["warmup_s"]) > 0 and ran["peak_gib"] == "" and ran["rnn_dtype"] == rec["options"]["rnn_dtype"]
    assert int(ran["estimate_s"]) <= 240
    assert waiting["status"] == "not started" and waiting["card"] == cpu_model() and waiting["estimate_s"] == "9999"
    assert "estimate 9999 s (given) >" in waiting["note"] and "s left" in waiting["note"]


def test_the_log_versions_and_latency(session):
    out = session["out"]
    log = (out / "session.log").read_text()
    assert "keras-jax fp32: not started: estimate 9999 s" in log and "pytorch fp32: ok in" in log
    assert "Product Name : %s" % CARD in (out / "nvidia-smi.txt").read_text()
    facts = json.loads((out / "versions.json").read_text())
    assert facts["interpreter"]["packages"]["torch"] == session["record"]["versions"]["framework"]
    assert CARD in " ".join(facts["gpu_before"]) and facts["session"]["skip"] == "export,onnx,forward"
    assert "fp32" in json.loads((out / "latency.json").read_text())["precisions"]


def test_the_tarball_is_a_results_directory_the_report_reads(session, tmp_path):
    with tarfile.open(str(session["out"] / "session.tar")) as t:
        t.extractall(str(tmp_path / "res"))
    proc = subprocess.run([sys.executable, "-m", "runner.report", "--results-dir", str(tmp_path / "res")], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    page = (tmp_path / "res" / "results.md").read_text()
    assert "skip=export,onnx,forward: not run" in page                  # the ONNX table's reason


def test_import_session_brings_the_tarball_into_a_results_directory(session, tmp_path):
    """tools/import_session.py: the record, its notebook and the latency figures land where the report reads them;
    the record's executed_notebook names the copy (it named the session's scratch folder); nothing else changes."""
    tar = str(session["out"] / "session.tar")
    res = tmp_path / "res"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "import_session.py"), tar, "--results-dir",
                           str(res)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    stem = "pytorch_smoke_fp32_bs8_cpu"
    rec = json.loads((res / "records" / ("%s.json" % stem)).read_text())
    there = session["record"]["run"]["executed_notebook"]
    assert there and not os.path.isfile(os.path.join(ROOT, there))       # the scratch folder is gone
    assert os.path.samefile(os.path.join(ROOT, rec["run"]["executed_notebook"]),
                            str(res / "notebooks" / ("%s.ipynb" % stem)))
    assert rec["run"]["session"] == {"tarball": "session.tar", "executed_notebook_there": there}
    del rec["run"]["session"], rec["run"]["executed_notebook"]
    original = dict(session["record"], run=dict(session["record"]["run"]))
    del original["run"]["executed_notebook"]
    assert rec == original                                              # the run's record as it wrote it
    slug = device_slug(cpu_model())
    assert json.loads((res / "latency" / ("%s.json" % slug)).read_text())["device"]["name"] == cpu_model()
    assert not (res / "logs").exists()
    assert sorted(proc.stdout.split()) == sorted(
        os.path.relpath(str(p), ROOT) for p in (res / "records" / ("%s.json" % stem),
                                                 res / "notebooks" / ("%s.ipynb" % stem),
                                                 res / "latency" / ("%s.json" % slug)))


def test_a_row_running_at_the_deadline_is_stopped_and_what_it_left_comes_back(session, tmp_path):
    """A row given an estimate that fits, with 4-10 s left after the versions (the deadline leaves room for the
    versions step on a loaded machine, and too little for the latency benchmark's estimate): the full model's row
    (``--preset cpu``; run_all.py, its kernel, PyTorch's import and a training step of 92 M parameters take far longer
    than that on any machine, where the smoke row took 9.8 s on a 2-core Xeon): run_all.py gets SIGTERM at the
    deadline (its record, where it wrote one, says terminated; where it needed the SIGKILL, the record it prepared
    says its runner ended), the session ends in time, and the TSV says killed."""
    out = tmp_path / "out"
    env = dict(os.environ, PATH=fake_gpu_path(tmp_path / "bin"), PYTHONPATH=ROOT)
    env.pop("DS2_RUNNER", None)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, SCRIPT, "--dry-run", "--out", str(out), "--python", session["python"],
                           "--rows", "pytorch:fp32", "--estimate", "pytorch:fp32=1", "--deadline-s", "42",
                           "--preset", "cpu"],
                          cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=300)
    assert proc.returncode == 1 and time.monotonic() - t0 < 42 + 2 * gpu_session.GRACE_S, proc.stdout[-3000:]
    with open(str(out / "summary.tsv")) as f:
        (row,) = list(csv.DictReader(f, delimiter="\t"))
    assert row["status"] == "killed" and row["note"].startswith("stopped at the deadline"), row
    assert "latency: not started: estimate" in (out / "session.log").read_text()
    (exit_status,) = re.findall(r"pytorch fp32: killed in \d+ s \(exit (-?\d+)\)", (out / "session.log").read_text())
    with tarfile.open(str(out / "session.tar")) as t:
        log = t.extractfile("logs/pytorch_fp32.run_all.log").read().decode()
        rec = json.load(t.extractfile("records/pytorch_cpu_fp32_bs8_cpu.json"))
    assert "again during the clean-up" not in log, log[-2000:]          # one SIGTERM reached run_all.py
    assert rec["status"] == "failed", rec
    if exit_status == "-9":       # it needed the SIGKILL: the record it prepared at the start
        assert re.match(r"the runner \(pid \d+\) ended while this row ran", rec["error"]), rec["error"]
    else:                         # it wrote the row's record on SIGTERM
        assert "terminated" in rec["error"], (exit_status, rec["error"], log[-2000:])


# ---- the rule ---------------------------------------------------------------------------------------------------
def write_record(directory, name, **fields):
    rec = {"status": "ok", "target": "pytorch", "precision": "fp32", "preset": "quick", "batch_size": 32,
           "scale": 64, "device": {"type": "cuda", "name": "NVIDIA H200"}, "run": {"wall_s": 94.0}}
    rec.update(fields)
    directory.mkdir(exist_ok=True)
    (directory / name).write_text(json.dumps(rec))


def test_the_estimate_comes_from_the_records_else_the_fp32_row_else_the_default(tmp_path):
    d = tmp_path / "records"
    write_record(d, "a.json")
    write_record(d, "b.json", run={"wall_s": 500.0}, status="failed")            # failed: not a measure
    write_record(d, "c.json", run={"wall_s": 300.0}, distributed={"world_size": 2})   # two workers: not this row
    write_record(d, "d.json", run={"wall_s": 200.0}, device={"type": "cpu"})      # another device type
    est, source = gpu_session.estimate("pytorch", "fp32", "quick", 32, "cuda", str(d))
    assert est == 129 and source == "a.json: run.wall_s 94 s"                     # ceil(1.15 x 94 + 20)
    est, source = gpu_session.estimate("pytorch", "bf16", "quick", 32, "cuda", str(d))
    assert est == 129 and "(its fp32 row)" in source
    write_record(d, "e.json", precision="bf16", run={"wall_s": 80.0})
    assert gpu_session.estimate("pytorch", "bf16", "quick", 32, "cuda", str(d))[0] == 112
    est, source = gpu_session.estimate("jax", "fp32", "quick", 32, "cuda", str(d))
    assert est == int(-(-(1.15 * gpu_session.DEFAULT_WALL_S[("quick", "cuda")]["jax"] + 20) // 1))
    assert source.startswith("no record")
    assert gpu_session.estimate("jax+unroll", "fp32", "quick", 32, "cuda", str(d))[0] == \
        int(-(-(1.15 * gpu_session.UNKNOWN_WALL_S + 20) // 1))
    # a committed GPU record (the longest of the H100's and the H200's) is where the pytorch row's estimate comes from
    est, source = gpu_session.estimate("pytorch", "fp32", "quick", 32, "cuda")
    assert source.startswith("pytorch_quick_fp32_bs32_nvidia-h") and est < 560 - gpu_session.RESERVE_S


def test_the_default_rows_put_the_cards_gaps_first(tmp_path):
    d = tmp_path / "records"
    write_record(d, "a.json")                                                    # pytorch fp32 on the H200: done
    write_record(d, "b.json", target="jax", status="failed")                     # failed: still a gap
    write_record(d, "c.json", target="jax", precision="bf16", device={"type": "cuda", "name": "NVIDIA H100"},
                 options={"xla_autotune": dict(READ, written=None)})              # its warm-up read the results
    write_record(d, "d.json", precision="tf32", batch_size=8)                    # another batch size: a gap
    rows = gpu_session.rows_list("pytorch:fp32,pytorch:tf32,jax:fp32,jax:bf16")
    assert gpu_session.gaps_first(rows, "NVIDIA H200", "quick", 32, str(d)) == [
        ("pytorch", "tf32"), ("jax", "fp32"), ("jax", "bf16"), ("pytorch", "fp32")]
    assert gpu_session.gaps_first(rows[::-1], "NVIDIA H100", "quick", 32, str(d)) == [
        ("jax", "fp32"), ("pytorch", "tf32"), ("pytorch", "fp32"), ("jax", "bf16")]     # the H100's own record


#: a record's options.xla_autotune where the run read the card's autotuning results
READ = {"loaded": "results/autotune/jax-0.11.2/nvidia-h200.textproto", "entries": 378, "jaxlib": "0.11.2"}


def test_a_jax_row_is_a_gap_until_a_run_on_the_card_reads_its_autotuning_results(tmp_path):
    """A JAX or Keras-on-JAX row on a GPU is done on a card once a run of it read the card's autotuning results and
    autotuned nothing more: its warm-up is then the one a run there gets.  A first run (it wrote them), a run from
    before they were kept and a run that autotuned fusions the file lacked leave the row a gap; so the default rows
    first write a card's results with the JAX row of record, then read them."""
    d = tmp_path / "records"
    write_record(d, "a.json", target="jax")                                                  # from before: a gap
    write_record(d, "b.json", target="jax", precision="tf32", options={"xla_autotune": dict(READ, written=378)})
    write_record(d, "c.json", target="jax", precision="bf16", options={"xla_autotune": dict(READ, written=901)})
    write_record(d, "d.json", target="keras-jax", options={"xla_autotune": dict(READ, written=None)})   # read it
    write_record(d, "e.json", target="keras-jax", precision="bf16",                           # the first run: wrote
                 options={"xla_autotune": {"loaded": None, "entries": 0, "written": 512, "jaxlib": "0.11.2"}})
    write_record(d, "f.json")                                                                # pytorch: done
    write_record(d, "g.json", target="jax", device={"type": "cpu", "name": "AMD EPYC"})      # no autotuning on a CPU
    rows = gpu_session.rows_list("jax:fp32,jax:tf32,jax:bf16,keras-jax:fp32,keras-jax:bf16,pytorch:fp32")
    assert gpu_session.gaps_first(rows, "NVIDIA H200", "quick", 32, str(d)) == [
        ("jax", "fp32"), ("jax", "bf16"), ("keras-jax", "bf16"), ("jax", "tf32"), ("keras-jax", "fp32"),
        ("pytorch", "fp32")]
    assert gpu_session.default_session_rows(rows, "NVIDIA H200", "quick", 32, False, str(d))[:3] == [
        ("jax", "fp32"), ("jax", "fp32"), ("jax", "bf16")]                     # writes them, then reads them
    assert gpu_session.gaps_first(rows, "AMD EPYC", "quick", 32, str(d))[-1] == ("jax", "fp32")
    # the committed H200 record of the JAX row (before the results were kept) leaves it a gap there
    committed = gpu_session.gaps_first(rows, "NVIDIA H200", "quick", 32)
    assert committed[0] == ("jax", "fp32") and committed[-1] == ("pytorch", "fp32")


def test_the_default_rows_repeat_a_jax_row_only_where_its_first_run_writes_autotuning_results(tmp_path):
    d = tmp_path / "records"
    write_record(d, "a.json")                                                    # pytorch fp32 on the H200: done
    rows = gpu_session.rows_list("pytorch:fp32,jax+bidir2:fp32,jax:fp32,keras-jax:fp32")
    assert gpu_session.default_session_rows(rows, "NVIDIA H200", "quick", 32, False, str(d)) == [
        ("jax+bidir2", "fp32"), ("jax", "fp32"), ("jax", "fp32"), ("keras-jax", "fp32"), ("pytorch", "fp32")]
    assert gpu_session.default_session_rows(rows, "NVIDIA H200", "quick", 32, True, str(d)) == [
        ("jax+bidir2", "fp32"), ("jax", "fp32"), ("keras-jax", "fp32"), ("pytorch", "fp32")]


def test_a_row_starts_only_when_its_estimate_fits_what_is_left():
    now = [100.0]
    clock = gpu_session.Deadline(300, reserve_s=20, clock=lambda: now[0])
    assert clock.left() == 280
    assert gpu_session.fits(280, clock.left()) and not gpu_session.fits(281, clock.left())
    now[0] += 250
    assert clock.left() == 30 and clock.elapsed() == 250
    now[0] += 100
    assert clock.left() == 0 and not gpu_session.fits(1, clock.left())


def test_a_process_past_the_deadline_is_stopped_with_what_it_started(tmp_path):
    """Its process group gets SIGTERM, then SIGKILL; a child in a session of its own (a Jupyter kernel) is found
    by the marker variable."""
    marker = uuid.uuid4().hex
    env = dict(os.environ, **{gpu_session.MARKER: marker})
    cmd = ["sh", "-c", "trap '' TERM; setsid sleep 300 & sleep 300"]           # deaf to SIGTERM, and a session
    t0 = time.monotonic()
    code, killed = gpu_session.run_until(cmd, env, str(tmp_path / "log"), 1.0, marker, grace=1.0)
    assert killed and code is not None and time.monotonic() - t0 < 30
    assert gpu_session.marked_processes(marker) == []
    code, killed = gpu_session.run_until(["sh", "-c", "echo done"], env, str(tmp_path / "log"), 30, marker)
    assert (code, killed) == (0, False) and "done" in (tmp_path / "log").read_text()


#: a process that counts the SIGTERMs it hears (run_all.py takes a second one during its clean-up for "stop at once")
COUNTS_SIGTERM = """
import signal, sys, time
heard = []
signal.signal(signal.SIGTERM, lambda signum, frame: heard.append(signum))
print("ready", flush=True)
end = time.monotonic() + 3
while time.monotonic() < end:
    time.sleep(0.05)
print("SIGTERMs: %d" % len(heard), flush=True)
"""


def test_a_row_signalled_with_its_process_group_is_not_signalled_again_as_a_marked_process(monkeypatch):
    """run_all.py leads its row's process group and carries the session's marker: SIGTERM reaches it once, through
    its group, so that it records the row as terminated (a second SIGTERM during its clean-up means "stop at once,
    record nothing"); a marked process outside the group (a kernel in a session of its own) still gets its own.  The
    scan for marked processes is slowed to half a second, as on a loaded machine, where the group's process has
    handled the first SIGTERM before the scan's would come (unslowed, the two arrive together and count as one)."""
    scan = gpu_session.host_agent.marked

    def slow_scan(*args, **kwargs):
        time.sleep(0.5)
        return scan(*args, **kwargs)

    monkeypatch.setattr(gpu_session.host_agent, "marked", slow_scan)
    marker = uuid.uuid4().hex
    env = dict(os.environ, **{gpu_session.MARKER: marker})
    leader = subprocess.Popen([sys.executable, "-c", COUNTS_SIGTERM], env=env, stdout=subprocess.PIPE,
                              universal_newlines=True, preexec_fn=os.setpgrp)
    apart = subprocess.Popen([sys.executable, "-c", COUNTS_SIGTERM], env=env, stdout=subprocess.PIPE,
                             universal_newlines=True, start_new_session=True)
    try:
        assert leader.stdout.readline().strip() == "ready" and apart.stdout.readline().strip() == "ready"
        gpu_session.host_agent.signal_all([leader], marker, gpu_session.MARKER, signal.SIGTERM)
        assert leader.communicate(timeout=30)[0].split() == ["SIGTERMs:", "1"]
        assert apart.communicate(timeout=30)[0].split() == ["SIGTERMs:", "1"]
    finally:
        for p in (leader, apart):
            if p.poll() is None:
                p.kill()
                p.wait()


#: a run_all.py that prepared its row's record (runner/run/staging.py) and then hears no SIGTERM: only SIGKILL ends it
DEAF_ROW = """
import signal, sys, time
sys.path.insert(0, %r)
from common import results
from runner.run import staging
results_dir = sys.argv[1]
staging.claim(results_dir + "/.staging", "pytorch_smoke_fp32_bs8_cpu", lambda status, reason: results.failed_record(
    "pytorch", status, reason, framework="PyTorch", precision="fp32", run={"started": results.utc_now()}))
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("claimed", flush=True)
time.sleep(300)
""" % ROOT


def test_a_row_whose_run_all_had_to_be_killed_comes_back_with_its_prepared_record(tmp_path, monkeypatch):
    """A run_all.py deaf to SIGTERM at the deadline gets SIGKILL and can write nothing: the record it prepared when
    the row started comes back in the tarball, and the TSV line says killed, with that record's reason."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(gpu_session, "row_command", lambda args, target, precision, results_dir, timeout_s: [
        sys.executable, "-c", DEAF_ROW, results_dir])
    out = gpu_session.Out(str(tmp_path / "out"))
    args = gpu_session.build_parser().parse_args(["--out", str(tmp_path / "out"), "--dry-run", "--estimate",
                                                  "pytorch:fp32=1", "--preset", "smoke"])
    env = dict(os.environ, **{gpu_session.MARKER: uuid.uuid4().hex})
    monkeypatch.setattr(gpu_session.run_until, "__defaults__", (1.0,))      # a grace of 1 s, not 10
    status = gpu_session.run_row(args, "pytorch", "fp32", out, gpu_session.Deadline(5, reserve_s=0), env, str(scratch),
                                 CARD)
    assert status == "killed"
    with tarfile.open(out.path["session.tar"]) as t:
        rec = json.load(t.extractfile("records/pytorch_smoke_fp32_bs8_cpu.json"))
    assert rec["status"] == "failed" and rec["error"].startswith("the runner (pid "), rec
    with open(out.path["summary.tsv"]) as f:
        (row,) = list(csv.DictReader(f, delimiter="\t"))
    assert row["status"] == "killed" and "the runner (pid " in row["note"], row


def test_the_tarball_is_appended_whole(tmp_path):
    out = gpu_session.Out(str(tmp_path / "out"))
    for i in range(3):
        (tmp_path / ("f%d" % i)).write_text("member %d" % i)
        out.append_tar([(str(tmp_path / ("f%d" % i)), "logs/f%d" % i), (str(tmp_path / "absent"), "logs/absent")])
    with tarfile.open(out.path["session.tar"]) as t:
        assert t.getnames() == ["logs/f0", "logs/f1", "logs/f2"]
    assert sorted(os.listdir(str(tmp_path / "out"))) == sorted(["session.tar", "summary.tsv", "session.log"])


def test_the_latency_benchmark_runs_only_for_a_card_without_committed_figures_unless_asked(tmp_path):
    """The H200's figures are committed (results/latency/nvidia-h200.json): a session there leaves the benchmark out
    and says why; --latency measures them again; both flags at once are refused."""
    out = gpu_session.Out(str(tmp_path / "out"))
    args = gpu_session.build_parser().parse_args(["--out", str(tmp_path / "out"), "--dry-run"])
    assert gpu_session.committed_latency("NVIDIA H200") and not gpu_session.committed_latency("NVIDIA B200")
    gpu_session.latency(args, out, gpu_session.Deadline(300), dict(os.environ), str(tmp_path), "NVIDIA H200")
    assert not os.path.exists(out.path["latency.json"])
    assert ("latency: not run: results/latency/nvidia-h200.json holds this card's figures (--latency measures them "
            "again)") in (tmp_path / "out" / "session.log").read_text()
    forced = gpu_session.build_parser().parse_args(["--out", str(tmp_path / "o2"), "--dry-run", "--latency"])
    assert forced.latency and gpu_session.committed_latency("NVIDIA H200")
    both = gpu_session.build_parser().parse_args(["--out", str(tmp_path / "o3"), "--latency", "--no-latency",
                                                  "--rows", "pytorch:fp32"])
    assert "--latency and --no-latency: give one" in gpu_session.errors_of(both)


def test_a_jax_row_without_results_on_the_card_writes_them_even_under_no_autotune_dump(tmp_path):
    d, tuned = tmp_path / "records", tmp_path / "autotune"
    write_record(d, "jax.json", target="jax", run={"wall_s": 330.0}, timing={"warmup_s": 208.0},
                 options={"xla_autotune": {"written": 1800, "loaded": None, "jaxlib": "0.11.2"}})
    (tuned / "jax-0.11.2").mkdir(parents=True)
    (tuned / "jax-0.11.2" / "nvidia-h200.textproto").write_text("version: 3\n")
    first = lambda target, precision: gpu_session.first_on_card(target, precision, "NVIDIA H200", "quick", 32,  # noqa
                                                                str(d), str(tuned))
    assert not first("jax", "fp32")                          # its run wrote them: a second run reads them
    assert first("jax", "tf32") and first("keras-jax", "fp32") and first("jax+hoist", "fp32")
    assert not first("pytorch", "fp32")                      # no XLA: nothing to write


def test_two_rows_failing_the_same_way_stop_the_session(tmp_path):
    """A wheelhouse that cannot serve the runner fails every row alike in seconds: after two, no row starts."""
    script = tmp_path / "session.py"
    script.write_text(SIGNALLED_SESSION % {"root": ROOT, "tools": os.path.join(ROOT, "tools"),
                                           "row": "import sys; print('ERROR: No matching distribution for papermill');"
                                                  " sys.exit(1)"})
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(script), "--dry-run", "--out", str(out), "--no-latency", "--rows",
                           "pytorch:fp32,pytorch:bf16,jax:fp32"] + sum((["--estimate", r + "=1"] for r in (
                               "pytorch:fp32", "pytorch:bf16", "jax:fp32")), []),
                          cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                          timeout=120)
    assert proc.returncode == 1, proc.stdout
    with open(str(out / "summary.tsv")) as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    assert [(r["row"], r["precision"], r["status"]) for r in rows] == [("pytorch", "fp32", "failed"),
                                                                       ("pytorch", "bf16", "failed")], rows
    assert "stopped: two rows in a row failed the same way (ERROR: No matching distribution for papermill)" in \
        (out / "session.log").read_text()


def test_no_latency_leaves_the_benchmark_out_and_says_so(tmp_path):
    """--no-latency (a second call on a card whose figures the first call measured): nothing started, no
    latency.json, a line in the log; the flag parses."""
    out = gpu_session.Out(str(tmp_path / "out"))
    args = gpu_session.build_parser().parse_args(["--out", str(tmp_path / "out"), "--no-latency", "--dry-run"])
    assert args.no_latency
    gpu_session.latency(args, out, gpu_session.Deadline(300), dict(os.environ), str(tmp_path))
    assert not os.path.exists(out.path["latency.json"])
    assert "latency: not run (--no-latency)" in (tmp_path / "out" / "session.log").read_text()
    with tarfile.open(out.path["session.tar"]) as t:
        assert t.getnames() == []


def test_a_row_whose_autotuning_results_this_card_has_is_estimated_with_a_share_of_its_warm_up(tmp_path):
    """A committed run of the row on this card that wrote XLA's autotuning results, now in the card's file: the next
    run reads them, so its estimate takes REPEAT_WARMUP_SHARE of that run's warm-up, as a second run in a session.
    Another card, another precision, a run that wrote nothing or a missing file: the estimate as before."""
    d, tuned = tmp_path / "records", tmp_path / "autotune"
    first = dict(target="jax", device={"type": "cuda", "name": "NVIDIA H100 80GB HBM3"}, run={"wall_s": 330.0},
                 timing={"warmup_s": 208.0}, options={"xla_autotune": {"written": 1800, "loaded": None,
                                                                        "jaxlib": "0.11.2"}})
    write_record(d, "jax.json", **first)
    write_record(d, "jax-h200.json", **dict(first, device={"type": "cuda", "name": "NVIDIA H200"},
                                            run={"wall_s": 400.0}))
    plain = gpu_session.estimate("jax", "fp32", "quick", 32, "cuda", str(d))
    assert plain == (480, "jax-h200.json: run.wall_s 400 s")                      # ceil(1.15 x 400 + 20)
    assert gpu_session.estimate("jax", "fp32", "quick", 32, "cuda", str(d), card="NVIDIA H100 80GB HBM3",
                                autotune_dir=str(tuned)) == plain               # no card file: as before
    (tuned / "jax-0.11.2").mkdir(parents=True)
    (tuned / "jax-0.11.2" / "nvidia-h100-80gb-hbm3.textproto").write_text("version: 3\n")
    est, source = gpu_session.estimate("jax", "fp32", "quick", 32, "cuda", str(d), card="NVIDIA H100 80GB HBM3",
                                       autotune_dir=str(tuned))
    assert est == 197 and source.startswith("jax.json: run.wall_s 330 s, warm-up 208 s taken at 15 %")  # 1.15x153+20
    assert gpu_session.estimate("jax", "fp32", "quick", 32, "cuda", str(d), card="NVIDIA H200",
                                autotune_dir=str(tuned)) == plain               # the H200 has no file
    assert gpu_session.estimate("jax", "bf16", "quick", 32, "cuda", str(d), card="NVIDIA H100 80GB HBM3",
                                autotune_dir=str(tuned))[1].endswith("(its fp32 row)")   # other programs
    write_record(d, "jax.json", **dict(first, options={"xla_autotune": {"written": None, "loaded": "x",
                                                                        "jaxlib": "0.11.2"}}))
    assert gpu_session.estimate("jax", "fp32", "quick", 32, "cuda", str(d), card="NVIDIA H100 80GB HBM3",
                                autotune_dir=str(tuned)) == plain               # it wrote nothing


def test_jax_graphs_without_a_record_is_estimated_as_the_jax_row_whose_programs_it_compiles(tmp_path):
    """jax+graphs compiles the JAX row's programs (the loops then replayed from CUDA graphs): where it has no record
    it is estimated as that row's first run on the card, cold (whether the row's autotuning results serve it too is
    not measured), not as the row's run that reads them."""
    d, tuned = tmp_path / "records", tmp_path / "autotune"
    write_record(d, "jax.json", target="jax", run={"wall_s": 330.0}, timing={"warmup_s": 208.0},
                 options={"xla_autotune": {"written": 1800, "loaded": None, "jaxlib": "0.11.2"}})
    (tuned / "jax-0.11.2").mkdir(parents=True)
    (tuned / "jax-0.11.2" / "nvidia-h200.textproto").write_text("version: 3\n")
    args = ("fp32", "quick", 32, "cuda", str(d))
    est, source = gpu_session.estimate("jax+graphs", *args, card="NVIDIA H200", autotune_dir=str(tuned))
    assert gpu_session.estimate("jax", *args, card="NVIDIA H200", autotune_dir=str(tuned))[0] == 197   # reads them
    assert est == 400 and source == "no record: jax's, whose programs it compiles (jax.json: run.wall_s 330 s)"
    assert gpu_session.estimate("jax+graphs", *args)[0] == 400                  # ceil(1.15 x 330 + 20), no card
    write_record(d, "graphs.json", target="jax+graphs", run={"wall_s": 100.0})   # a record of its own wins
    assert gpu_session.estimate("jax+graphs", *args, card="NVIDIA H200", autotune_dir=str(tuned))[0] == 135
    assert gpu_session.estimate("jax+hoist", *args)[1] == "no record: the default 340 s"   # other programs


#: a session whose rows are a run_all.py that prepared its record (runner/run/staging.py) and then waits: the test
#: sends the session SIGTERM, as the device tool does at the call's limit
SIGNALLED_SESSION = """
import sys
sys.path.insert(0, %(root)r)
sys.path.insert(0, %(tools)r)
import gpu_session
gpu_session.row_command = lambda args, target, precision, results_dir, timeout_s: [
    sys.executable, "-c", %(row)r, results_dir]
sys.exit(gpu_session.main(sys.argv[1:]))
"""
WAITING_ROW = DEAF_ROW.replace("signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n", "")


def test_a_signal_to_the_session_keeps_the_row_in_flight_and_starts_no_other(tmp_path):
    """The device tool stops a call that runs past its limit with SIGTERM: the row in flight is stopped and its
    files come back in the tarball (its prepared record: it had written nothing else), the TSV says killed by the
    signal, no later row starts, and the session exits 128 + 15 with nothing of it left running."""
    script = tmp_path / "session.py"
    script.write_text(SIGNALLED_SESSION % {"root": ROOT, "tools": os.path.join(ROOT, "tools"), "row": WAITING_ROW})
    scratch, out = tmp_path / "scratch", tmp_path / "out"
    proc = subprocess.Popen([sys.executable, str(script), "--dry-run", "--out", str(out), "--scratch", str(scratch),
                             "--no-latency", "--rows", "pytorch:fp32,jax:fp32", "--estimate", "pytorch:fp32=1",
                             "--estimate", "jax:fp32=1", "--deadline-s", "300"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    log = scratch / "pytorch_fp32.run_all.log"
    deadline = time.monotonic() + 60
    while not (log.exists() and "claimed" in log.read_text()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0] if proc.poll() else "slow"
        time.sleep(0.1)
    proc.send_signal(15)
    output = proc.communicate(timeout=60)[0]
    assert proc.returncode == 128 + 15, output
    with tarfile.open(str(out / "session.tar")) as t:
        rec = json.load(t.extractfile("records/pytorch_smoke_fp32_bs8_cpu.json"))
        assert "logs/pytorch_fp32.run_all.log" in t.getnames()
    assert rec["status"] == "failed" and rec["error"].startswith("the runner (pid "), rec
    with open(str(out / "summary.tsv")) as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    assert [(r["row"], r["status"]) for r in rows] == [("pytorch", "killed")], rows
    assert rows[0]["note"].startswith("stopped by signal 15 after "), rows
    text = (out / "session.log").read_text()
    assert "stopped by signal 15" in text and "jax fp32" not in text, text
    assert sorted(os.listdir(str(out))) == sorted(["session.tar", "summary.tsv", "session.log", "versions.json",
                                                   "nvidia-smi.txt"])


def _session_tar(path, members):
    """A tarball of (name, bytes) members, in order, as gpu_session.py appends them."""
    import io
    with tarfile.open(str(path), "w") as t:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return str(path)


NB = "/".join(("notebooks", "x.ipynb"))     # a member of the made-up tarballs (no file of the checkout)


def _rec(status, started, notebook="x.ipynb"):
    return json.dumps({"target": "jax", "status": status, "error": None if status == "ok" else "terminated",
                       "run": {"started": started, "executed_notebook": "/scratch/jax/notebooks/" + notebook}}).encode()


def test_import_never_replaces_an_ok_record_with_a_failed_or_older_run(tmp_path):
    """A row run twice in a call whose second run was killed: its first, ok run stays, with its notebook; an ok
    record already there stays against a failed run and against an older one (tarballs imported out of order);
    a newer ok run replaces it, as the newest run of a row is its row."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import import_session
    res = tmp_path / "res"
    twice = _session_tar(tmp_path / "a.tar", [
        ("records/x.json", _rec("ok", "2026-11-28T10:00:00+00:00")), (NB, b"first"),
        ("records/x.json", _rec("failed", "2026-11-28T10:05:00+00:00")), (NB, b"second")])
    import_session.import_session(twice, str(res))
    assert json.loads((res / "records" / "x.json").read_text())["status"] == "ok"
    assert (res / "notebooks" / "x.ipynb").read_bytes() == b"first"
    for status, started in (("failed", "2026-11-28T11:00:00+00:00"), ("ok", "2026-11-28T09:00:00+00:00")):
        later = _session_tar(tmp_path / ("%s.tar" % status), [("records/x.json", _rec(status, started)),
                                                               (NB, status.encode())])
        import_session.import_session(later, str(res))
        assert json.loads((res / "records" / "x.json").read_text())["run"]["started"] == "2026-11-28T10:00:00+00:00"
        assert (res / "notebooks" / "x.ipynb").read_bytes() == b"first"
    newer = _session_tar(tmp_path / "n.tar", [("records/x.json", _rec("ok", "2026-11-28T12:00:00+00:00")),
                                              (NB, b"newer")])
    import_session.import_session(newer, str(res))
    assert json.loads((res / "records" / "x.json").read_text())["run"]["started"] == "2026-11-28T12:00:00+00:00"
    assert (res / "notebooks" / "x.ipynb").read_bytes() == b"newer"


def test_a_tarball_of_autotuning_results_alone_is_imported_and_an_empty_one_refused(tmp_path):
    """A call killed while its first JAX row ran can return the autotuning results that row had written and no
    record: they are merged (minutes of autotuning); a tarball with nothing is refused in one line."""
    tuned = _session_tar(tmp_path / "t.tar", [("autotune/jax-0.11.2/nvidia-h200.jax_fp32.textproto",
                                               b"version: 3\nresults {\n  device: \"x\"\n  hlo: \"y\"\n}\n")])
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "import_session.py"), tuned,
                           "--results-dir", str(tmp_path / "res")], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "res" / "autotune" / "jax-0.11.2" / "nvidia-h200.textproto").is_file(), proc.stderr
    empty = _session_tar(tmp_path / "e.tar", [])
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "import_session.py"), empty,
                           "--results-dir", str(tmp_path / "res2")], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
    assert proc.returncode == 2 and "nothing to import" in proc.stderr and not (tmp_path / "res2").exists()
