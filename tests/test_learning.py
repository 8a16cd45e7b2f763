"""The real task's training loop (common/learn.py) with stand-in models on a tiny corpus, the learn presets' wiring
(common/spec.py, run_all.py --preset learn) and results.md's "Learns a real task" section (runner/report/learning.py).

Fast: no framework; the tiny corpus (10 utterances) needs Debian's espeak-ng and flite (.ci/run installs them), and
its tests are skipped with the reason without them.  The notebooks' learning runs are in tests/test_learning_rows.py.
"""
import math

import numpy as np
import pytest

from common import corpus as C
from common import learn
from common.decode import encode
from common.spec import LEARN_MODEL, LEARN_PRESETS, PRESETS, LearnPreset, get_preset, is_learn_preset

TINY = LearnPreset("tiny", LEARN_MODEL, batch_size=2, eval_every=2, target_cer=0.3, target_split="test_seen",
                   max_steps=6, eval_batch_size=2, corpus_seed=3, train_utterances=6, test_utterances=2,
                   purpose="tests/test_learning.py")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    try:
        C.check_engines()
    except C.EngineError as e:
        pytest.skip("the corpus engines are missing (.ci/run installs them): %s" % e)
    return C.open_or_build(learn.corpus_recipe(TINY), str(tmp_path_factory.mktemp("cache")), progress=False)


def learner(corpus, seed=0, **changes):
    preset = TINY if not changes else LearnPreset(**dict(TINY.to_dict(), config=LEARN_MODEL, **changes))
    return learn.Learner(preset, seed, corpus=corpus, out=open("/dev/null", "w"))


def best_path(text, frames):
    """Argmax ids that decode to ``text``: its symbols, a blank between two equal ones, blanks to the end."""
    path, prev = [], None
    for c in encode(text):
        if c == prev:
            path.append(0)
        path.append(int(c))
        prev = c
    assert len(path) <= frames
    return path + [0] * (frames - len(path))


def oracle(lr, good=lambda: True):
    """A predict that reads the references of the evaluation batches (each one object, loaded once)."""
    texts = {id(b): [lr.corpus.utterances(s)[i].text for s, i in members] for b, members in lr.eval_batches}

    def predict(batch):
        if not good():
            return np.zeros((batch.batch_size, batch.output_length), dtype=np.int64)
        return np.array([best_path(t, batch.output_length) for t in texts[id(batch)]])
    return predict


class Steps:
    """A stand-in training step: counts its calls, keeps the batches, returns a loss (NaN at step ``nan_at``)."""

    def __init__(self, nan_at=None):
        self.batches, self.nan_at = [], nan_at

    def __call__(self, batch):
        self.batches.append(batch)
        return float("nan") if len(self.batches) == self.nan_at else 100.0 / len(self.batches)


def test_a_perfect_model_meets_the_target_at_step_0(corpus):
    lr = learner(corpus)
    steps = Steps()
    block = lr.run(steps, oracle(lr))
    assert steps.batches == [] and block["steps"] == 0 and block["stopped"] == "target"
    assert block["target"]["reached"] and block["target"]["steps"] == 0
    assert block["final"]["cer"] == {"test_seen": 0.0, "test_unseen": 0.0}
    assert block["examples"]["test_seen"][0]["hypothesis"] == block["examples"]["test_seen"][0]["reference"]


def test_a_model_that_says_nothing_runs_to_the_cap_with_the_reason(corpus):
    lr = learner(corpus)
    steps = Steps()
    block = lr.run(steps, lambda b: np.zeros((b.batch_size, b.output_length), dtype=np.int32))
    assert len(steps.batches) == 6 and block["steps"] == 6 and block["stopped"] == "max_steps"
    assert [e["step"] for e in block["evaluations"]] == [0, 2, 4, 6]
    assert all(e["cer"] == {"test_seen": 1.0, "test_unseen": 1.0} for e in block["evaluations"])  # all deleted
    t = block["target"]
    assert not t["reached"] and t["steps"] is None and t["wall_s"] is None
    assert "CER 1.000 after 6 steps (the cap), above the target 0.3" in t["reason"]
    assert block["losses"] == [pytest.approx(100.0 / k) for k in range(1, 7)]
    assert block["evaluations"][1]["loss"] == pytest.approx((100 + 50) / 2)       # mean since the last evaluation
    e = block["evaluations"]
    assert all(a["wall_s"] <= b["wall_s"] and a["train_s"] <= b["train_s"] for a, b in zip(e, e[1:]))
    assert e[-1]["wall_s"] >= e[-1]["train_s"] + e[-1]["eval_s"] - 1e-6
    assert block["corpus"]["corpus_sha256"] == corpus.corpus_sha256 and block["corpus"]["engines"]
    capped = learner(corpus).run(Steps(), lambda b: np.zeros((b.batch_size, b.output_length), dtype=np.int32),
                                 max_steps=3)
    assert capped["steps"] == 3 and "capped at 3 of the preset's 6 steps" in capped["target"]["reason"]


