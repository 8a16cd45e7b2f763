"""``run_all.py --migrate`` (runner/migrate.py) and its report, on a fake framework notebook
(tests/fixtures/numpy_ds2.ipynb: the NumPy reference as the model, the DS2 notebooks' cell tags and
export) run in the runner's own interpreter; and the float64 control's place in the runner and the report.
No framework notebook runs here (tests/test_export_records.py does that on the session's smoke records)."""
import ast
import builtins
import copy
import os

import nbformat
import numpy as np
import pytest

from common import exports, results
from common.spec import get_preset
from runner import cli
from runner.envs import framework_envs
from runner.run import execute, staging
from runner import migrate
from runner.report import render
from runner.report import checks
from runner.report import tables
from runner.run.targets import TARGETS, Target, control_precision_error
from tests.conftest import ROOT, dead_runners_claim
from tests.test_report import fixture_record

FIXTURE = "../tests/fixtures/numpy_ds2.ipynb"      # relative to notebooks/, as Target expects
FIXTURE_PATH = os.path.join(ROOT, "tests", "fixtures", "numpy_ds2.ipynb")
SMOKE = get_preset("smoke")


def fake(name, flavor="a", mode="ok"):
    return Target(name, "Fake %s (NumPy, flavor %s)" % (name, flavor), FIXTURE, "pytorch",
                  parameters={"flavor": flavor, "mode": mode})


@pytest.fixture
def python_kernel(monkeypatch):
    """Every environment is the runner's own interpreter (its ``python3`` kernel): the fixture needs NumPy only."""
    monkeypatch.setattr(framework_envs, "ensure", lambda *a, **k: "python3")


def options(results_dir):
    return execute.RunOptions(SMOKE, "fp32", 0, "cpu", str(results_dir), timeout=300, progress=False,
                              command="pytest")


def code_sources(nb):
    return [c["source"] for c in nb["cells"] if c["cell_type"] == "code"]


# ---- trimming ------------------------------------------------------------------------------------------
def test_trimming_keeps_the_code_cells_through_the_check_then_the_export_cell():
    nb = nbformat.read(FIXTURE_PATH, as_version=4)
    trimmed = migrate.trim_notebook(nb, "fixture")
    tags = [c.metadata.get("tags", []) for c in nb.cells]
    check = next(i for i, t in enumerate(tags) if "rosetta:check" in t)
    export = next(i for i, t in enumerate(tags) if "rosetta:export" in t)
    expected = [c.source for c in nb.cells[:check + 1] if c.cell_type == "code"] + [nb.cells[export].source]
    assert code_sources(trimmed) == expected
    assert trimmed.cells[0].cell_type == "markdown" and "Migration run" in trimmed.cells[0].source
    assert len(trimmed.cells) == len(expected) + 1            # the header, then only code cells
    kept = [t for c in trimmed.cells for t in c.metadata.get("tags", [])]
    assert "parameters" in kept                                # papermill still finds the parameters cell
    for skipped in ("rosetta:optimizer", "rosetta:epoch", "rosetta:record"):
        assert skipped not in kept
    assert all(c.outputs == [] and c.execution_count is None for c in trimmed.cells if c.cell_type == "code")
    assert len(nb.cells) > len(trimmed.cells)                  # the original is left alone


def test_trimming_refuses_a_notebook_without_an_export_cell_or_with_it_before_the_check():
    nb = nbformat.read(FIXTURE_PATH, as_version=4)
    no_export = copy.deepcopy(nb)
    for c in no_export.cells:
        c.metadata["tags"] = [t for t in c.metadata.get("tags", []) if t != "rosetta:export"]
    with pytest.raises(migrate.MigrateError, match="no cell tagged rosetta:export"):
        migrate.trim_notebook(no_export, "x.ipynb")
    swapped = copy.deepcopy(nb)
    i = next(i for i, c in enumerate(swapped.cells) if "rosetta:export" in c.metadata.get("tags", []))
    swapped.cells.insert(3, swapped.cells.pop(i))
    with pytest.raises(migrate.MigrateError, match="before its check"):
        migrate.trim_notebook(swapped, "x.ipynb")


