"""Where XLA's compiled programs are kept between runs, and a count of what XLA compiles; no framework import.

A notebook whose step XLA compiles (JAX, Keras on JAX, TensorFlow's ``xla`` variants) compiles one program per
batch shape in every new process.  XLA's persistent caches write each compiled program to disk, and the next run
loads it instead of compiling it again: the same notebook run again, or another preset's run with the same shapes.

* :func:`cache_dir` -- one directory per framework cache and device type, ``ds2-rosetta/<kind>/<platform>-<device>``
  under ``$XDG_CACHE_HOME`` (else ``~/.cache``): a CPU's programs are built for its instruction set, a GPU's for
  its architecture.
* :func:`enable_jax_cache` -- JAX's persistent compilation cache there, every program cached (JAX's default
  caches only those that took a second or more); a ``JAX_COMPILATION_CACHE_DIR`` of the user's own is kept.
* :class:`JaxCompileCounter` -- ``jax.monitoring`` listeners that count the programs XLA builds (``compiles``,
  ``compile_s``; a program loaded from the cache counts as one, with the seconds its load took) and the cache's
  ``cache_hits`` and ``cache_misses``.
* :func:`loop_graphs_xla_flags` -- ``XLA_FLAGS`` with the scans' loops in XLA:GPU's command buffers;
  :func:`has_flag` -- whether a flags string names a flag.
* :func:`tf_xla_flags` -- ``TF_XLA_FLAGS`` with TensorFlow's persistent XLA cache
  (``--tf_xla_persistent_cache_directory``); :func:`cache_files` counts what it holds.

The framework module is an argument (``jax``), never imported here.
"""
import collections
import os
import re
from typing import Optional

#: JAX's monitoring events: one program built (compiled, or loaded from the persistent cache), and the cache's
#: hits and misses.
JAX_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
JAX_CACHE_EVENTS = ("/jax/compilation_cache/cache_hits", "/jax/compilation_cache/cache_misses")

TF_CACHE_FLAG = "--tf_xla_persistent_cache_directory"
#: XLA with LLVM's optimisation of the generated code off: the JAX and Keras notebooks' smoke preset on a CPU
FAST_COMPILE_FLAG = "--xla_backend_optimization_level=0"
#: XLA:GPU's command buffers (CUDA graphs) with while loops and conditionals added to its default list: a scan's
#: loop, body and all, recorded into one graph (the JAX notebook's variant graphs, benchmarks/jax_compile.py)
COMMAND_BUFFER_FLAG = "--xla_gpu_enable_command_buffer"
LOOP_GRAPHS_FLAG = COMMAND_BUFFER_FLAG + "=+WHILE,+CONDITIONAL"


def device_type(platform: str, device: str) -> str:
    """``platform-device`` as a file name: every run of characters other than letters, digits, ``_``, ``.``
    and ``-`` becomes one ``_`` ("cpu", "Intel(R) Xeon(R) Processor" -> "cpu-Intel_R_Xeon_R_Processor")."""
    return re.sub(r"[^\w.-]+", "_", "%s-%s" % (platform, device))


def cache_dir(kind: str, platform: str, device: str, environ=None) -> str:
    """``$XDG_CACHE_HOME`` (else ``~/.cache``)``/ds2-rosetta/<kind>/<platform>-<device>``; kind: "jax" (JAX's
    compilation cache, shared by the JAX and Keras notebooks), "tensorflow-xla" (TensorFlow's XLA cache)."""
    environ = os.environ if environ is None else environ
    home = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(home, "ds2-rosetta", kind, device_type(platform, device))


def enable_jax_cache(jax, platform: str, device: str) -> Optional[str]:
    """Turn on JAX's persistent compilation cache for every program, before the process's first compilation.

    The directory is :func:`cache_dir` ("jax") unless ``jax_compilation_cache_dir`` is already set (by
    ``JAX_COMPILATION_CACHE_DIR``); ``JAX_ENABLE_COMPILATION_CACHE=false`` keeps the cache off.  Returns the
    directory in use, or None when the cache is off."""
    if jax.config.jax_compilation_cache_dir is None:
        jax.config.update("jax_compilation_cache_dir", cache_dir("jax", platform, device))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)   # every program (default: >= 1 s)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)   # of any size
    return jax.config.jax_compilation_cache_dir if jax.config.jax_enable_compilation_cache else None