def test_the_run_stops_at_the_first_evaluation_at_the_target(corpus):
    lr = learner(corpus)
    steps = Steps()
    block = lr.run(steps, oracle(lr, good=lambda: len(steps.batches) >= 3))
    assert block["stopped"] == "target" and block["steps"] == 4 and len(steps.batches) == 4
    assert block["target"]["steps"] == 4 and block["target"]["wall_s"] == block["evaluations"][-1]["wall_s"]
    assert block["target"]["reason"] is None


def test_a_non_finite_loss_stops_the_run_and_says_so(corpus):
    block = learner(corpus).run(Steps(nan_at=3), lambda b: np.zeros((b.batch_size, b.output_length), dtype=np.int32))
    assert block["stopped"] == "not_finite" and block["steps"] == 3 and block["losses"][-1] is None
    assert block["target"]["reason"] == "the loss is nan at step 3"


def test_every_row_gets_the_same_batches_with_labels_as_wide_as_their_grid(corpus):
    zeros = lambda b: np.zeros((b.batch_size, b.output_length), dtype=np.int32)   # noqa: E731
    a, b, other = Steps(), Steps(), Steps()
    ra, rb = learner(corpus).run(a, zeros), learner(corpus).run(b, zeros)
    ro = learner(corpus, seed=1).run(other, zeros)
    assert ra["train_data"]["batches_sha256"] == rb["train_data"]["batches_sha256"] != \
        ro["train_data"]["batches_sha256"]
    assert ra["train_data"]["first_batches_sha256"] == rb["train_data"]["first_batches_sha256"] != \
        ro["train_data"]["first_batches_sha256"] is not None
    assert [x.ids for x in a.batches] == [x.ids for x in b.batches] != [x.ids for x in other.batches]
    texts = {u.index: u.text for u in corpus.utterances("train")}
    for batch in a.batches:
        assert batch.frames % 40 == 0 and batch.labels.shape == (batch.batch_size, C.label_width(batch.frames))
        for row, i in enumerate(batch.ids):
            n = batch.label_lengths[row]
            assert n == len(texts[i]) and list(batch.labels[row, :n]) == list(encode(texts[i]))
            assert not batch.labels[row, n:].any()


def test_predict_may_return_logits_not_floats_of_another_shape(corpus):
    lr = learner(corpus)
    logits = lambda b: np.eye(29)[np.zeros((b.batch_size, b.output_length), dtype=int)]   # noqa: E731  blank
    assert lr.run(Steps(), logits, max_steps=2)["final"]["cer"]["test_seen"] == 1.0
    with pytest.raises(ValueError, match="integer class ids"):
        learn.ids_of(np.zeros((2, 5)))
    with pytest.raises(ValueError, match="rows for a batch"):
        lr.evaluate(lambda b: np.zeros((b.batch_size + 1, b.output_length), dtype=np.int32))
    assert learn.decode_ids([[0, 1, 1, 0, 1, 28, 28, 2]]) == ["'' a"]


def test_the_learn_presets_and_their_check_preset():
    assert set(PRESETS) == {"deepmark", "quick", "smoke", "cpu"} and {"learn", "learn-smoke"} <= set(LEARN_PRESETS)
    for name, lp in LEARN_PRESETS.items():
        assert is_learn_preset(name) and not is_learn_preset(lp.config)
        p = get_preset(name)
        assert (p.name, p.config, p.batch_size, p.lengths, p.scale) == (name, lp.config, lp.batch_size, (1,), 1)
        assert lp.eval_every <= lp.max_steps and 0 < lp.target_cer < 1 and lp.target_split in learn.EVAL_SPLITS
    assert LEARN_PRESETS["learn-smoke"].config == LEARN_PRESETS["learn"].config == LEARN_MODEL
    assert learn.corpus_recipe(LEARN_PRESETS["learn"]) == C.read_manifest()["recipe"]
    assert not is_learn_preset("smoke") and not is_learn_preset(None)
    with pytest.raises(ValueError, match="learn-smoke"):
        get_preset("nope")


def test_a_synthetic_batch_has_label_lengths_of_the_full_width():
    from common.data import DeepMarkIterator
    batch = DeepMarkIterator(4, 1, 0, lengths=(2,)).batch(0)
    assert list(batch.label_lengths) == [batch.labels.shape[1]] * batch.batch_size
    assert batch.label_lengths.dtype == np.int32


