"""The notebooks learn the real task (section 12b, common/learn.py): ``run_all.py --preset learn-smoke`` for PyTorch and
JAX side by side (the default tier: an eager row and an XLA row, which compiles one program per batch shape -- 11 on
learn-smoke's grid of 80 frames; a corpus of 200 training utterances, at most 60 steps, the CER on unseen sentences
must fall to the preset's target), MXNet too with ``--full``, and ``--preset learn`` for every row of record to the
real target (``--full``).

The corpus is built once per machine in the corpus cache (``$DS2_CORPUS_CACHE``, default
``~/.cache/ds2-rosetta/corpus``), before the notebooks start; without Debian's espeak-ng and flite (.ci/run installs
them) the tests are skipped with the reason.
"""
import json
import os

import pytest

from common.spec import get_learn_preset

from .conftest import LEARN_SHORT_FULL_ONLY as FULL_ONLY
from .conftest import LEARN_SHORT_ROWS as SHORT_ROWS
from .conftest import RunAll, lane_run, learn_corpus, ok_record, selected_targets


def _corpus_or_skip(preset):
    corpus, why = learn_corpus(preset)
    if corpus is None:
        pytest.skip(why)
    return corpus


def _learn_runs(tmp_path_factory, name, preset, groups, timeout):
    """``groups`` of rows, one run_all.py each, side by side; each process one thread for OpenMP (PyTorch's 2
    threads beside another busy process stall at every parallel region: 1.2 to 17 s a step instead of 0.55 s at
    T = 240 on the shared 2-core machine)."""
    corpus = _corpus_or_skip(preset)                 # built once, off the notebooks' clocks
    results_dir = tmp_path_factory.mktemp(name)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        runs = RunAll.side_by_side([["--preset", preset, "--device", "cpu", "--frameworks", ",".join(g),
                                     "--timeout", str(timeout)] for g in groups if g], results_dir)
    out = RunAll([], results_dir, _run=False)
    out.output = "\n".join(r.output for r in runs)
    return corpus, out


@pytest.fixture(scope="module")
def short(lane_runs):
    """The short runs (tests/conftest.py's ``lane_runs``: the XLA row in a lane of its own, PyTorch beside it, then
    the float64 control and the bf16 run in PyTorch's lane) and their corpus."""
    out = lane_run(lane_runs, "short")
    return _corpus_or_skip("learn-smoke"), out


@pytest.mark.parametrize("target", [pytest.param(t, marks=pytest.mark.full) if t in FULL_ONLY else t
                                    for t in SHORT_ROWS])
def test_a_short_run_learns(short, target):
    if target not in selected_targets():
        pytest.skip("%s is not selected (DS2_TEST_FRAMEWORKS)" % target)
    corpus, out = short
    p = get_learn_preset("learn-smoke")
    rec = ok_record(out, target)
    block = rec["learning"]
    assert rec["preset"] == "learn-smoke" and rec["config"] == json.loads(json.dumps(p.config.to_dict()))
    assert rec["checks"]["loss"]["ok"] and rec["checks"]["params"]["canonical"] == p.config.param_count   # width
    assert block["corpus"]["corpus_sha256"] == corpus.corpus_sha256
    first, last = block["evaluations"][0], block["evaluations"][-1]
    assert first["step"] == 0 and first["cer"]["test_seen"] > p.target_cer    # the canonical start is not there
    assert block["stopped"] == "target", block["target"]["reason"]
    assert last["cer"]["test_seen"] <= first["cer"]["test_seen"] - 0.05       # it fell
    assert last["cer"]["test_seen"] <= p.target_cer and block["target"]["steps"] <= p.max_steps
    assert all(e["wall_s"] >= e["train_s"] + e["eval_s"] - 1e-3 for e in block["evaluations"])
    # the learn preset's implicit --skip: no forward timing, no export file, no ONNX route, and the record says so
    assert sorted(rec["options"]["skipped"]) == ["export", "forward", "onnx"]
    assert rec["export"]["status"] == rec["onnx"]["status"] == "skipped" and rec["timing"]["forward_ms"] == {}


def test_the_short_runs_saw_the_same_batches(short):
    corpus, out = short
    blocks = [ok_record(out, t)["learning"] for t in SHORT_ROWS if t in out.records]
    if len(blocks) < 2:
        pytest.skip("one row only")
    # every row trains at least until its first evaluation: the batches before it are the same in every row (rows
    # that stop at different evaluations differ in the whole run's hash, which is compared where the steps agree)
    firsts = [b["train_data"]["first_batches_sha256"] for b in blocks]
    assert None not in firsts and len(set(firsts)) == 1, firsts
    steps = min(b["steps"] for b in blocks)
    assert len(set(b["train_data"]["batches_sha256"] for b in blocks if b["steps"] == steps)) == 1
    assert blocks[0]["losses"][0] == pytest.approx(blocks[1]["losses"][0], rel=1e-4)   # the same start, same batch


@pytest.mark.full
def test_every_row_learns_the_real_task(tmp_path_factory):
    """--full: every selected row of record to the learn preset's target (about 10 minutes a row on 2 cores)."""
    from runner.run.targets import TARGETS
    rows = [t for t in selected_targets() if t in TARGETS]
    halves = [rows[0::2], rows[1::2]]
    corpus, out = _learn_runs(tmp_path_factory, "learn", "learn", halves, 3600)
    p = get_learn_preset("learn")
    for target in rows:
        rec = ok_record(out, target)
        block = rec["learning"]
        assert block["corpus"]["corpus_sha256"] == corpus.corpus_sha256
        assert block["target"]["reached"], "%s: %s" % (target, block["target"]["reason"])
        assert block["final"]["cer"][p.target_split] <= p.target_cer
    from runner.report import render
    render.write(out.results_dir, os.path.join(out.results_dir, "results.md"), "python run_all.py --preset learn",
                 None)
    assert "## Learns a real task" in out.markdown()
