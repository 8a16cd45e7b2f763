"""XLA:GPU's autotuning results, kept per card and jaxlib version, so that a first run on a card compiles fast; no
framework import.

On a GPU most of XLA's compile time is autotuning: for each fusion it compiles and times candidate kernels on the
card.  On an H100 (results/experiments/h100_session_2026-11-27) the JAX notebook's step for three batch shapes
compiled in 48.7 s; with the autotuning results that an earlier process had written, read first, in 4.5 s, and its
steps ran as fast.  XLA writes them with ``--xla_gpu_dump_autotune_results_to=FILE`` and reads them with
``--xla_gpu_load_autotune_results_from=FILE``; an entry is keyed by the device, the fusion's HLO and XLA's code
generator's version, so a file serves one kind of card and one jaxlib, and entries it lacks are autotuned as usual.

* :func:`results_file` -- where the project keeps them: ``results/autotune/jax-<jaxlib>/<card>.textproto``.
* :func:`xla_flags` -- ``XLA_FLAGS`` that load that file where it exists and, where ``DS2_XLA_AUTOTUNE_DUMP_DIR``
  is set (a device session sets it), write this run's results (those loaded included) into that directory.  Where
  ``DS2_XLA_AUTOTUNE_RESULTS_DIR`` is set, the card's file is read from that directory instead of
  ``results/autotune`` (a device session's: the committed results merged with those its earlier rows wrote).
* :func:`entries`, :func:`merge`, :func:`count` -- the text format's top-level entries, several files made one
  without duplicate keys (XLA refuses a file that holds a key twice), and their number; a file that is not whole
  (unbalanced braces, an unterminated string) is a ``ValueError``.
* :func:`card_file_of`, :func:`merge_file`, :func:`merge_into` -- the card's file a run's results belong to, a
  card's file merged with runs' results, and runs' results merged into their cards' files under a directory
  (``tools/import_session.py``, ``tools/gpu_session.py``).
"""
import collections
import os
import re
from typing import Dict, Iterable, List, Optional, Tuple

from common.compile_cache import has_flag
from common.results import atomic_write_text
from common.envinfo import device_slug     # a card's name as the records' file names spell it

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: the project's autotuning results, one file per jaxlib version and card
RESULTS_DIR = os.path.join(ROOT, "results", "autotune")
LOAD_FLAG = "--xla_gpu_load_autotune_results_from"
DUMP_FLAG = "--xla_gpu_dump_autotune_results_to"
#: a directory where a run writes its autotuning results (tools/gpu_session.py sets it for each row)
DUMP_ENV = "DS2_XLA_AUTOTUNE_DUMP_DIR"
#: a directory read instead of RESULTS_DIR (tools/gpu_session.py sets it: the committed results and its rows')
RESULTS_ENV = "DS2_XLA_AUTOTUNE_RESULTS_DIR"
SUFFIX = ".textproto"       # XLA picks the text format by this extension
#: a run's results under a dump directory: jax-<jaxlib>/<card>.<tag>.textproto (:func:`xla_flags` names them)
DUMP_NAME = re.compile(r"^(jax-[\w.+-]+)/([a-z0-9-]+)\.[\w.+-]+\.textproto$")


def results_file(jaxlib_version: str, card: str, directory: str = RESULTS_DIR) -> str:
    """``directory/jax-<jaxlib_version>/<card>.textproto``, the card as the records spell it
    (``nvidia-h100-80gb-hbm3``)."""
    return os.path.join(directory, "jax-" + jaxlib_version, device_slug(card) + SUFFIX)


