"""XLA:GPU's autotuning results kept per card and jaxlib (common/xla_autotune.py): the flags the JAX and Keras-on-JAX
notebooks set before JAX starts, the text format's entries and their merge, the committed files, the notebooks'
settings cells on a (faked) GPU, a device session's row that writes them and tools/import_session.py merging them."""
import glob
import importlib.metadata
import io
import json
import os
import subprocess
import sys
import tarfile
import types

import pytest

from common import xla_autotune
from common.envinfo import device_slug
from tests.conftest import ROOT
from tests.notebook_cells import Touched, settings_until_framework, tagged_source

CARD = "NVIDIA H100 80GB HBM3"
#: XLA's current format (jaxlib 0.11): entries keyed by device, fusion and code generator
NEW = """entries {
  key {
    target {
      device: "699b92c0fb30cb16"
      hlo_fingerprint: "004ddb21fa3fcdd6a9b5973d5b3758e9"
    }
    environment { codegen_version: "fe9062d0fff82a66" }
  }
  value {
    optimal_config { backend: NATIVE_EMITTER backend_config { native_emitter { } } }
    optimal_backend_version: "v1"
  }
}
entries {
  key {
    target { device: "699b92c0fb30cb16" hlo_fingerprint: "0093de40298baf2f4e57ed436275308b" }
    environment { codegen_version: "fe9062d0fff82a66" }
  }
  value { optimal_config { backend: BLOCK_LEVEL_EMITTER } optimal_backend_version: "a{b}c" }
}
"""
#: the older format: a version field, then results keyed by device and HLO
OLD = 'version: 3\nresults {\n  device: "sm_9.0"\n  hlo: "f{x}"\n  result { gemm { algorithm: 5 } }\n}\n'


def entry(fingerprint, backend="NATIVE_EMITTER"):
    return ('entries {\n  key {\n    target { device: "d" hlo_fingerprint: "%s" }\n  }\n'
            '  value { optimal_config { backend: %s } }\n}\n' % (fingerprint, backend))


# ---- the text format ------------------------------------------------------------------------------------------------
def test_entries_are_keyed_by_their_key_block_or_the_older_formats_fields():
    header, found = xla_autotune.entries(NEW)
    assert header == [] and len(found) == 2 and all("hlo_fingerprint" in k for k in found)
    assert xla_autotune.count(NEW) == 2
    header, found = xla_autotune.entries(OLD)
    assert header == ["version: 3"] and list(found) == ['device: "sm_9.0" hlo: "f{x}"']


def test_merge_keeps_every_entry_once_the_first_files_own_first():
    a, b = entry("1") + entry("2", "A"), entry("2", "B") + entry("3")
    merged = xla_autotune.merge([a, b])
    assert xla_autotune.count(merged) == 3
    assert "backend: A" in merged and "backend: B" not in merged        # key 2: the first file's entry
    assert xla_autotune.merge([NEW]) == NEW and xla_autotune.merge([NEW, NEW]) == NEW
    assert xla_autotune.merge([OLD, OLD.replace("algorithm: 5", "algorithm: 7")]) == OLD
    with pytest.raises(ValueError, match="two formats"):
        xla_autotune.merge([OLD, OLD.replace("version: 3", "version: 4")])


