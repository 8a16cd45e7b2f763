"""benchmarks/jax_compile.py on the CPU: the JAX notebook's training step compiled for the smoke preset's 2-s and 8-s
batches (the first alone, then the other on the thread pool), in a child process with XLA's persistent cache off,
and the JSON it writes: a check of the script a GPU session runs (docs/gpus.md), not a measurement.  The
autotuning settings (``dump``, ``loaded``) and ``graphs`` do something on a GPU only: here, their flags, that XLA
takes them, and the refusal of ``loaded`` without ``dump`` (and of ``perfusion_read`` without ``perfusion``);
``bidir2``, the notebook's variant, runs here too (as ``bidir2_graphs``: its model with ``graphs``'s flag)."""
import importlib.util
import json
import os
import subprocess

import pytest

from tests.conftest import ROOT, selected_targets

pytestmark = pytest.mark.skipif("jax" not in selected_targets(), reason="jax is not among DS2_TEST_FRAMEWORKS")
JAX_PYTHON = os.path.join(ROOT, ".venvs", "jax-cpu", "bin", "python")


def load_jax_compile():
    """benchmarks/jax_compile.py as a module, for its functions (no JAX import: that happens in its child process)."""
    spec = importlib.util.spec_from_file_location("jax_compile", os.path.join(ROOT, "benchmarks", "jax_compile.py"))
    jc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(jc)
    return jc


def test_jax_compile_smoke_writes_the_settings_figures(tmp_path):
    if not os.path.exists(JAX_PYTHON):
        pytest.fail("no JAX CPU environment at %s: make it with `python run_all.py --setup-only --frameworks jax`"
                    % JAX_PYTHON)
    out = tmp_path / "jax_compile.json"
    proc = subprocess.run([JAX_PYTHON, os.path.join(ROOT, "benchmarks", "jax_compile.py"), "--preset", "smoke",
                           "--lengths", "2,8", "--settings", "first,loaded,bidir2_graphs", "--steps", "1",
                           "--out", str(out)], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    report = json.loads(out.read_text())
    first = report["results"]["first"]
    assert first["platform"] == "cpu" and first["programs"] == 2 and first["lengths_s"] == [2, 8]
    assert first["compiles"] >= 2 and 0 < first["first_s"] <= first["compile_wall_s"]
    assert first["compile_s_summed"] > 0 and sorted(first["step_ms_median"]) == ["2", "8"]
    assert all(ms > 0 for ms in first["step_ms_median"].values())
    assert "first " in proc.stdout and "2 programs" in proc.stdout
    # `loaded` reads what `dump` wrote; without it, it is skipped with the reason, and nothing is started for it
    assert report["results"]["loaded"] == {"skipped": "no autotuning results to load: `dump` did not run before it"}
    # `bidir2_graphs`, one process for two checks: XLA takes `graphs`'s flag (a flag it does not know stops JAX at its
    # start; on a CPU it changes nothing), and a variant's setting runs the notebook's model in that variant
    # (section 4) on the same shapes
    graphs = report["results"]["bidir2_graphs"]
    assert "--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL" in graphs["xla_flags"].split()
    assert first["variant"] == "" and graphs["variant"] == "bidir2"
    assert sorted(graphs["step_ms_median"]) == ["2", "8"]


def test_the_autotuning_settings_name_the_file_one_writes_and_the_other_reads(tmp_path):
    jc = load_jax_compile()
    path = str(tmp_path / jc.AUTOTUNE_FILE)
    assert jc.setting_flags("dump", path) == "--xla_gpu_dump_autotune_results_to=" + path
    assert jc.setting_flags("loaded", path) == "--xla_gpu_load_autotune_results_from=" + path
    assert jc.setting_flags("threads", path) == ""
    # a card's committed results, read first by the settings that compare steps, not by those that measure autotuning
    card = str(tmp_path / "card.textproto")
    load = "--xla_gpu_load_autotune_results_from=" + card
    assert jc.setting_flags("threads", path, card) == jc.setting_flags("bidir2", path, card) == load
    graphs = jc.setting_flags("graphs", path, card).split()
    assert graphs == ["--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL", load]
    assert jc.setting_flags("bidir2_graphs", path, card).split() == graphs          # graphs's flag, bidir2's model
    assert jc.SETTINGS["bidir2_graphs"]["variant"] == jc.SETTINGS["bidir2"]["variant"] == "bidir2"
    assert jc.setting_flags("dump", path, card) == jc.setting_flags("dump", path)
    assert jc.setting_flags("autotune0", path, card) == "--xla_gpu_autotune_level=0"
    folder = str(tmp_path / jc.PER_FUSION_DIR)        # the two perfusion settings: the folder, never the card's file
    assert jc.setting_flags("perfusion", path, card, folder) == jc.setting_flags("perfusion_read", path, card, folder) \
        == "--xla_gpu_per_fusion_autotune_cache_dir=" + folder
    (tmp_path / jc.PER_FUSION_DIR).mkdir()
    (tmp_path / jc.PER_FUSION_DIR / "b.textproto").write_text("triton { block_m: 64 }\n")
    (tmp_path / jc.PER_FUSION_DIR / "a.textproto").write_text("gemm { algorithm: 3 }\n")
    assert jc.per_fusion_summary(folder) == {"files": 2, "bytes": 45, "sample": {"name": "a.textproto",
                                                                                   "text": "gemm { algorithm: 3 }\n"}}
    (tmp_path / jc.AUTOTUNE_FILE).write_text("version: 3\nresults {\n  device: \"x\"\n}\nresults {\n}\n")
    summary = jc.autotune_summary(path)
    assert summary["results"] == 2 and summary["bytes"] == len(summary["textproto"]) > 0


def test_a_missing_autotune_results_file_is_refused_before_anything_runs(tmp_path, capsys):
    jc = load_jax_compile()
    with pytest.raises(SystemExit) as stop:
        jc.main(["--autotune-results", str(tmp_path / "none.textproto"), "--out", str(tmp_path / "out.json")])
    assert stop.value.code == 2 and not (tmp_path / "out.json").exists()
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "jax_compile.py: error: --autotune-results: no file %s" % (tmp_path / "none.textproto"))


def test_perfusion_read_without_perfusion_is_skipped_with_its_reason_and_starts_nothing(tmp_path):
    jc = load_jax_compile()
    out = tmp_path / "out.json"
    assert jc.main(["--settings", "perfusion_read", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["results"] == {
        "perfusion_read": {"skipped": "nothing to read: `perfusion` did not run before it"}}