@pytest.mark.parametrize("target", list(TARGETS))
def test_every_framework_notebook_trims_to_its_check_and_export_cells(target):
    """The real notebooks: nothing of training, timing or the record survives."""
    nb = nbformat.read(TARGETS[target].notebook_path, as_version=4)
    trimmed = migrate.trim_notebook(nb, target)
    kept = [t for c in trimmed.cells for t in c.metadata.get("tags", [])]
    assert kept.count("rosetta:check") == 1 and kept[-1] == "rosetta:export"
    for step in ("optimizer", "warmup", "epoch", "forward", "peak", "profile", "record"):
        assert "rosetta:" + step not in kept
    export = trimmed.cells[-1].source
    assert "init_weights" in export and "export_paths(" in export
    # a migration run skips the cells between the check and the export: the export cell may not need them
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    kept_code = [c.source for c in trimmed.cells if c.cell_type == "code"]
    kept = set().union(*[assigned_names(src) for src in kept_code])
    skipped = set().union(*[assigned_names(src) for src in code if src not in kept_code])
    needs = (loaded_names(export) - kept - set(dir(builtins))) & skipped
    assert not needs, "%s's export cell uses %s, defined only in cells a migration run skips" % (
        TARGETS[target].notebook, sorted(needs))


def assigned_names(source):
    """Every name a cell binds: assignments, loop and comprehension targets, arguments, defs, imports."""
    out = set()
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            out.add(n.id)
        elif isinstance(n, ast.arg):
            out.add(n.arg)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            out.update((a.asname or a.name).split(".")[0] for a in n.names)
    return out


