"""The real task's corpus (common/corpus.py): a tiny corpus of 10 utterances built twice into temporary caches.

Needs Debian's espeak-ng and flite (.ci/run installs them); without them the synthesis tests are skipped with the
reason, and the tests that need no engine (resampler, feasibility rule, committed files, missing-engine error)
still run."""
import gzip
import hashlib
import os

import numpy as np
import pytest

from common import corpus as C
from common.decode import encode

#: the tiny corpus's hash with Debian bookworm's espeak-ng 1.51 and flite 2.2 (tests/test_corpus.py measured it):
#: another engine build that speaks differently fails here, as the committed manifest would fail to build
TINY_SHA256 = "5db38cadb72f90622871fc88ae52ded9f20c9633b754947a924a3daf865147c6"


def _engines_or_skip():
    try:
        C.check_engines()
    except C.EngineError as e:
        pytest.skip("the corpus engines are missing (.ci/run installs them): %s" % e)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The same tiny recipe built into two separate caches: (recipe, corpus A, corpus B)."""
    _engines_or_skip()
    rec = C.recipe(seed=3, train=6, test_seen=2, test_unseen=2)
    a = C.open_or_build(rec, str(tmp_path_factory.mktemp("cache_a")), progress=False)
    b = C.open_or_build(rec, str(tmp_path_factory.mktemp("cache_b")), jobs=1, progress=False)
    return rec, a, b


def test_two_builds_are_identical(tiny):
    rec, a, b = tiny
    assert a.corpus_sha256 == b.corpus_sha256
    assert a.manifest == b.manifest
    assert a.features_sha256 == b.features_sha256          # same machine, same NumPy: the same float16 bytes
    assert os.path.basename(a.directory) == C.recipe_key(rec)


def test_tiny_corpus_hash_is_pinned(tiny):
    _, a, _ = tiny
    assert a.corpus_sha256 == TINY_SHA256, "the engines speak differently from Debian bookworm's espeak-ng 1.51 / " \
                                           "flite 2.2 (corpus %s)" % a.corpus_sha256


def test_manifest_hash_covers_every_utterance(tiny):
    _, a, _ = tiny
    m = a.manifest
    clauses = C.load_clauses()
    assert C.corpus_digest(m["recipe"], m["utterances"], clauses) == m["corpus_sha256"]
    rows = {s: [list(r) for r in m["utterances"][s]] for s in C.SPLITS}
    rows["train"][0][3] = "0" * 64                          # one PCM hash changed -> another corpus hash
    assert C.corpus_digest(m["recipe"], rows, clauses) != m["corpus_sha256"]
    u = a.utterances("test_unseen")[0]                      # the stored hash is the PCM's
    pcm = C.synthesize(u.text, u.speaker)
    assert len(pcm) == u.samples and hashlib.sha256(pcm.astype("<i2").tobytes()).hexdigest() == u.pcm_sha256


def test_splits_are_disjoint_and_their_voices_as_described(tiny):
    _, a, _ = tiny
    sizes = {s: len(a.utterances(s)) for s in C.SPLITS}
    assert sizes == {"train": 6, "test_seen": 2, "test_unseen": 2}
    texts = {s: {u.text for u in a.utterances(s)} for s in C.SPLITS}
    clauses = {s: {u.clause for u in a.utterances(s)} for s in C.SPLITS}
    for s in C.SPLITS:
        assert len(texts[s]) == sizes[s]
        for t in C.SPLITS:
            if s < t:
                assert not texts[s] & texts[t] and not clauses[s] & clauses[t]
    for s in C.SPLITS:
        for u in a.utterances(s):
            engine, voice = u.speaker.split(":")[:2]
            if engine == "flite":
                assert (voice == C.FLITE_HELD_OUT) == (s == "test_unseen")
            else:
                accent, variant = voice.split("+")
                held = accent == C.HELD_OUT_ACCENT or variant in C.HELD_OUT_VARIANTS
                assert held == (s == "test_unseen"), u.speaker


def test_speaker_streams_follow_the_rules():
    voices = {s: [C.speaker_for(0, s, k) for k in range(400)] for s in C.SPLITS}
    for s, speakers in voices.items():
        flite = [v for v in speakers if v.startswith("flite:")]
        assert 0.15 < len(flite) / len(speakers) < 0.35
        for v in flite:
            assert 0.85 <= float(v.split(":d")[1]) <= 1.25
    unseen = {C.voice_of(v) for v in voices["test_unseen"]}
    seen = {C.voice_of(v) for v in voices["train"] + voices["test_seen"]}
    assert not unseen & seen
    assert C.speaker_for(0, "train", 7) == C.speaker_for(0, "train", 7) != C.speaker_for(1, "train", 7)


def test_shapes_on_the_grid_and_the_feasibility_rule(tiny):
    _, a, _ = tiny
    for s in C.SPLITS:
        for u in a.utterances(s):
            assert u.frames == -(-u.samples // C.HOP)
            assert u.padded_frames % C.GRID == 0 and u.padded_frames % 4 == 0
            assert u.frames <= u.padded_frames < u.frames + C.GRID
            assert C.feasible(u.text, u.frames)
            f = a.features(s, u.index)
            assert f.shape == (u.padded_frames, C.N_FREQ) and f.dtype == np.float16
            own = f[:u.frames].astype(np.float64)
            assert abs(own.mean()) < 1e-2 and abs(own.std() - 1) < 1e-2       # normalised over its own frames
            assert np.all(f[u.frames + 1:] == f[-1])                          # digital silence: one value


def test_a_coarser_grid_pads_the_same_audio_to_fewer_lengths(tiny, tmp_path):
    rec, a, _ = tiny
    coarse = C.recipe(seed=3, train=6, test_seen=2, test_unseen=2, grid=120)
    assert coarse["grid_frames"] == 120 and C.recipe_key(coarse) != C.recipe_key(rec)
    b = C.open_or_build(coarse, str(tmp_path), progress=False)
    for s in C.SPLITS:
        for u, v in zip(a.utterances(s), b.utterances(s)):
            assert (u.text, u.speaker, u.pcm_sha256, u.frames) == (v.text, v.speaker, v.pcm_sha256, v.frames)
            assert v.padded_frames % 120 == 0 and v.frames <= v.padded_frames < v.frames + 120
            assert v.padded_frames == C.grid_frames(u.frames, 120)
            # the same features over the shorter padding, digital silence after it
            np.testing.assert_array_equal(b.features(s, v.index)[:u.padded_frames], a.features(s, u.index))
            assert np.all(b.features(s, v.index)[u.frames + 1:] == b.features(s, v.index)[-1])
    for bad in (0, 42, -40, 40.0, True):
        with pytest.raises(ValueError, match="grid must be a positive multiple of 4 frames"):
            C.recipe(grid=bad)


def test_evaluation_batches_hold_every_test_utterance_once_one_length_each(tiny):
    _, a, _ = tiny
    batches = C.evaluation_batches(a, ("test_seen", "test_unseen"), 3)
    members = [m for _, ms in batches for m in ms]
    assert sorted(members) == sorted((s, u.index) for s in ("test_seen", "test_unseen") for u in a.utterances(s))
    for b, ms in batches:
        assert 1 <= b.batch_size <= 3 and b.batch_size == len(ms) and b.labels.shape[1] == C.label_width(b.frames)
        assert all(a.utterances(s)[i].padded_frames == b.frames for s, i in ms)
        for row, (s, i) in enumerate(ms):
            np.testing.assert_array_equal(b.features[row], a.features(s, i).astype(np.float32))
            text = encode(a.utterances(s)[i].text)
            assert b.label_lengths[row] == len(text) and list(b.labels[row, :len(text)]) == list(text)
    assert [b.frames for b, _ in batches] == sorted(b.frames for b, _ in batches)
    for s in ("test_seen", "test_unseen"):                 # each split in its own iterator's order
        own = [i for b in a.iterator(s, 3, shuffle=False).epoch(0) for i in b.ids]
        assert [i for _, ms in batches for t, i in ms if t == s] == own
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        C.evaluation_batches(a, ("test_seen",), 0)


def test_batches_have_one_length_and_labelled_lengths(tiny):
    _, a, _ = tiny
    it = a.iterator("train", batch_size=2)
    seen = []
    for b in it.epoch(0):
        n, t, f = b.features.shape
        assert b.features.dtype == np.float32 and f == 161 and t == b.frames and t % 4 == 0
        assert b.output_length == t // 4
        texts = it.texts(b.ids)
        assert list(b.label_lengths) == [len(x) for x in texts]
        for row, text in enumerate(texts):
            assert list(b.labels[row, :len(text)]) == list(encode(text))
            assert not b.labels[row, len(text):].any()
            np.testing.assert_array_equal(b.features[row], a.features("train", b.ids[row]).astype(np.float32))
        seen += b.ids
    assert sorted(seen) == list(range(6)) and it.checksum
    warm = it.warmup_batches()
    assert sorted((b.batch_size, b.frames) for b in warm) == sorted(it.shapes())
    assert [len(x) for x in it.plan(0)] == [len(x) for x in a.iterator("train", 2).plan(0)]


def test_shuffle_is_seeded_per_epoch(tiny):
    _, a, _ = tiny
    it = a.iterator("train", batch_size=1)
    plans = [it.plan(e) for e in range(6)]
    assert plans[0] == a.iterator("train", batch_size=1).plan(0)          # the same seed: the same order
    assert len({tuple(map(tuple, p)) for p in plans}) > 1                  # epochs differ
    assert all(sorted(i for b in p for i in b) == list(range(6)) for p in plans)
    fixed = a.iterator("test_seen", batch_size=8)                          # test splits: no shuffle
    assert not fixed.shuffle and fixed.plan(0) == fixed.plan(5)
    steps = list(it.steps(8))
    assert [b.epoch for b in steps] == [0] * 6 + [1] * 2


def test_a_larger_margin_rejects_and_draws_the_next_clause(tmp_path, monkeypatch):
    _engines_or_skip()
    monkeypatch.setattr(C, "MARGIN", 20)            # about half of the candidates fail it
    rec = C.recipe(seed=3, train=1, test_seen=1, test_unseen=1)
    corpus = C.open_or_build(rec, str(tmp_path), jobs=1, progress=False)
    assert rec["margin"] == 20 and sum(corpus.meta["rejected"].values()) > 0
    for s in C.SPLITS:
        u = corpus.utterances(s)[0]
        assert u.frames // 4 >= len(u.text) + C.repeats(u.text) + 20
        assert u.clause == C.clause_pool(30000, s)[corpus.meta["rejected"][s]]     # the next clause, in order


def test_feasibility_rule_by_hand():
    assert C.repeats("all well") == 2 and C.repeats("abc") == 0
    # "aab": 3 symbols + 1 repeat + margin 5 = 9 output frames = 36 frames of its own
    assert C.feasible("aab", 36) and not C.feasible("aab", 35)
    assert C.feasible("aab", 4 * 4, margin=0) and not C.feasible("aab", 15, margin=0)
    assert C.grid_frames(1) == 40 and C.grid_frames(40) == 40 and C.grid_frames(41) == 80
    assert C.own_frames(160) == 1 and C.own_frames(161) == 2 and C.own_frames(0) == 1


def test_resampler_is_exact_integer_polyphase():
    taps = C.resampler_taps()
    assert taps.shape == (64, 320) and taps.dtype == np.int64
    assert np.abs(taps.sum(axis=0) - (1 << C.TAP_BITS)).max() < 16        # every phase passes DC at gain 1
    t = np.arange(22050)
    x = np.round(10000 * np.sin(2 * np.pi * 1000 * t / 22050)).astype(np.int16)
    y = C.resample_22050_to_16000(x)
    assert y.dtype == np.int16 and len(y) == 16000
    ref = 10000 * np.sin(2 * np.pi * 1000 * np.arange(16000) / 16000)
    assert np.abs(y[100:-100] - ref[100:-100]).max() <= 8                  # in the passband: -62 dB
    assert len(C.resample_22050_to_16000(x[:441])) == 320
    high = np.round(10000 * np.sin(2 * np.pi * 9000 * t / 22050)).astype(np.int16)
    assert np.abs(C.resample_22050_to_16000(high)[100:-100]).max() < 10    # above 8.2 kHz: stopped
    np.testing.assert_array_equal(C.resample_22050_to_16000(x), y)


def test_features_of_silence_and_shape():
    pcm = np.zeros(1000, dtype=np.int16)
    pcm[100:900] = (3000 * np.sin(np.arange(800) * 0.3)).astype(np.int16)
    f = C.features(pcm, 40)
    assert f.shape == (40, 161) and f.dtype == np.float16
    with pytest.raises(ValueError, match="less than"):
        C.features(pcm, 6)


def test_committed_files_are_small_and_consistent():
    assert os.path.getsize(C.CLAUSES_PATH) < 1 << 20 and os.path.getsize(C.LEARN_MANIFEST) < 1 << 20
    with gzip.open(C.CLAUSES_PATH, "rt") as f:
        header = f.readline()
    assert "King James" in header and "public domain" in header
    clauses = C.load_clauses()
    assert len(clauses) == len(set(clauses)) == 30000
    assert all(3 <= len(c.split()) <= 10 and set(c) <= set(C.ALPHABET) for c in clauses)
    m = C.read_manifest()
    assert m["recipe"] == C.recipe(m["recipe"]["seed"], **m["recipe"]["sizes"])   # this code makes this corpus
    assert C.corpus_digest(m["recipe"], m["utterances"], clauses) == m["corpus_sha256"]
    assert {s: len(m["utterances"][s]) for s in C.SPLITS} == m["recipe"]["sizes"]
    used = [r[0] for s in C.SPLITS for r in m["utterances"][s]]
    assert len(used) == len(set(used))                                            # no clause twice


def test_a_missing_engine_is_one_line_and_exit_status_2(monkeypatch, capsys):
    real_which = C.shutil.which
    monkeypatch.setattr(C.shutil, "which", lambda cmd: None if cmd == "espeak-ng" else real_which(cmd))
    assert C.main(["check"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "apt-get install espeak-ng" in err


def test_bad_recipe_is_refused():
    with pytest.raises(ValueError, match="train must be a positive integer"):
        C.recipe(train=0)
    with pytest.raises(ValueError, match="at most 500"):
        C.recipe(test_seen=501)
    with pytest.raises(ValueError, match="unknown split"):
        C._check_split("dev")


def test_the_learn_preset_names_the_committed_corpus():
    from common.decode import N_CLASSES
    from common.spec import PRESETS, get_learn_preset
    p = get_learn_preset("learn")
    m = C.read_manifest()
    assert m["recipe"]["seed"] == p.corpus_seed
    assert m["recipe"]["sizes"] == {"train": p.train_utterances, "test_seen": p.test_utterances,
                                    "test_unseen": p.test_utterances}
    assert p.target_split in C.SPLITS and 0 < p.target_cer < 1 and p.eval_every <= p.max_steps
    cfg = p.config
    assert (cfg.n_classes, cfg.n_freq, cfg.time_stride, cfg.param_count) == (N_CLASSES, C.N_FREQ, C.TIME_STRIDE,
                                                                            1362941)
    assert C.GRID % cfg.time_stride == 0
    assert "learn" not in PRESETS       # run_all.py --preset takes PRESETS' names; no notebook runs it yet
    with pytest.raises(ValueError, match="valid: learn"):
        get_learn_preset("smoke")