@pytest.mark.parametrize("broken", [NEW[:len(NEW) // 2], NEW.replace('"v1"', '"v1'), "entries ] {", "version:"],
                         ids=["cut", "unterminated string", "not a field", "no value"])
def test_a_file_that_is_not_whole_is_a_value_error(broken):
    """Two compilations writing one file at once, or a call stopped mid-write, leave such a file: never loaded."""
    with pytest.raises(ValueError):
        xla_autotune.entries(broken)


def test_every_committed_file_is_whole_named_for_its_card_and_has_unique_keys():
    files = sorted(glob.glob(os.path.join(xla_autotune.RESULTS_DIR, "jax-*", "*" + xla_autotune.SUFFIX)))
    assert files, "results/autotune holds the H100 session's file"
    for path in files:
        with open(path) as f:
            text = f.read()
        header, found = xla_autotune.entries(text)
        assert found and xla_autotune.merge([text]) == text, path      # no key twice (XLA refuses such a file)
        assert os.path.basename(path) == device_slug(os.path.basename(path)[:-len(xla_autotune.SUFFIX)]) \
            + xla_autotune.SUFFIX


# ---- the flags ------------------------------------------------------------------------------------------------------
def test_flags_load_the_cards_file_where_it_exists_and_keep_yours(tmp_path):
    path = xla_autotune.results_file("0.11.2", CARD, str(tmp_path))
    assert path == str(tmp_path / "jax-0.11.2" / "nvidia-h100-80gb-hbm3.textproto")
    flags, info = xla_autotune.xla_flags("--xla_dump_to=/x", CARD, "0.11.2", "jax-fp32", environ={},
                                         directory=str(tmp_path))
    assert flags == "--xla_dump_to=/x" and info["loaded"] is None and "no results for this card" in info["note"]
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:
        f.write(NEW)
    flags, info = xla_autotune.xla_flags(None, CARD, "0.11.2", "jax-fp32", environ={}, directory=str(tmp_path))
    assert flags == "--xla_gpu_load_autotune_results_from=" + path and info["loaded"] == path
    assert info["entries"] == 2 and info["dump_to"] is None
    assert xla_autotune.xla_flags(None, "NVIDIA H200", "0.11.2", "t", environ={}, directory=str(tmp_path))[0] == ""
    assert xla_autotune.xla_flags(None, CARD, "0.10.2", "t", environ={}, directory=str(tmp_path))[0] == ""
    mine = "--xla_gpu_load_autotune_results_from=/mine.textproto"
    flags, info = xla_autotune.xla_flags(mine, CARD, "0.11.2", "t", environ={}, directory=str(tmp_path))
    assert flags == mine and info["loaded"] is None and "kept" in info["note"]
    # a device session's copy, named by DS2_XLA_AUTOTUNE_RESULTS_DIR, is read instead of results/autotune
    flags, info = xla_autotune.xla_flags(None, CARD, "0.11.2", "t", environ={xla_autotune.RESULTS_ENV: str(tmp_path)})
    assert flags == "--xla_gpu_load_autotune_results_from=" + path and "a device session's copy" in info["note"]
    assert xla_autotune.record_section(info)["loaded"] == path                         # outside the checkout: as is
    flags, info = xla_autotune.xla_flags(None, CARD, "0.11.2", "t", environ={})
    assert info["loaded"] == xla_autotune.results_file("0.11.2", CARD) and info["note"] is None


def test_flags_write_this_runs_results_where_a_session_asks(tmp_path):
    dump = tmp_path / "dump"
    flags, info = xla_autotune.xla_flags(None, CARD, "0.11.2", "keras-jax-bf16",
                                         environ={xla_autotune.DUMP_ENV: str(dump)}, directory=str(tmp_path))
    target = dump / "jax-0.11.2" / "nvidia-h100-80gb-hbm3.keras-jax-bf16.textproto"
    assert flags == "--xla_gpu_dump_autotune_results_to=%s" % target and info["dump_to"] == str(target)
    assert target.parent.is_dir() and not target.exists()                # XLA writes it
    mine = "--xla_gpu_dump_autotune_results_to=/mine.textproto"
    assert xla_autotune.xla_flags(mine, CARD, "0.11.2", "t", environ={xla_autotune.DUMP_ENV: str(dump)},
                                  directory=str(tmp_path))[0] == mine
    flags, info = xla_autotune.xla_flags(None, CARD, "0.11.2", "t", environ={xla_autotune.DUMP_ENV: "/a b"},
                                         directory=str(tmp_path))
    assert flags == "" and "whitespace" in info["note"]


def test_the_record_says_which_file_was_read_relative_to_the_checkout_and_what_the_run_wrote(tmp_path):
    assert xla_autotune.record_section(None) is None                     # no GPU: nothing to say
    committed = xla_autotune.results_file("0.11.2", CARD)
    written = tmp_path / "out.textproto"
    written.write_text(NEW)
    info = {"card": CARD, "loaded": committed, "entries": 378, "dump_to": str(written), "note": None}
    section = xla_autotune.record_section(info)
    assert section == dict(info, loaded="results/autotune/jax-0.11.2/nvidia-h100-80gb-hbm3.textproto", written=2)
    assert xla_autotune.record_section(dict(info, loaded=None, dump_to=None)) == dict(info, loaded=None,
                                                                                       dump_to=None, written=None)


# ---- the notebooks' settings cells on a faked GPU ----------------------------------------------------------------
def settings(notebook, **overrides):
    """The settings cell up to the framework (tests/notebook_cells.py); the variables it set."""
    environ, stop = settings_until_framework(notebook, **overrides)
    assert isinstance(stop, Touched), repr(stop)
    return environ


@pytest.mark.parametrize("notebook", ["JAX_Flax_DS2.ipynb", "Keras3_DS2.ipynb"])
def test_the_jax_notebooks_read_the_cards_results_on_a_gpu_and_write_them_where_a_session_asks(
        notebook, monkeypatch, tmp_path):
    """On the H100 with jaxlib 0.11.2 the committed file is read before JAX starts; DS2_XLA_AUTOTUNE_DUMP_DIR adds
    the file this row writes; on a CPU (device='cpu') neither."""
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.11.2")       # Keras: jaxlib's version
    monkeypatch.setenv(xla_autotune.DUMP_ENV, str(tmp_path))
    gpu = dict(nvidia_smi_gpus=lambda: [{"name": CARD}], jaxlib=types.SimpleNamespace(__version__="0.11.2"),
               preset="quick", precision="bf16", backend="jax", target="keras-jax" if "Keras" in notebook else "jax")
    flags = settings(notebook, **gpu)["XLA_FLAGS"].split()
    committed = xla_autotune.results_file("0.11.2", CARD)
    assert os.path.isfile(committed)
    assert flags == ["--xla_gpu_load_autotune_results_from=" + committed, "--xla_gpu_dump_autotune_results_to="
                     + str(tmp_path / "jax-0.11.2" / ("nvidia-h100-80gb-hbm3.%s-bf16.textproto" % gpu["target"]))]
    assert "XLA_FLAGS" not in settings(notebook, **dict(gpu, device="cpu", preset="quick"))


def test_the_jax_notebook_compiles_one_program_at_a_time_where_it_writes_the_results():
    """Each compilation writes the whole file: two at once could mix it."""
    source = tagged_source("JAX_Flax_DS2.ipynb", "rosetta:warmup")
    line = next(l for l in source.splitlines() if l.startswith("COMPILE_THREADS ="))
    for on_gpu, autotune, threads in ((True, None, os.cpu_count()), (True, {"dump_to": None}, os.cpu_count()),
                                      (True, {"dump_to": "/f"}, 1), (False, None, 1)):
        ns = {"os": os, "on_gpu": on_gpu, "autotune": autotune}
        exec(line, ns)
        assert ns["COMPILE_THREADS"] == threads, (on_gpu, autotune)


# ---- a device session's row, and the import ---------------------------------------------------------------------
def test_a_session_reads_the_cards_results_and_a_rows_second_run_reads_what_the_first_wrote(tmp_path, monkeypatch):
    """The session's copy of results/autotune (the committed file of this card only) is what its rows read; a row's
    first run has the dump directory set, and its results go into the tarball and are merged into the copy after it
    (the second run writes none); every run compiles with a JAX cache of its own; the second run of a
    row is estimated from the first and named as such; the tarball holds both runs' records, and the import keeps
    the newest."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import gpu_session

    committed = tmp_path / "committed"
    xla_autotune_file = committed / "jax-0.11.2" / "nvidia-h100-80gb-hbm3.textproto"
    xla_autotune_file.parent.mkdir(parents=True)
    xla_autotune_file.write_text(entry("1", "KEPT"))
    (committed / "jax-0.11.2" / "nvidia-h200.textproto").write_text(entry("9"))       # another card: not copied
    scratch = tmp_path / "scratch"
    copy = gpu_session.session_autotune(CARD, str(scratch), directory=str(committed))
    assert sorted(os.listdir(os.path.join(copy, "jax-0.11.2"))) == ["nvidia-h100-80gb-hbm3.textproto"]
    card_copy = os.path.join(copy, "jax-0.11.2", "nvidia-h100-80gb-hbm3.textproto")
    seen = []

    def fake_run(cmd, env, log, seconds, marker):        # a JAX row: what it read, its record, its results
        results_dir = cmd[cmd.index("--results-dir") + 1]
        with open(card_copy) as f:
            seen.append({"read": xla_autotune.count(f.read()), "cache": env["JAX_COMPILATION_CACHE_DIR"],
                         "results": env[xla_autotune.RESULTS_ENV], "dump": env.get(xla_autotune.DUMP_ENV)})
        if env.get(xla_autotune.DUMP_ENV):
            path = os.path.join(env[xla_autotune.DUMP_ENV], "jax-0.11.2", "nvidia-h100-80gb-hbm3.jax-fp32.textproto")
            os.makedirs(os.path.dirname(path))
            with open(path, "w") as f:
                f.write(entry("1", "NEW") + entry(str(len(seen) + 1)))
        os.makedirs(os.path.join(results_dir, "records"))
        with open(os.path.join(results_dir, "records", "jax_smoke_fp32_bs8_cpu.json"), "w") as f:
            json.dump({"target": "jax", "status": "ok", "run": {"wall_s": 1.0, "n": len(seen)},
                       "timing": {"warmup_s": 200.0}, "options": {"skipped": gpu_session.SKIP.split(",")}}, f)
        with open(log, "w") as f:
            f.write("run_all.py: done\n")
        return 0, False

    monkeypatch.setattr(gpu_session, "run_until", fake_run)
    out = gpu_session.Out(str(tmp_path / "out"))
    args = gpu_session.build_parser().parse_args(["--dry-run", "--out", str(tmp_path / "out"), "--rows",
                                                  "jax:fp32,jax:fp32", "--estimate", "pytorch:fp32=1"])
    args.preset = "smoke"
    env = {gpu_session.MARKER: "x", xla_autotune.RESULTS_ENV: copy}
    clock = gpu_session.Deadline(1000)
    runs = []
    assert [gpu_session.run_row(args, "jax", "fp32", out, clock, env, str(scratch), CARD, runs)
            for _ in range(2)] == ["ok", "ok"]
    assert [s["read"] for s in seen] == [1, 2]        # the committed entry; then with the first run's new one
    assert seen[0]["cache"] != seen[1]["cache"] and all(s["results"] == copy for s in seen)
    assert [s["dump"] for s in seen] == [str(scratch / "jax_fp32" / "autotune"), None]   # run 2 compiles on threads
    assert "KEPT" in open(card_copy).read() and "NEW" not in open(card_copy).read()
    with open(out.path["summary.tsv"]) as f:
        lines = f.read().splitlines()[1:]
    wall = runs[0]["wall_s"]
    assert lines[1].split("\t")[-2] == str(int(-(-(1.15 * max(0.0, wall - 0.85 * min(200.0, wall)) + 20) // 1)))
    assert lines[1].split("\t")[-1] == "run 2" and lines[0].split("\t")[-1] == ""
    log = open(out.path["session.log"]).read()
    assert "jax fp32 (run 2): started, estimate" in log and "this session's first run" in log
    assert "jax fp32: autotuning results jax-0.11.2/nvidia-h100-80gb-hbm3.textproto: 2 entries" in log
    with tarfile.open(out.path["session.tar"]) as t:
        assert t.getnames().count("records/jax_smoke_fp32_bs8_cpu.json") == 2
        assert t.getnames().count("autotune/jax-0.11.2/nvidia-h100-80gb-hbm3.jax-fp32.textproto") == 1
    res = tmp_path / "res"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "import_session.py"), out.path["session.tar"],
                           "--results-dir", str(res)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((res / "records" / "jax_smoke_fp32_bs8_cpu.json").read_text())["run"]["n"] == 2
    args.no_autotune_dump = True                      # a call after the results were imported: none written ...
    monkeypatch.setattr(gpu_session, "first_on_card", lambda *a: False)     # (a committed run wrote the card's)
    assert gpu_session.run_row(args, "jax", "bf16", out, clock, env, str(scratch), CARD) == "ok"
    assert seen[-1]["dump"] is None and seen[-1]["read"] == 2
    monkeypatch.setattr(gpu_session, "first_on_card", lambda *a: True)      # ... but for a row the card has none for
    assert gpu_session.run_row(args, "jax", "tf32", out, clock, env, str(scratch), CARD) == "ok"
    assert seen[-1]["dump"] == str(scratch / "jax_tf32" / "autotune")


def test_a_row_twice_only_where_it_runs_xla_and_the_default_rows_run_the_first_jax_row_twice():
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import gpu_session

    assert gpu_session.rows_list("jax:fp32,keras-jax:bf16,jax:fp32,keras-jax:bf16") == [
        ("jax", "fp32"), ("keras-jax", "bf16"), ("jax", "fp32"), ("keras-jax", "bf16")]
    for text, said in (("pytorch:fp32,pytorch:fp32", "names pytorch:fp32 twice"),
                       ("keras-torch:fp32,keras-torch:fp32", "twice"), ("jax:bf16,jax:bf16,jax:bf16", "3 times")):
        with pytest.raises(Exception, match=said):
            gpu_session.rows_list(text)
    rows = gpu_session.rows_list("pytorch:fp32,jax+hoist:fp32,keras-jax:tf32,jax:fp32")
    assert gpu_session.with_repeat(rows) == rows[:3] + [("keras-jax", "tf32")] + rows[3:]     # not a variant
    assert gpu_session.with_repeat(rows[:1]) == rows[:1]                              # no JAX row
    twice = gpu_session.rows_list("jax:fp32,jax:bf16,jax:bf16")
    assert gpu_session.with_repeat(twice) == twice                                    # named twice already
    assert gpu_session.repeat_estimate({"wall_s": 300.0, "warmup_s": 200.0}) == (
        int(-(-(1.15 * (300 - 170) + 20) // 1)), "this session's first run: 300 s, warm-up 200 s, taken at 15 %")
    assert gpu_session.repeat_estimate({"wall_s": 300.0}) is None                     # no record: the records' figure


def _tarball(path, members):
    with tarfile.open(str(path), "w") as t:
        for name, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))


def test_import_session_merges_the_rows_results_into_the_cards_file(tmp_path):
    record = {"target": "jax", "run": {"executed_notebook": "/tmp/x/jax.ipynb"}, "status": "ok"}
    res = tmp_path / "res"
    card_file = res / "autotune" / "jax-0.11.2" / "nvidia-h100-80gb-hbm3.textproto"
    card_file.parent.mkdir(parents=True)
    card_file.write_text(entry("1", "KEPT"))
    tar = tmp_path / "session.tar"
    _tarball(tar, {"records/jax.json": json.dumps(record),
                   "autotune/jax-0.11.2/nvidia-h100-80gb-hbm3.jax-fp32.textproto": entry("1", "NEW") + entry("2"),
                   "autotune/jax-0.11.2/nvidia-h100-80gb-hbm3.keras-jax-fp32.textproto": entry("3"),
                   "autotune/jax-0.11.2/nvidia-h100-80gb-hbm3.jax-bf16.textproto": entry("4")[:30]})
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "import_session.py"), str(tar),
                           "--results-dir", str(res)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    merged = card_file.read_text()
    assert xla_autotune.count(merged) == 3 and "KEPT" in merged and "NEW" not in merged
    assert "jax-bf16.textproto" in proc.stderr and "left out" in proc.stderr and "keras-jax" not in proc.stderr
    assert os.path.relpath(str(card_file), ROOT) in proc.stdout.split()
    _tarball(tar, {"records/jax.json": json.dumps(record), "autotune/nvidia-h100.textproto": NEW})
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "import_session.py"), str(tar),
                           "--results-dir", str(tmp_path / "other")], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
    assert proc.returncode == 2 and "autotune/nvidia-h100.textproto" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "other").exists()