def loaded_names(source):
    return {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


# ---- the matrix ----------------------------------------------------------------------------------------
def run_sources(targets, opts):
    recs = [execute.run_target(t, opts, announce=lambda *a: None) for t in targets]
    for rec in recs:
        assert rec["status"] == "ok", rec["error"]
        assert rec["export"]["inference"]["ok"]
    return recs


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    """Two fake frameworks: flavor a (canonical layouts) and one named pytorch with flavor b (transposed
    matrices, two RNN biases, 1e-7 of rounding); their ordinary runs, then the 2 x 2 migration (made once for the
    tests that read it: 6 notebook runs)."""
    with pytest.MonkeyPatch.context() as mp:          # python_kernel's patch, for this fixture's runs
        mp.setattr(framework_envs, "ensure", lambda *a, **k: "python3")
        a, b = fake("fake-a", "a"), fake("pytorch", "b")
        opts = options(tmp_path_factory.mktemp("matrix") / "results")
        run_sources([a, b], opts)
        recs = migrate.run_matrix([a, b], opts, announce=lambda *x: None)
    return opts, (a, b), {(r["source"], r["destination"]): r for r in recs}


def test_a_matrix_into_named_destinations_runs_those_pairs_only(tmp_path):
    a, b, c = fake("fake-a", "a"), fake("pytorch", "b"), fake("fake-c", "a")
    kernels, pairs = [], []
    from runner import migrate as m

    def kernel_for(target, opts, announce):
        kernels.append(target.name)
        return "k", None

    def run_pair(source, destination, opts, kernel, problem, announce=print):
        pairs.append((source.name, destination.name))
        return {"status": "ok"}
    orig = m.run_pair
    m.run_pair = run_pair
    try:
        out = migrate.run_matrix([a, c], options(tmp_path), announce=lambda *x: None, kernel_for=kernel_for,
                                 destinations=[b])
    finally:
        m.run_pair = orig
    assert pairs == [("fake-a", "pytorch"), ("fake-c", "pytorch")] and len(out) == 2
    assert kernels == ["pytorch"]                 # each destination's environment is prepared once


def test_a_matrix_of_two_fake_frameworks(matrix):
    opts, (a, b), recs = matrix
    assert len(recs) == 4 and all(r["status"] == "ok" for r in recs.values()), [r["error"] for r in recs.values()]
    mdir = migrate.migration_dir(opts.results_dir)
    for (src, dst), rec in recs.items():
        stem = "%s__%s_smoke_fp32_bs8_cpu" % (src, dst)
        on_disk = results.read_record(os.path.join(mdir, stem + ".json"))
        assert on_disk["status"] == "ok" and on_disk["kind"] == "migration"
        assert (on_disk["source"], on_disk["destination"]) == (src, dst)
        source_file = os.path.join(opts.results_dir, "weights", "%s_smoke_fp32_bs8_cpu.npz" % src)
        assert on_disk["source_sha256"] == exports.file_sha256(source_file)
        assert on_disk["inference"]["ok"] and on_disk["native"]["ok"] and on_disk["train_loss"]["ok"]
        # the destination's export landed under migration/weights, its record was never written
        assert os.path.exists(os.path.join(mdir, "weights", stem + ".npz"))
        assert os.path.exists(os.path.join(mdir, "weights", stem + ".export.json"))
        assert not os.path.exists(os.path.join(mdir, "records", stem + ".json"))
        assert os.path.exists(os.path.join(mdir, "notebooks", stem + ".ipynb"))
        # load and export are exact inverses in both fake layouts
        assert on_disk["reexport"]["max_abs"] == 0.0
    left = os.listdir(os.path.join(mdir, ".staging"))
    assert not [n for n in left if n.endswith((staging.OWNER, staging.KILLED))], left   # every pair released its claim
    # the diagonal: the round trip reproduces the logits
    for t in ("fake-a", "pytorch"):
        rt = recs[(t, t)]["round_trip"]
        assert rt["ok"] and rt["max_abs"] <= migrate.ROUND_TRIP_ATOL and recs[(t, t)]["logits"]["max_rel"] < 1e-12
    # off the diagonal: flavor b's 1e-7 of "rounding" is what the matrix shows
    for pair in (("fake-a", "pytorch"), ("pytorch", "fake-a")):
        assert recs[pair]["round_trip"] is None
        assert 1e-8 < recs[pair]["logits"]["max_rel"] < 1e-6
        assert recs[pair]["loss"]["rel_diff"] < 1e-6


def test_a_pair_whose_runner_was_killed_outright_is_recorded_by_the_next_pair(tmp_path):
    """A migration pair prepares its failed record when it starts (runner/run/staging.py); a runner killed outright
    leaves it with its owner in migration/.staging, and the next pair run into the same results directory writes it
    where the migration records are.  Pairs that end, however they end, leave no such file."""
    opts = options(tmp_path / "results")
    mdir = migrate.migration_dir(opts.results_dir)
    a, b = fake("fake-a", "a"), fake("pytorch", "b")
    stem = migrate.migration_stem(a, b, opts)
    staging.claim(os.path.join(mdir, ".staging"), stem,
                  lambda status, reason: dict(migrate._base(a, b, opts), status=status, error=reason, run={}))
    dead_runners_claim(os.path.join(mdir, ".staging", stem + staging.OWNER))   # the runner that claimed it is gone
    out = migrate.run_pair(fake("fake-c", "a"), b, opts, "python3", announce=lambda *x: None)
    assert out["status"] == "failed" and "fake-c" in out["error"], out        # no export of fake-c: at once
    rec = results.read_record(os.path.join(mdir, stem + ".json"))
    assert rec["status"] == "failed" and rec["error"] == staging.killed_reason(os.getpid()), rec
    assert (rec["source"], rec["destination"], rec["kind"]) == ("fake-a", "pytorch", "migration")
    assert os.listdir(os.path.join(mdir, ".staging")) == []


def test_report_renders_the_matrix_and_the_convention_notes(matrix, tmp_path):
    opts, _, recs = matrix
    out = str(tmp_path / "results.md")
    render.write(opts.results_dir, out, "python run_all.py --migrate", "abc")
    md = open(out).read()
    section = md.split("## Migration matrix (smoke, fp32, ")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    assert rows[0].split("|")[2:4] == [" pytorch ", " fake-a "]     # destinations: known targets first, in order
    assert rows[1].startswith("| pytorch | **") and rows[2].startswith("| fake-a | ") and "| **" in rows[2]
    expected = "%.0e / %.0e" % (recs[("fake-a", "pytorch")]["logits"]["max_rel"],
                                recs[("fake-a", "pytorch")]["loss"]["rel_diff"])
    assert rows[2].split("|")[2].strip() == expected
    notes = section.split("### Convention differences in the exports")[1]
    assert "| fake-a fp32 |" in notes and "Variance ratio (median)" in notes and "RNN bias scale vs PyTorch" in notes
    row = next(line for line in notes.splitlines() if line.startswith("| fake-a fp32"))
    assert "| 1.000 |" in row and "| 1.00000 |" in row      # the fakes train identically: scale and ratio 1


def test_a_missing_source_and_a_failing_destination_do_not_stop_the_others(tmp_path, python_kernel):
    a, never, broken, ignores = fake("fake-a"), fake("fake-c"), fake("fake-x", mode="export_fails"), \
        fake("fake-i", mode="ignore_init")
    opts = options(tmp_path / "results")
    run_sources([a], opts)
    recs = {(r["source"], r["destination"]): r
            for r in migrate.run_matrix([a, never, broken, ignores], opts, announce=lambda *x: None)}
    assert len(recs) == 16
    assert recs[("fake-a", "fake-a")]["status"] == "ok"
    missing = recs[("fake-c", "fake-a")]
    assert missing["status"] == "failed"
    assert missing["error"].startswith("no export of fake-c") and "python run_all.py --frameworks fake-c" in \
        missing["error"]
    assert recs[("fake-a", "fake-x")]["status"] == "failed"
    assert "RuntimeError: export_fails" in recs[("fake-a", "fake-x")]["error"]
    ignored = recs[("fake-a", "fake-i")]
    assert ignored["status"] == "failed" and "does its section 5 load init_weights?" in ignored["error"]
    # the page shows each failed cell's reason as a numbered note
    out = str(tmp_path / "results.md")
    render.write(opts.results_dir, out, "python run_all.py --migrate", "abc")
    md = open(out).read()
    assert "failed [1]" in md and "fake-c \u2192 fake-a: no export of fake-c" in md


def test_a_source_export_that_changed_since_its_record_fails_its_cells(tmp_path, python_kernel, monkeypatch):
    a = fake("fake-a")
    opts = options(tmp_path / "results")
    run_sources([a], opts)
    weights = os.path.join(opts.results_dir, "weights", "fake-a_smoke_fp32_bs8_cpu.npz")
    with np.load(weights) as f:
        state = {k: f[k] for k in f.files}
    state["out.b"] = state["out.b"] + 1
    np.savez(weights, **state)
    rec = migrate.run_pair(a, a, opts, "python3", announce=lambda *x: None)
    assert rec["status"] == "failed" and "changed since its record" in rec["error"]
    # the check before the matrix only asks whether an export is there: it reads no weights (the pair does)
    read, real = [], exports.file_sha256
    monkeypatch.setattr(exports, "file_sha256", lambda path: read.append(path) or real(path))
    assert migrate.nothing_to_migrate([a], [opts]) is None and read == []
    assert "--migrate: no selected source has an export" in migrate.nothing_to_migrate([fake("fake-c")], [opts])


def test_a_broken_source_file_stops_the_destination_at_section_5_with_one_line(tmp_path, python_kernel):
    """Another preset's shapes: the destination's load_state raises WeightsError, the cell says so."""
    a = fake("fake-a")
    opts = options(tmp_path / "results")
    run_sources([a], opts)
    weights = os.path.join(opts.results_dir, "weights", "fake-a_smoke_fp32_bs8_cpu.npz")
    with np.load(weights) as f:
        state = {k: f[k] for k in f.files}
    state["fc.W"] = np.zeros((3, 3), np.float32)
    np.savez(weights, **state)
    record_path = os.path.join(opts.results_dir, "records", "fake-a_smoke_fp32_bs8_cpu.json")
    rec = results.read_record(record_path)
    rec["export"]["sha256"] = exports.file_sha256(weights)     # a consistent record: the file itself is wrong
    results.write_record(record_path, rec)
    out = migrate.run_pair(a, a, opts, "python3", announce=lambda *x: None)
    assert out["status"] == "failed" and out["error"].startswith("WeightsError: weights file ")
    assert "fc.W has shape (3, 3)" in out["error"]


# ---- run_all.py: the flags -------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["--precision", "fp64", "--frameworks", "tensorflow"], "--precision fp64 is the float64 control of pytorch only"),
    (["--precision", "fp32,fp64", "--frameworks", "pytorch,jax"], "jax has none"),
    (["--precision", "fp64", "--frameworks", "pytorch+compile"], "pytorch+compile has none"),
    (["--migrate", "--workers", "2"], "--migrate runs each destination notebook in one process"),
    (["--migrate", "--profile"], "--migrate trains nothing"),
    (["--migrate", "--precision", "fp64", "--frameworks", "pytorch"], "the control does not migrate"),
    (["--migrate-to", "pytorch"], "--migrate-to names the destinations of --migrate; add --migrate"),
])
def test_run_all_refuses_before_anything_runs(argv, message, tmp_path, capsys, monkeypatch):
    def nothing(*a, **k):
        raise AssertionError("nothing may run")
    monkeypatch.setattr(execute, "run_target", nothing)
    monkeypatch.setattr(migrate, "run_matrix", nothing)
    status = cli.main(argv + ["--results-dir", str(tmp_path / "r"), "--device", "cpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and message in err[0], err


def test_fp64_is_accepted_for_pytorch_only():
    assert control_precision_error([TARGETS["pytorch"]], ["fp32", "fp64"]) is None
    assert control_precision_error([TARGETS["mxnet"]], ["fp32", "bf16"]) is None
    assert "mxnet has none" in control_precision_error([TARGETS["pytorch"], TARGETS["mxnet"]], ["fp64"])
    assert TARGETS["pytorch"].cpu_precision_reason("fp64") is None


def test_run_all_migrate_runs_the_matrix_and_writes_the_page(tmp_path, monkeypatch, capsys):
    seen = []

    def run_matrix(targets, opts, announce=print, destinations=None):
        seen.append(([t.name for t in targets], [t.name for t in destinations], opts.precision, opts.preset.name,
                     opts.preset.batch_size))
        return [{"status": "ok"}] * (len(targets) * len(destinations))
    monkeypatch.setattr(migrate, "run_matrix", run_matrix)
    monkeypatch.setattr(migrate, "nothing_to_migrate", lambda sources, runs: None)   # no exports here: none read
    monkeypatch.setattr(cli.envinfo, "gpus", lambda: [])
    out = tmp_path / "page.md"
    status = cli.main(["--migrate", "--frameworks", "tensorflow,pytorch", "--results-dir", str(tmp_path / "r"),
                       "--output", str(out)])
    assert status == 0 and out.exists()
    assert seen == [(["tensorflow", "pytorch"], ["tensorflow", "pytorch"], "fp32", "smoke", 8)]
    assert "4 migrations ok" in capsys.readouterr().out
    # --migrate-to: the sources' exports into those destinations only
    status = cli.main(["--migrate", "--frameworks", "mxnet,cntk,tensorflow", "--migrate-to", "pytorch,jax",
                       "--results-dir", str(tmp_path / "r"), "--output", str(out)])
    assert status == 0
    assert seen[-1] == (["mxnet", "cntk", "tensorflow"], ["pytorch", "jax"], "fp32", "smoke", 8)
    assert "into pytorch, jax" in capsys.readouterr().out


# ---- the float64 control in the report -----------------------------------------------------------------
def first_table(text):
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| "))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end])


def test_fp64_control_is_a_column_and_a_dashed_line_never_a_row(tmp_path):
    base = [65.5, 120.0, 118.0, 60.0, 90.0, 88.0, 70.0, 66.0, 64.0, 62.0, 61.0, 60.5]
    d = tmp_path / "results" / "records"
    d.mkdir(parents=True)
    recs = [fixture_record("pytorch", "PyTorch", [v * (1 + 1e-7) for v in base], 500.0),
            fixture_record("pytorch", "PyTorch", base, 50.0, precision="fp64"),
            fixture_record("tensorflow", "TensorFlow", [v * (1 + 3e-6) for v in base], 300.0)]
    recs[1]["flops"] = {"achieved_per_s": 1e9, "efficiency": 0.1, "peak_matmul": {"square": {"flops_per_s": 1e10}}}
    for rec in recs:
        results.write_record(str(d / ("%s_%s.json" % (rec["target"], rec["precision"]))), rec)
    out = str(tmp_path / "results.md")
    render.write(str(tmp_path / "results"), out, "python run_all.py", "abc")
    md = open(out).read()
    before_agreement, agreement = md.split("## Do they compute the same thing?")
    assert "fp64" not in before_agreement.split("from 3 result record(s)")[1]     # no table or plot row
    table = first_table(agreement)
    assert checks.CONTROL_COLUMN in table and "pytorch fp64" not in table
    tf_row = next(line for line in table.splitlines() if line.startswith("| tensorflow fp32"))
    assert "3.0e-06" in tf_row
    torch_row = next(line for line in table.splitlines() if line.startswith("| pytorch fp32"))
    assert "1.0e-07" in torch_row
    assert "**Float64 control.**" in agreement and "PyTorch fp32's own deviation over its 12 steps: 1.0e-07" in agreement
    rows = tables.speed_rows([r for r in recs if not checks.is_control(r)])
    assert all(row["Precision"] != "fp64" for _, rws in rows.values() for row in rws)