def xla_flags(flags: Optional[str], card: str, jaxlib_version: str, tag: str, environ=None,
              directory: Optional[str] = None) -> Tuple[str, Dict[str, object]]:
    """``XLA_FLAGS`` (``flags``, may be empty or None) with the load and dump flags added, and what was chosen.

    Load: :func:`results_file` in ``directory`` (None: ``$DS2_XLA_AUTOTUNE_RESULTS_DIR``, else
    :data:`RESULTS_DIR`) where it exists.  Dump: ``$DS2_XLA_AUTOTUNE_DUMP_DIR/jax-<jaxlib>/<card>.<tag>
    .textproto`` where that variable is set (its folder is made).  A flag ``flags`` already names is kept (yours),
    and a path with whitespace is not added (XLA splits the variable at whitespace).  XLA reads the variable once,
    when JAX starts its backend: call this before the first question about a device.  Returns (flags, info):
    info's ``loaded`` (the file, or None), ``entries`` (how many it holds), ``dump_to`` (or None) and ``note``."""
    environ = os.environ if environ is None else environ
    flags = (flags or "").strip()
    info = {"card": card, "jaxlib": jaxlib_version, "loaded": None, "entries": 0, "dump_to": None, "note": None}
    notes = []
    session_copy = None if directory else environ.get(RESULTS_ENV)
    if session_copy:
        notes.append("read from %s (a device session's copy of results/autotune, with what its earlier rows wrote)"
                     % RESULTS_ENV)
    directory = directory or session_copy or RESULTS_DIR
    path = results_file(jaxlib_version, card, directory)
    if has_flag(flags, LOAD_FLAG):
        notes.append("XLA_FLAGS already names a file to load: kept")
    elif not os.path.isfile(path):
        notes.append("no results for this card and jaxlib in %s" % _shown(os.path.dirname(path)))
    elif re.search(r"\s", path):
        notes.append("not loaded: the path has whitespace, which XLA_FLAGS cannot hold")
    else:
        info["entries"] = count_file(path)
        flags = (flags + " %s=%s" % (LOAD_FLAG, path)).strip()
        info["loaded"] = path
    dump_dir = environ.get(DUMP_ENV)
    if dump_dir and has_flag(flags, DUMP_FLAG):
        notes.append("XLA_FLAGS already names a file to write: kept")
    elif dump_dir:
        target = os.path.join(os.path.abspath(dump_dir), "jax-" + jaxlib_version,
                              "%s.%s%s" % (device_slug(card), re.sub(r"[^\w.+-]+", "_", tag), SUFFIX))
        if re.search(r"\s", target):
            notes.append("not written: %s has whitespace, which XLA_FLAGS cannot hold" % DUMP_ENV)
        else:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            flags = (flags + " %s=%s" % (DUMP_FLAG, target)).strip()
            info["dump_to"] = target
    info["note"] = "; ".join(notes) or None
    return flags, info


def _shown(path: str) -> str:
    """A path relative to the checkout where it lies inside it, else as it is."""
    rel = os.path.relpath(path, ROOT)
    return path if rel == ".." or rel.startswith(".." + os.sep) else rel


def record_section(info: Optional[Dict[str, object]]) -> Optional[Dict[str, object]]:
    """The record's ``options.xla_autotune``, once the run has compiled: :func:`xla_flags`'s info with the file read
    relative to the checkout (where it lies there: a device session's file is outside) and ``written``, the entries
    the run wrote (None: no file written); None for None (no GPU)."""
    if info is None:
        return None
    return dict(info, loaded=info["loaded"] and _shown(info["loaded"]), written=count_file(info["dump_to"]))


# ---- the text format ------------------------------------------------------------------------------------------------
_SPACE = re.compile(r"\s*(?:#[^\n]*\n\s*)*")                         # whitespace and comments
_NAME = re.compile(r"([A-Za-z_][\w.]*)\s*(:?)\s*")                     # a field's name, its colon
_VALUE = re.compile(r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'|[^\s{}]+')   # a scalar: a string or a token


def _blocks(text: str) -> List[Tuple[str, str, bool]]:
    """(name, text, is a block) of each top-level item: ``name { ... }`` blocks and ``name: value`` scalars, in
    order."""
    items, i, n = [], 0, len(text)
    while i < n:
        m = _SPACE.match(text, i)
        i = m.end()
        if i >= n:
            break
        m = _NAME.match(text, i)
        if not m:
            raise ValueError("not an autotuning results file: unexpected %r at character %d" % (text[i:i + 20], i))
        name, start, j = m.group(1), i, m.end()
        if j < n and text[j] == "{":
            depth, quote = 0, None
            while j < n:
                c = text[j]
                if quote:
                    if c == "\\":
                        j += 1
                    elif c == quote:
                        quote = None
                elif c in "\"'":
                    quote = c
                elif c == "{":
                    depth += 1
                elif c == "}":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            if depth:
                raise ValueError("not a whole autotuning results file: %r's braces do not close" % name)
            items.append((name, text[start:j + 1], True))
            i = j + 1
        elif m.group(2):
            v = _VALUE.match(text, j)
            if not v:
                raise ValueError("not a whole autotuning results file: %r has no value" % name)
            items.append((name, text[start:v.end()], False))
            i = v.end()
        else:
            raise ValueError("not an autotuning results file: %r is neither a block nor a field" % name)
    return items


