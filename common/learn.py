"""The real task's training loop, framework-free: the schedule, the evaluation, the stop rule and the record.

A notebook run with a learn preset (``preset="learn"``, ``run_all.py --preset learn``; :data:`common.spec.LEARN_PRESETS`)
first runs its sections 3-12 on the preset's :meth:`~common.spec.LearnPreset.check_preset` (the learn width, the
synthetic check batch: first loss against the NumPy reference, parameter count, data checksum), and then its section
*12b. Learning a real task*, which hands two functions of its own to :class:`Learner`:

- ``train_step(batch)``: the notebook's training step (section 7, the same function), on a
  :class:`common.corpus.Batch` -- features (N, T, 161) float32, labels (N, Lmax) int32 padded with 0 (the blank,
  which no label is) to Lmax = T / 4 - 5 (:func:`common.corpus.label_width`: a batch's shapes depend on (N, T) only,
  one XLA program per grid shape), label_lengths (N,) int32, one T per batch, every logit length T / 4 -- returning
  the loss (any scalar
  ``to_float`` turns into a float: reading it waits for the step to finish);
- ``predict(batch)``: an inference-mode forward pass (BatchNorm's running statistics, no gradient) returning the
  argmax class of every output frame, (N, T / 4) integers (logits (N, T / 4, 29) are accepted and reduced here).

The section, in PyTorch::

    learning = None
    if is_learn_preset(preset):
        learner = learn.Learner(preset, seed)        # the corpus (built on first use, off the clock) and batches
        load_canonical(model, state)                 # the canonical start again: the check and the step moved it
        optimizer = sgd(model)
        train_step = make_train_step(step_model, optimizer)
        ...
        learning = learner.run(train_step, predict, to_float=lambda loss: loss.item())

and the record gets ``learning=learning`` (:func:`common.results.benchmark_record`'s further sections).

**The schedule.**  Training batches come from :meth:`common.corpus.CorpusIterator.steps` over the ``train`` split
(batch size of the preset, shuffled per epoch from the run's ``seed``): the same batches in the same order in every
row.  Evaluation runs at step 0 (the canonical start) and every ``eval_every`` steps, on both test splits in full
(batched together: :func:`common.corpus.evaluation_batches`, at most ``eval_batch_size`` per batch, one T per batch,
fixed order; the CER is each split's own), greedy-decoded by :mod:`common.decode`
(collapse repeats, drop the blank) and scored by the corpus CER.  The run stops after the first evaluation whose
``target_split`` CER is at or below ``target_cer`` (step 0's included), at ``max_steps`` (evaluated there too), or at the first
non-finite loss.

**The clock** (MLPerf-style): the corpus is built or read and the evaluation batches are loaded before the clock
starts; training steps, evaluations and the reading of training batches are on it.  Per evaluation the record holds
``train_s`` (the summed training steps, each timed until its loss is read), ``eval_s`` (the summed evaluations)
and ``wall_s`` (since the clock started, at the end of that evaluation); a framework that compiles per shape
(XLA) compiles on the clock, in the first step of each shape.

Framework-free (NumPy and the standard library) and Python 3.6-compatible (CNTK's interpreter).
"""
import hashlib
import json
import math
import sys
import time
from collections import OrderedDict
from typing import Callable, List, Optional, Sequence

import numpy as np

from . import corpus as corpus_mod
from .decode import N_CLASSES, cer_counts, collapse, ids_to_text
from .spec import LearnPreset, get_learn_preset, is_learn_preset  # noqa: F401  (is_learn_preset: the notebooks')

#: the evaluation splits, in the record's order
EVAL_SPLITS = ("test_seen", "test_unseen")
#: decoded examples the record keeps from the last evaluation (the first utterances of each split)
EXAMPLES = 3
#: what the clock covers, as the record says it
CLOCK = ("training steps (each until its loss is read), the reading of training batches and the evaluations are on "
         "the clock; building or reading the corpus and loading the evaluation batches are not")


