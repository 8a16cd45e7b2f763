"""common/compile_cache.py: where XLA's compiled programs are kept, and the counts of what XLA compiles (no
framework here: a stand-in for the few parts of ``jax`` the helpers touch)."""
import os

import pytest

from common import compile_cache
from common.compile_cache import (JAX_CACHE_EVENTS, JAX_COMPILE_EVENT, JaxCompileCounter, cache_dir, cache_files,
                                  device_type, enable_jax_cache, tf_xla_cache_dir, tf_xla_flags)


class FakeConfig:
    def __init__(self, **values):
        self.__dict__.update(dict(jax_compilation_cache_dir=None, jax_enable_compilation_cache=True), **values)

    def update(self, name, value):
        setattr(self, name, value)


class FakeMonitoring:
    def __init__(self):
        self.durations, self.events = [], []

    def register_event_duration_secs_listener(self, fn):
        self.durations.append(fn)

    def register_event_listener(self, fn):
        self.events.append(fn)


class FakeJax:
    def __init__(self, **config):
        self.config = FakeConfig(**config)
        self.monitoring = FakeMonitoring()


def test_cache_dir_is_one_directory_per_kind_and_device(tmp_path):
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    assert device_type("cpu", "Intel(R) Xeon(R) Processor") == "cpu-Intel_R_Xeon_R_Processor"
    assert cache_dir("jax", "gpu", "NVIDIA H100 80GB HBM3", env) == os.path.join(
        str(tmp_path), "ds2-rosetta", "jax", "gpu-NVIDIA_H100_80GB_HBM3")
    assert cache_dir("tensorflow-xla", "cpu", "x", {}) == os.path.join(
        os.path.expanduser("~"), ".cache", "ds2-rosetta", "tensorflow-xla", "cpu-x")


def test_enable_jax_cache_caches_every_program_and_keeps_a_users_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    jax = FakeJax()
    assert enable_jax_cache(jax, "cpu", "Some CPU") == os.path.join(str(tmp_path), "ds2-rosetta", "jax", "cpu-Some_CPU")
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0
    assert jax.config.jax_persistent_cache_min_entry_size_bytes == -1
    mine = FakeJax(jax_compilation_cache_dir="/my/cache")               # JAX_COMPILATION_CACHE_DIR=/my/cache
    assert enable_jax_cache(mine, "cpu", "Some CPU") == "/my/cache"
    off = FakeJax(jax_enable_compilation_cache=False)                   # JAX_ENABLE_COMPILATION_CACHE=false
    assert enable_jax_cache(off, "cpu", "Some CPU") is None


def test_jax_counter_counts_programs_and_cache_use():
    jax = FakeJax()
    counter = JaxCompileCounter(jax)
    (duration,), (event,) = jax.monitoring.durations, jax.monitoring.events
    duration(JAX_COMPILE_EVENT, 2.5)
    duration("/jax/core/compile/jaxpr_trace_duration", 9.0)              # tracing is not a compilation
    event(JAX_CACHE_EVENTS[1])
    before = counter.snapshot()
    duration(JAX_COMPILE_EVENT, 0.25, fun_name="step")                   # a load from the cache counts as one
    event(JAX_CACHE_EVENTS[0])
    event("/jax/something/else")
    assert counter.since(before) == {"compiles": 1, "compile_s": 0.25, "cache_hits": 1, "cache_misses": 0}
    assert counter.since() == {"compiles": 2, "compile_s": 2.75, "cache_hits": 1, "cache_misses": 1}
    assert JaxCompileCounter(FakeJax()).since() == {"compiles": 0, "compile_s": 0, "cache_hits": 0, "cache_misses": 0}


def test_tf_xla_flags_add_the_persistent_cache_once():
    flag = "--tf_xla_persistent_cache_directory"
    assert tf_xla_flags(None, "/c/tf") == flag + "=/c/tf"
    assert tf_xla_flags(" --tf_xla_auto_jit=2 ", "/c/tf") == "--tf_xla_auto_jit=2 " + flag + "=/c/tf"
    assert tf_xla_cache_dir(tf_xla_flags("--tf_xla_auto_jit=2", "/c/tf")) == "/c/tf"
    mine = "%s=/mine --tf_xla_auto_jit=2" % flag                          # the user's own directory is kept
    assert tf_xla_flags(mine, "/c/tf") == mine and tf_xla_cache_dir(mine) == "/mine"
    assert tf_xla_flags("", "/my cache/tf") == "" and tf_xla_cache_dir("") is None   # TF splits at whitespace


def test_fast_compile_flag_is_added_once_and_a_users_level_kept():
    assert compile_cache.fast_compile_xla_flags(None) == "--xla_backend_optimization_level=0"
    assert compile_cache.fast_compile_xla_flags(" --xla_dump_to=/tmp/d ") == \
        "--xla_dump_to=/tmp/d --xla_backend_optimization_level=0"
    mine = "--xla_backend_optimization_level=2"
    assert compile_cache.fast_compile_xla_flags(mine) == mine
    once = compile_cache.fast_compile_xla_flags(None)
    assert compile_cache.fast_compile_xla_flags(once) == once


def test_loop_graphs_flag_is_added_and_a_users_command_buffers_refused():
    assert compile_cache.loop_graphs_xla_flags(None) == "--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL"
    assert compile_cache.loop_graphs_xla_flags(" --xla_dump_to=/tmp/d ") == \
        "--xla_dump_to=/tmp/d --xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL"
    for mine in ("--xla_gpu_enable_command_buffer=", "--xla_dump_to=/d --xla_gpu_enable_command_buffer=FUSION"):
        with pytest.raises(ValueError, match="XLA_FLAGS names already") as e:
            compile_cache.loop_graphs_xla_flags(mine)
        assert "\n" not in str(e.value)
    assert compile_cache.loop_graphs_xla_flags("--xla_gpu_enable_command_buffer_x=1").endswith("+CONDITIONAL")


def test_cache_files_counts_files(tmp_path):
    assert cache_files(None) == 0 and cache_files(str(tmp_path / "missing")) == 0
    (tmp_path / "a.pb").write_bytes(b"x")
    (tmp_path / "b.pb").write_bytes(b"y")
    (tmp_path / "sub").mkdir()
    assert cache_files(str(tmp_path)) == 2


def test_the_module_imports_no_framework():
    with open(compile_cache.__file__) as f:
        source = f.read()
    assert not any(line.startswith(("import jax", "import tensorflow", "from jax", "from tensorflow"))
                   for line in source.splitlines())