class JaxCompileCounter(object):
    """What XLA has built in this process since the counter was made: ``counts`` is a Counter of ``compiles``,
    ``compile_s``, ``cache_hits`` and ``cache_misses``; :meth:`since` gives the difference to an earlier
    :meth:`snapshot`.  Listeners stay registered for the life of the process: make one counter per process."""

    def __init__(self, jax):
        self.counts = collections.Counter()
        jax.monitoring.register_event_duration_secs_listener(self._on_duration)
        jax.monitoring.register_event_listener(self._on_event)

    def _on_duration(self, event, seconds, **_):
        if event == JAX_COMPILE_EVENT:
            self.counts["compiles"] += 1
            self.counts["compile_s"] += seconds

    def _on_event(self, event, **_):
        if event in JAX_CACHE_EVENTS:
            self.counts[event.rsplit("/", 1)[1]] += 1

    def snapshot(self) -> collections.Counter:
        return self.counts.copy()

    def since(self, snapshot: Optional[dict] = None) -> dict:
        """compiles, compile_s, cache_hits and cache_misses since ``snapshot`` (None: since the counter was
        made), zeros included."""
        snapshot = snapshot or {}
        keys = ("compiles", "compile_s", "cache_hits", "cache_misses")
        return collections.OrderedDict((k, self.counts[k] - snapshot.get(k, 0)) for k in keys)


def tf_xla_flags(flags: Optional[str], directory: str) -> str:
    """``TF_XLA_FLAGS`` (``flags``, may be empty or None) with ``--tf_xla_persistent_cache_directory=directory``
    added.  A persistent cache directory already named in ``flags`` is kept, and a directory with whitespace or
    quotes in its path is not added (TensorFlow splits the variable at whitespace): :func:`tf_xla_cache_dir`
    then says which directory, if any, is in use.  TensorFlow reads the variable once, when XLA first needs
    its flags: set it before the first XLA compilation."""
    flags = flags or ""
    if tf_xla_cache_dir(flags) is not None or re.search(r"[\s'\"]", directory):
        return flags
    return (flags.strip() + " " if flags.strip() else "") + "%s=%s" % (TF_CACHE_FLAG, directory)


def tf_xla_cache_dir(flags: Optional[str]) -> Optional[str]:
    """The persistent cache directory ``TF_XLA_FLAGS`` names (the last one), or None."""
    found = None
    for f in (flags or "").split():
        name, _, value = f.partition("=")
        if name == TF_CACHE_FLAG:
            found = value or None
    return found


def cache_files(directory: Optional[str]) -> int:
    """How many files ``directory`` holds (0 when it does not exist or is None): TensorFlow writes one file per
    program it compiles and caches."""
    if not directory or not os.path.isdir(directory):
        return 0
    return sum(1 for name in os.listdir(directory) if os.path.isfile(os.path.join(directory, name)))


def fast_compile_xla_flags(flags: Optional[str]) -> str:
    """``XLA_FLAGS`` (``flags``, may be empty or None) with :data:`FAST_COMPILE_FLAG` added, unless it already names
    the optimisation level (the user's is kept).  XLA reads the variable once, when JAX starts its backend."""
    flags = flags or ""
    if "xla_backend_optimization_level" in flags:
        return flags
    return (flags.strip() + " " + FAST_COMPILE_FLAG).strip()


def has_flag(flags: Optional[str], name: str) -> bool:
    """Whether the flags string ``flags`` (``XLA_FLAGS``: whitespace-separated ``--name=value``) names ``name``."""
    return any(f.partition("=")[0] == name for f in (flags or "").split())


def loop_graphs_xla_flags(flags: Optional[str]) -> str:
    """``XLA_FLAGS`` (``flags``, may be empty or None) with :data:`LOOP_GRAPHS_FLAG` added; a ``ValueError`` (one
    line) where ``flags`` already names the command buffers' contents: the variant would not be what it says.  XLA
    reads the variable once, when JAX starts its backend."""
    flags = (flags or "").strip()
    if has_flag(flags, COMMAND_BUFFER_FLAG):
        raise ValueError("variant 'graphs' sets %s, which XLA_FLAGS names already (%s): leave it out of XLA_FLAGS"
                         % (LOOP_GRAPHS_FLAG, flags))
    return (flags + " " + LOOP_GRAPHS_FLAG).strip()