def preset_of(preset) -> LearnPreset:
    """A :class:`LearnPreset` from itself or its name (ValueError listing the valid names)."""
    return preset if isinstance(preset, LearnPreset) else get_learn_preset(preset)


def corpus_recipe(preset: LearnPreset) -> dict:
    """The corpus recipe of a learn preset (its seed and sizes)."""
    return corpus_mod.recipe(preset.corpus_seed, train=preset.train_utterances, test_seen=preset.test_utterances,
                             test_unseen=preset.test_utterances, grid=preset.grid_frames)


def open_corpus(preset, root: Optional[str] = None, progress: bool = True) -> corpus_mod.Corpus:
    """The corpus of a learn preset from the cache, built on first use.  When the committed manifest
    (``common/corpus_data/learn.json``) has the preset's recipe, every utterance is held to it (another engine
    build stops the build with one line); a smaller recipe (a test's) is built without one."""
    preset = preset_of(preset)
    rec = corpus_recipe(preset)
    manifest = corpus_mod.read_manifest()
    if manifest["recipe"] == rec:
        return corpus_mod.load(root=root, progress=progress)
    return corpus_mod.open_or_build(rec, root, progress=progress)


def ids_of(predicted) -> np.ndarray:
    """(N, T') integer class ids from what a ``predict`` returned: ids, or logits (N, T', 29) (argmax here)."""
    a = np.asarray(predicted)
    if a.ndim == 3 and a.shape[-1] == N_CLASSES:
        a = np.argmax(a, axis=-1)
    if a.ndim != 2 or a.dtype.kind not in "iu":
        raise ValueError("predict must return (N, T/4) integer class ids (or (N, T/4, %d) logits), got %s %r"
                         % (N_CLASSES, a.dtype, a.shape))
    return a


def decode_ids(ids) -> List[str]:
    """Greedy CTC decoding of argmax ids (N, T'): merge repeats, drop the blank (:func:`common.decode.collapse`)."""
    return [ids_to_text(collapse(row)) for row in ids_of(ids)]


def _rounded(x: float, digits: int = 7) -> Optional[float]:
    if x is None or not math.isfinite(x):
        return None
    return float("%.*g" % (digits, x))