def _key(block: str) -> str:
    """An entry's identity: its ``key { ... }`` block (XLA's current format), else its scalar fields (the older
    ``results { device: ... hlo: ... result { ... } }``), whitespace normalised."""
    inner = block[block.index("{") + 1:block.rindex("}")]
    parts = _blocks(inner)
    keys = [text for name, text, is_block in parts if name == "key" and is_block]
    chosen = keys or [text for _, text, is_block in parts if not is_block]
    return " ".join(" ".join(chosen).split())


def entries(text: str) -> Tuple[List[str], "collections.OrderedDict[str, str]"]:
    """(the file's top-level scalar fields, {key: entry block}) of a text-format autotuning results file.  A key
    held twice keeps its first entry."""
    header, out = [], collections.OrderedDict()
    for _, item, is_block in _blocks(text):
        if is_block:
            out.setdefault(_key(item), item)
        else:
            header.append(" ".join(item.split()))
    return header, out


def count(text: str) -> int:
    """How many entries the file holds."""
    return len(entries(text)[1])


def count_file(path: Optional[str]) -> Optional[int]:
    """How many entries the file at ``path`` holds; None where there is no such file (or no path)."""
    if not path or not os.path.isfile(path):
        return None
    with open(path) as f:
        return count(f.read())


def merge(texts: Iterable[str]) -> str:
    """Several files as one: every entry once (the first file's, where two files hold one key), the scalar fields
    of the first file that has any; files whose scalar fields differ (another format version) are a ValueError."""
    header, merged = None, collections.OrderedDict()
    for text in texts:
        h, e = entries(text)
        if h and header and h != header:
            raise ValueError("autotuning results of two formats (%s; %s): not merged" % (" ".join(header),
                                                                                        " ".join(h)))
        header = header or h
        for k, block in e.items():
            merged.setdefault(k, block)
    return "".join(line + "\n" for line in header or []) + "".join(block.strip() + "\n" for block in merged.values())


# ---- a card's file and runs' results --------------------------------------------------------------------------------
def card_file_of(dumped: str) -> Optional[str]:
    """``jax-<jaxlib>/<card>.textproto``, the card's file for a run's results at ``dumped`` (a path relative to its
    dump directory, ``jax-<jaxlib>/<card>.<tag>.textproto``, with ``/``); None for any other path."""
    m = DUMP_NAME.match(dumped)
    return m and "%s/%s%s" % (m.group(1), m.group(2), SUFFIX)


def merge_file(path: str, members: List[Tuple[str, str]]) -> Tuple[Optional[str], List[str]]:
    """The card's file at ``path`` (where it exists) and runs' results for it ((name, text) each) as one text, every
    entry once, the file's own first; a member that is not a whole results file is left out, named in the second
    value (with why).  None where nothing is left to write."""
    texts, left_out = [], []
    if os.path.isfile(path):
        with open(path) as f:
            texts.append(f.read())
    own = len(texts)                        # the file already here: nothing new without a member
    for name, text in members:
        try:
            entries(text)
        except ValueError as e:
            left_out.append("%s: %s" % (name, e))
            continue
        texts.append(text)
    if len(texts) == own:
        return None, left_out
    try:
        return merge(texts), left_out
    except ValueError as e:
        return None, left_out + ["%s: %s" % (", ".join(n for n, _ in members), e)]


def merge_into(directory: str, members: List[Tuple[str, str]]) -> Tuple[List[str], List[str]]:
    """Runs' results ((name, text) each, the name as under a dump directory: ``jax-<jaxlib>/<card>.<tag>
    .textproto``; any other name is passed over) merged into their cards' files under ``directory``
    (:func:`card_file_of`, :func:`merge_file`), each written whole: (the files written, what was left out and
    why)."""
    by_file = collections.OrderedDict()
    for name, text in members:
        card_file = card_file_of(name)
        if card_file:
            by_file.setdefault(card_file, []).append((name, text))
    written, left_out = [], []
    for card_file, group in sorted(by_file.items()):
        path = os.path.join(directory, *card_file.split("/"))
        text, skipped = merge_file(path, group)
        left_out += skipped
        if text is not None:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            atomic_write_text(path, text)
            written.append(path)
    return written, left_out