def _record(target, seed, cers, steps_to=None, status="ok"):
    rec = {"target": target, "precision": "fp32", "seed": seed, "preset": "learn", "status": status}
    if status != "ok":
        return dict(rec, error="it broke")
    evals = [{"step": s, "train_s": s * 0.5, "eval_s": 1.0, "wall_s": s * 0.5 + 1, "loss": 1.0,
              "cer": {"test_seen": c, "test_unseen": c + 0.1}} for s, c in zip((0, 50, 100, 150), cers)]
    block = {"evaluations": evals, "corpus": {"corpus_sha256": "ab" * 32},
             "target": {"split": "test_seen", "cer": 0.35, "reached": steps_to is not None, "steps": steps_to,
                        "train_s": 10.0 if steps_to else None, "wall_s": 12.0 if steps_to else None,
                        "reason": None if steps_to else "the cap"},
             "final": {"step": evals[-1]["step"], "cer": evals[-1]["cer"]}}
    return dict(rec, learning=block)


def test_the_report_section_flags_a_row_outside_the_pytorch_spread(tmp_path):
    from runner.report import learning as R
    records = [_record("pytorch", 0, [1.0, 0.60, 0.45, 0.34], 150), _record("pytorch", 1, [1.0, 0.64, 0.47, 0.36]),
               _record("pytorch", 2, [1.0, 0.62, 0.44, 0.35], 150), _record("jax", 0, [1.0, 0.61, 0.46, 0.34], 150),
               _record("tensorflow", 0, [1.0, 0.80, 0.70, 0.60]), _record("cntk", 0, None, status="failed")]
    rows, note = R.parity(records)
    verdict = {r["Row"].split()[0]: r["Parity"] for r in rows}
    assert verdict == {"jax": "within", "tensorflow": "**outside**"} and "seeds 0, 1, 2" in note
    table = R.table_rows(records)
    assert [r["Row"] for r in table][0] == "cntk fp32 seed 0" and table[0]["Note"] == "it broke"
    jax = next(r for r in table if r["Row"].startswith("jax"))
    assert (jax["CER @50"], jax["Steps to target"], jax["Final CER unseen"]) == (0.61, 150, pytest.approx(0.44))
    lines = R.section(records + [{"target": "pytorch", "preset": "smoke", "status": "ok"}], str(tmp_path),
                      lambda p: p)
    assert lines[0] == "## Learns a real task" and (tmp_path / R.PLOT).exists()
    assert sum("| jax fp32 seed 0 |" in line for line in lines) == 2     # the table and the parity rows
    assert R.section([_record("pytorch", 0, [1, 0.5, 0.4, 0.3])], str(tmp_path), str)[-2].startswith(
        "Parity: No parity check")
    assert R.section([{"preset": "smoke", "target": "jax"}], str(tmp_path), str) == []


@pytest.mark.parametrize("extra", [["--batch-size", "8"], ["--scale", "2"], ["--workers", "2"]])
def test_run_all_refuses_what_a_learn_preset_sets_itself(extra):
    import subprocess
    import sys
    from runner.base import ROOT
    proc = subprocess.run([sys.executable, "run_all.py", "--preset", "learn-smoke", "--frameworks", "pytorch"] + extra,
                          cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "--preset learn-smoke sets its own batch size and corpus and trains in one process" in lines[0]
    assert "Running" not in proc.stdout


def test_a_learn_presets_implicit_skip_reaches_only_notebooks_that_declare_it():
    """run_all.py --preset learn skips the pure benchmark parts; papermill gets ``skip`` only where the notebook
    has that parameter: every row's notebook declares it, and a notebook without it (the data-parallel fixture) runs
    every part (no "Passed unknown parameter")."""
    from common.spec import SKIPPABLE, get_preset
    from runner.run import execute
    from runner.run.targets import TARGETS, Target
    from runner.validate import notebook_parameter_names
    opts = execute.RunOptions(get_preset("learn-smoke"), "fp32", 0, "cpu", "/tmp/unused", skip=list(SKIPPABLE))
    for name, target in TARGETS.items():
        params = execute.notebook_parameters(target, opts, "/tmp/unused/r.json")
        assert "skip" in notebook_parameter_names(target.notebook_path), name
        assert params["skip"] == list(SKIPPABLE), name
    fixture = Target("fixture", "Fixture (stdlib)", "../tests/fixtures/dp_fixture.ipynb", "pytorch")
    assert "skip" not in notebook_parameter_names(fixture.notebook_path)
    assert "skip" not in execute.notebook_parameters(fixture, opts, "/tmp/unused/r.json")