class Learner:
    """The real task's training loop for one row: the corpus, the batches, the schedule and the record.

    ``preset``: a learn preset or its name; ``seed``: the order of the training batches (the notebook's ``seed``,
    which also chose its initial weights); ``corpus``: a :class:`common.corpus.Corpus` already open (default:
    :func:`open_corpus`); ``out``: where the progress lines go.  Construction opens the corpus and loads the
    evaluation batches (off the clock); :meth:`run` trains.
    """

    def __init__(self, preset, seed: int = 0, corpus: Optional[corpus_mod.Corpus] = None, out=None,
                 progress: bool = True, clock: Callable[[], float] = time.perf_counter):
        self.preset = preset_of(preset)
        self.seed = seed
        self.out = out or sys.stdout
        self.clock = clock
        t0 = time.time()
        self.corpus = corpus if corpus is not None else open_corpus(self.preset, progress=progress)
        self.train = self.corpus.iterator("train", self.preset.batch_size, seed=seed, grid_labels=True)
        # both test splits in one set of batches (one T per batch): one inference shape per length, not per split
        self.eval_batches = corpus_mod.evaluation_batches(self.corpus, EVAL_SPLITS, self.preset.eval_batch_size)
        self.prepare_s = time.time() - t0
        self._print("%s: corpus %s (%s), %d training utterances in %d batches of up to %d, evaluation on %s "
                    "(%s utterances, %d batches) every %d steps; stop at %s CER <= %g or after %d steps (ready in "
                    "%.1f s)" % (self.preset.name, self.corpus.corpus_sha256[:12], self.corpus.directory,
                                 len(self.train.utterances), len(self.train), self.preset.batch_size,
                                 " and ".join(EVAL_SPLITS),
                                 " + ".join(str(len(self.corpus.utterances(s))) for s in EVAL_SPLITS),
                                 len(self.eval_batches), self.preset.eval_every, self.preset.target_split,
                                 self.preset.target_cer, self.preset.max_steps, self.prepare_s))

    def shapes(self):
        """What a framework that compiles per shape compiles ahead: ``{"train": [batch, ...], "eval": [batch, ...]}``,
        the first batch of every distinct (N, T) shape of the training split and of the evaluation batches (their
        labels have the width of their T)."""
        seen, evals = set(), []
        for b, _ in self.eval_batches:
            if (b.batch_size, b.frames) not in seen:
                seen.add((b.batch_size, b.frames))
                evals.append(b)
        return {"train": self.train.warmup_batches(0), "eval": evals}

    def _print(self, line: str) -> None:
        print(line, file=self.out)
        try:
            self.out.flush()
        except AttributeError:
            pass

    def evaluate(self, predict: Callable) -> "OrderedDict":
        """CER per evaluation split (and the decoded texts) of the model ``predict`` runs: {split: (cer, refs,
        hyps)}."""
        refs, hyps = OrderedDict((s, []) for s in EVAL_SPLITS), OrderedDict((s, []) for s in EVAL_SPLITS)
        for batch, members in self.eval_batches:
            ids = ids_of(predict(batch))
            if ids.shape[0] != batch.batch_size:
                raise ValueError("predict returned %d rows for a batch of %d" % (ids.shape[0], batch.batch_size))
            for (split, i), text in zip(members, decode_ids(ids)):
                hyps[split].append(text)
                refs[split].append(self.corpus.utterances(split)[i].text)
        out = OrderedDict()
        for split in EVAL_SPLITS:
            errors, chars = cer_counts(refs[split], hyps[split])
            out[split] = (errors / float(chars), refs[split], hyps[split])
        return out

    def run(self, train_step: Callable, predict: Callable, to_float: Callable = float,
            max_steps: Optional[int] = None, inference: str = "", details: Optional[dict] = None) -> "OrderedDict":
        """Train from the model as it is now until the target CER or the step cap; returns the record's
        ``learning`` block.  ``max_steps``: a lower cap than the preset's (a test's); ``inference``: how the
        notebook's ``predict`` runs the model; ``details``: the framework's own facts for the record (what it
        compiled ahead, off the clock, and how long that took)."""
        p = self.preset
        cap = p.max_steps if max_steps is None else min(int(max_steps), p.max_steps)
        if cap < 1:
            raise ValueError("max_steps must be at least 1, got %r" % (max_steps,))
        evaluations, losses, since = [], [], []
        batches = hashlib.sha256(json.dumps([self.corpus.corpus_sha256, p.batch_size, self.seed]).encode())
        first_batches = None                  # the hash of the first eval_every batches (None: fewer ran)
        train_s = eval_s = 0.0
        stopped, reason, reached = "max_steps", None, None
        last = None
        start = self.clock()

        def evaluation(step):
            nonlocal eval_s, last
            t = self.clock()
            scores = self.evaluate(predict)
            eval_s += self.clock() - t
            wall = self.clock() - start
            mean_loss = sum(since) / len(since) if since else None
            entry = OrderedDict([("step", step), ("epoch", round(step * p.batch_size / len(self.train.utterances), 3)),
                                 ("train_s", round(train_s, 3)), ("eval_s", round(eval_s, 3)),
                                 ("wall_s", round(wall, 3)), ("loss", _rounded(mean_loss)),
                                 ("cer", OrderedDict((s, round(v[0], 5)) for s, v in scores.items()))])
            evaluations.append(entry)
            del since[:]
            last = scores
            self._print("step %5d  loss %s  CER %s  (train %.1f s, eval %.1f s, wall %.1f s)"
                        % (step, "%9.3f" % mean_loss if mean_loss is not None else "        -",
                           "  ".join("%s %.3f" % (s, c) for s, c in entry["cer"].items()), train_s, eval_s, wall))
            return entry

        step = 0
        if evaluation(0)["cer"][p.target_split] <= p.target_cer:      # the start meets the target already
            stopped, reached = "target", evaluations[0]
        for batch in self.train.steps(0 if reached else cap):
            batches.update(json.dumps([batch.epoch, batch.index, batch.ids]).encode())
            if step + 1 == p.eval_every:       # the batches before the first evaluation: every run trains on them
                first_batches = batches.hexdigest()
            t = self.clock()
            loss = to_float(train_step(batch))
            train_s += self.clock() - t
            step += 1
            losses.append(_rounded(loss))
            if not math.isfinite(loss):
                stopped, reason = "not_finite", "the loss is %r at step %d" % (loss, step)
                self._print("stopped: " + reason)
                break
            since.append(loss)
            if step % p.eval_every == 0 or step == cap:
                entry = evaluation(step)
                if entry["cer"][p.target_split] <= p.target_cer:
                    stopped, reached = "target", entry
                    break
        wall = self.clock() - start
        if reached is None and reason is None:
            reason = "%s CER %.3f after %d steps (the cap), above the target %g" % (
                p.target_split, evaluations[-1]["cer"][p.target_split], step, p.target_cer)
            if cap < p.max_steps:
                reason += " (capped at %d of the preset's %d steps)" % (cap, p.max_steps)
        target = OrderedDict([("split", p.target_split), ("cer", p.target_cer), ("reached", reached is not None),
                              ("steps", reached["step"] if reached else None),
                              ("train_s", reached["train_s"] if reached else None),
                              ("wall_s", reached["wall_s"] if reached else None), ("reason", reason)])
        final = evaluations[-1]
        examples = OrderedDict((s, [OrderedDict([("reference", r), ("hypothesis", h)])
                                    for r, h in list(zip(v[1], v[2]))[:EXAMPLES]]) for s, v in last.items())
        block = OrderedDict([
            ("preset", p.name), ("seed", self.seed),
            ("settings", OrderedDict((k, v) for k, v in p.to_dict().items() if k not in ("config", "name"))),
            ("optimizer", "SGD, momentum %g, lr %g" % (p.config.momentum, p.config.lr)),
            ("corpus", self.corpus.describe()),
            ("train_data", dict(self.train.describe(), batches_sha256=batches.hexdigest(),
                                first_batches_sha256=first_batches)),
            ("inference", inference), ("details", details or {}), ("clock", CLOCK),
            ("prepare_s", round(self.prepare_s, 3)),
            ("steps", step), ("stopped", stopped), ("target", target),
            ("final", OrderedDict([("step", final["step"]), ("cer", final["cer"]), ("train_s", round(train_s, 3)),
                                   ("eval_s", round(eval_s, 3)), ("wall_s", round(wall, 3))])),
            ("evaluations", evaluations), ("losses", losses), ("examples", examples),
        ])
        self._print("%s after %d steps: %s CER %.3f (target %g: %s), %.1f s of training, %.1f s wall"
                    % (stopped, step, p.target_split, final["cer"][p.target_split], p.target_cer,
                       "reached at step %d, %.1f s" % (target["steps"], target["wall_s"]) if reached else reason,
                       train_s, wall))
        return block


def cer_at(block: dict, step: int, split: Optional[str] = None) -> Optional[float]:
    """The CER of ``split`` (default: the target split) at the evaluation of ``step`` in a ``learning`` block, or
    None where no evaluation ran at that step."""
    split = split or block["target"]["split"]
    for e in block["evaluations"]:
        if e["step"] == step:
            return e["cer"].get(split)
    return None


def common_steps(blocks: Sequence[dict]) -> List[int]:
    """The evaluation steps every block has (ascending)."""
    sets = [set(e["step"] for e in b["evaluations"]) for b in blocks]
    return sorted(set.intersection(*sets)) if sets else []
