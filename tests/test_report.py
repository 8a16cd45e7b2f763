"""results.md and its plots from fixture records, failed and skipped rows included."""
import copy
import os

import pytest

from common import flops, results
from common.spec import FULL_MODEL, PRESETS, SMOKE_MODEL
from runner.report import render
from runner.report import gpu_facts
from runner.report import plots
from runner.report import records as report_records
from runner.report import tables


def fixture_record(target, framework, losses, speed, precision="fp32", device="AMD EPYC", dtype="cpu", **kw):
    rec = results.new_record(
        target, framework, "api of " + framework, "", precision=precision, preset="smoke", batch_size=8, scale=1,
        seed=0, versions={"framework": "1.0", "python": "3.11.7", "numpy": "2.4.6", "cudnn": 91000},
        device={"type": dtype, "name": device},
        environment={"os": "Linux", "cpu": "AMD EPYC", "gpus": [], "cuda_driver": None},
        data={"audio_hours": 0.165, "checksum": "ab"},
        checks={"params": {"count": 29429, "ok": True},
                "loss": {"framework": losses[0], "reference": 65.5, "rel_diff": abs(losses[0] - 65.5) / 65.5,
                         "ok": True}},
        timing={"train_s": 594.0 / speed, "audio_s_per_s": speed, "utterances_per_s": speed / 6, "warmup_s": 2.0,
                "step_ms_median": 50.0, "step_ms_p90": 80.0, "forward_ms": {"1": 2.0, "15": 10.0},
                "per_length": {str(s): {"median_ms": 10.0 * s * 100 / speed} for s in range(1, 16)}},
        losses={"warmup": list(losses[:3]), "train": list(losses[3:]), "first": losses[3], "last": losses[-1]},
        run={"started": "2026-11-21T05:00:00+00:00", "finished": "2026-11-21T05:10:00+00:00",
             "command": "python run_all.py --preset smoke", "git_commit": "abc123"})
    rec.update(kw)
    if rec.get("preset") in PRESETS:       # the data of the preset as it is (report_records.preset_label)
        rec["data"].setdefault("lengths", list(PRESETS[rec["preset"]].lengths))
    return rec


@pytest.fixture(autouse=True)
def _plots_where_a_test_looks_at_them(request, monkeypatch):
    """Drawing the plots is most of a page's time (about a second a page, the CI's largest share of this file):
    the tests that look at the plots (marked ``plots``) draw them; the others get the page as for records with
    nothing to plot (no image lines), which changes none of the tables they check."""
    if request.node.get_closest_marker("plots") is None:
        monkeypatch.setattr(render, "_make_plots", lambda records, controls, plots_dir: dict.fromkeys(plots.PLOTS,
                                                                                                       False))


#: the fixture records' loss trajectory: three warm-up losses, then the timed pass's
LOSSES = [65.5, 120.0, 118.0, 60.0, 90.0, 88.0, 70.0, 66.0, 64.0, 62.0, 61.0, 60.5]


@pytest.fixture
def records_dir(tmp_path):
    d = tmp_path / "results" / "records"
    d.mkdir(parents=True)
    recs = [
        fixture_record("pytorch", "PyTorch", LOSSES, 500.0),
        fixture_record("tensorflow", "TensorFlow", [v * (1 + 2e-5) for v in LOSSES], 300.0),
        fixture_record("jax", "JAX", [v * (1 - 5e-4) for v in LOSSES], 700.0),
        results.failed_record("mxnet", "failed", "MXNetError: no kernel image | sm_90", framework="MXNet",
                              preset="smoke", precision="fp32", device={"type": "cpu", "name": "AMD EPYC"}),
        results.failed_record("cntk", "skipped", "no CNTK interpreter given", framework="CNTK", preset="smoke",
                              precision="fp32"),
    ]
    for rec in recs:
        results.write_record(str(d / ("%s.json" % rec["target"])), rec)
    return tmp_path / "results"


def test_page_from_fixture_records(records_dir, tmp_path):
    out = str(tmp_path / "results.md")
    render.write(str(records_dir), out, "python run_all.py --preset smoke", "abc123")
    md = open(out).read()
    for heading in ("# DS2 Rosetta results", "## Table of record", "## Speed and efficiency",
                    "## Measured matrix-product peak", "## Throughput", "## Batch size",
                    "## Step time per utterance length", "## Where the time goes",
                    "## Do they compute the same thing?", "## Environments", "## How these records were made"):
        assert heading in md
    assert "from 5 result record(s)" in md and "commit `abc123`" in md
    table = md.split("## Table of record")[1].split("## Speed and efficiency")[0]
    rows = [l for l in table.splitlines() if l.startswith("| ") and not l.startswith("| Framework")]
    assert len(rows) == 5
    assert rows[0].startswith("| JAX") and rows[1].startswith("| PyTorch") and rows[2].startswith("| TensorFlow")
    assert "failed: MXNetError: no kernel image \\| sm_90" in rows[3] and "skipped: no CNTK interpreter" in rows[4]
    agreement = md.split("## Do they compute the same thing?")[1].split("## Environments")[0]
    jax_row = [l for l in agreement.splitlines() if l.startswith("| jax")][0]
    assert "5.0e-04" in jax_row                      # max rel. diff of the first 10 losses vs PyTorch
    tf_row = [l for l in agreement.splitlines() if l.startswith("| tensorflow")][0]
    assert "2.0e-05" in tf_row
    assert "(reference row)" in [l for l in agreement.splitlines() if l.startswith("| pytorch")][0]
    assert "`python run_all.py --preset smoke`" in md.split("## How these records were made")[1]
    assert "cudnn 91000" in md


@pytest.mark.plots
def test_plots_are_written_non_empty_and_embedded(records_dir, tmp_path):
    out = str(tmp_path / "results.md")
    render.write(str(records_dir), out, "cmd", None)
    md = open(out).read()
    for key in ("throughput", "step_time", "trajectories"):      # the FLOP and batch-size plots: below
        name = plots.PLOTS[key]
        path = records_dir / "plots" / name
        assert path.exists() and path.stat().st_size > 5000, name
        assert open(str(path), "rb").read(8) == b"\x89PNG\r\n\x1a\n"
        assert "](results/plots/%s)" % name in md
    assert not [p for p in (records_dir / "plots").iterdir() if "partial" in p.name]


def _save_plot_again_and_again(path, times, start):
    plt = plots._plt()
    start.wait()
    for _ in range(times):
        fig, ax = plt.subplots(figsize=(2, 2))
        ax.plot([0, 1], [1, 0])
        plots._save(fig, path)


@pytest.mark.plots
def test_two_runs_drawing_the_same_plot_at_once_both_succeed(tmp_path):
    """Two runs that share a results directory (a migration matrix's two halves) redraw the same plots: neither
    may take the other's temporary file from under it."""
    import multiprocessing
    ctx = multiprocessing.get_context("fork")
    path = str(tmp_path / "step_time_by_length.png")
    start = ctx.Event()
    procs = [ctx.Process(target=_save_plot_again_and_again, args=(path, 40, start)) for _ in range(2)]
    for p in procs:
        p.start()
    start.set()
    try:
        for p in procs:
            p.join(120)
    finally:
        for p in procs:                                   # none outlives the test
            if p.is_alive():
                p.kill()
                p.join()
    assert [p.exitcode for p in procs] == [0, 0]
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert oct(os.stat(path).st_mode & 0o777) == oct(0o644)
    assert os.listdir(str(tmp_path)) == ["step_time_by_length.png"]


@pytest.mark.plots
def test_no_completed_runs(tmp_path):
    d = tmp_path / "records"
    d.mkdir()
    results.write_record(str(d / "cntk.json"), results.failed_record("cntk", "skipped", "no interpreter", framework="CNTK"))
    md = render.render(str(tmp_path), "cmd", None, str(tmp_path / "results.md"))
    assert "skipped: no interpreter" in md and "_No completed runs._" in md
    assert not (tmp_path / "plots" / "throughput.png").exists()


def test_agreement_prefers_pytorch_on_the_same_device_and_precision(records_dir):
    recs = results.read_records(str(records_dir / "records"))
    torch_cpu = [r for r in recs if r["target"] == "pytorch"][0]
    torch_gpu = copy.deepcopy(torch_cpu)
    torch_gpu["device"] = {"type": "cuda", "name": "H100"}
    jax_gpu = copy.deepcopy([r for r in recs if r["target"] == "jax"][0])
    jax_gpu["device"] = {"type": "cuda", "name": "H100"}
    assert report_records.pytorch_twin(jax_gpu, recs + [torch_gpu]) is torch_gpu
    assert report_records.pytorch_twin(jax_gpu, recs) is torch_cpu       # fp32 PyTorch on another device


# ---- speed, efficiency, variants, batch sizes, profiles --------------------------------------------
def flops_of(achieved, peak, train_s=1.0):
    """A record's flops section (common.flops.flops_section's layout) for ``achieved`` FLOP/s."""
    return {"train": achieved * train_s, "train_per_audio_second": 2.25744e7, "achieved_per_s": achieved,
            "peak_matmul_per_s": peak,
            "peak_matmul": {"square": {"shape": [1024, 1024, 1024], "flops_per_s": peak},
                            "input": {"shape": [1600, 300, 32], "flops_per_s": peak / 2},
                            "recurrent": {"shape": [8, 32, 32], "flops_per_s": peak / 20}},
            "efficiency": achieved / peak,
            "theoretical_peak": {"flops_per_s": 3.328e11, "precision": "fp32", "label": "theoretical",
                                 "basis": "2 logical CPUs x 2 FMA units x 16 fp32 lanes (AVX-512) x 2 FLOPs x 2.60 GHz",
                                 "assumptions": "2 FMA units per core and one logical CPU per core"},
            "per_length": {}}


PROFILE = {"tool": "torch.profiler (cpu)", "step_s": 0.25, "profiled_s": 0.2, "batch": {"seconds": 8, "batch_size": 8},
           "seconds": {}, "shares": {"convolution": 0.1, "rnn_input": 0.0, "rnn_recurrence": 0.0, "rnn": 0.6,
                                     "fc": 0.05, "ctc": 0.05, "batchnorm": 0.1, "optimizer": 0.05, "other": 0.05},
           "largest_other": [["aten::copy_", 0.01]]}


@pytest.fixture
def efficiency_dir(tmp_path):
    """PyTorch's row of record and its variant at batch 8, PyTorch at batch 32, TensorFlow at 8 and 32,
    a JAX record from before the flops section, a failed MXNet row."""
    d = tmp_path / "results" / "records"
    d.mkdir(parents=True)
    recs = [
        fixture_record("pytorch", "PyTorch", LOSSES, 500.0, row_of_record="pytorch", flops=flops_of(10e9, 40e9),
                       profile=PROFILE),
        fixture_record("pytorch+compile", "PyTorch", LOSSES, 750.0, row_of_record="pytorch",
                       variant="torch.compile (inductor)", flops=flops_of(15e9, 40e9)),
        fixture_record("pytorch", "PyTorch", LOSSES, 1000.0, row_of_record="pytorch", batch_size=32,
                       flops=flops_of(20e9, 50e9)),
        fixture_record("tensorflow", "TensorFlow", LOSSES, 200.0, row_of_record="tensorflow",
                       flops=flops_of(4e9, 32e9)),
        fixture_record("tensorflow", "TensorFlow", LOSSES, 250.0, row_of_record="tensorflow", batch_size=32,
                       flops=flops_of(5e9, 32e9)),
        fixture_record("jax", "JAX", LOSSES, 400.0),                                  # no flops section
        results.failed_record("mxnet", "failed", "MXNetError: out of memory", framework="MXNet", preset="smoke",
                              precision="fp32", batch_size=8, scale=1, seed=0,
                              device={"type": "cpu", "name": "AMD EPYC"}),
    ]
    for rec in recs:
        if rec.get("flops"):
            rec["config"] = SMOKE_MODEL.to_dict()
        name = "%s_bs%s" % (rec["target"], rec.get("batch_size"))
        results.write_record(str(d / (name + ".json")), rec)
    return tmp_path / "results"


def _table_rows(section, first_column):
    rows = {}
    lines = [l for l in section.splitlines() if l.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    for line in lines[1:]:
        cells = dict(zip(header, [c.strip() for c in line.strip("|").split("|")]))
        rows[(cells[first_column], cells.get("Batch"))] = cells
    return header, rows


def test_speed_and_efficiency_table(efficiency_dir, tmp_path):
    out = str(tmp_path / "results.md")
    render.write(str(efficiency_dir), out, "python run_all.py --variants --batch-size 8,32", "abc123")
    md = open(out).read()
    section = md.split("## Speed and efficiency")[1].split("## Measured matrix-product peak")[0]
    assert section.count("### smoke (scale 1, seed 0) on AMD EPYC") == 1          # one group: batch sizes together
    assert "Training FLOPs per second of audio (from the model's configuration, in the records): 0.02257 GFLOP" in section
    header, rows = _table_rows(section, "Row")
    assert header == ["Row", "Framework", "Variant", "Precision", "Batch", "Audio s/s", "\u00f7 fastest of group",
                      "Achieved GFLOP/s", "% of matmul peak", "% of shape roofline",
                      "Row of record \u00f7 fastest variant", "Status"]
    assert len(rows) == 7
    order = [l.split("|")[1].strip() for l in section.splitlines() if l.startswith("| ") and "---" not in l][1:]
    assert order == ["pytorch", "pytorch+compile", "pytorch", "jax", "tensorflow", "tensorflow", "mxnet"]  # fastest first
    torch8, torch32 = rows[("pytorch", "8")], rows[("pytorch", "32")]
    variant = rows[("pytorch+compile", "8")]
    assert torch8["Variant"] == "(row of record)" and variant["Variant"] == "torch.compile (inductor)"
    assert torch32["\u00f7 fastest of group"] == "1.00" and torch8["\u00f7 fastest of group"] == "0.50"
    assert variant["\u00f7 fastest of group"] == "0.75" and rows[("jax", "8")]["\u00f7 fastest of group"] == "0.40"
    assert torch8["Achieved GFLOP/s"] == "10" and torch8["% of matmul peak"] == "25.0"
    assert variant["Achieved GFLOP/s"] == "15" and variant["% of matmul peak"] == "37.5"
    assert torch32["% of matmul peak"] == "40.0" and rows[("tensorflow", "8")]["% of matmul peak"] == "12.5"
    # no shape roofline for smoke rows (test_shape_roofline_of_full_width_records)
    assert all(row["% of shape roofline"] == "\u2013" for row in rows.values())
    # the row of record against its framework's fastest variant (same batch size and precision): 500 / 750
    assert torch8["Row of record \u00f7 fastest variant"] == "0.67"
    assert torch32["Row of record \u00f7 fastest variant"] == "\u2013"          # no variant ran at batch 32
    assert variant["Row of record \u00f7 fastest variant"] == "\u2013"
    assert rows[("tensorflow", "8")]["Row of record \u00f7 fastest variant"] == "\u2013"
    jax = rows[("jax", "8")]                                                    # a record without flops: dashes
    assert jax["Audio s/s"] == "400.0" and jax["Achieved GFLOP/s"] == "\u2013" and jax["% of matmul peak"] == "\u2013"
    mx = rows[("mxnet", "8")]
    assert mx["Status"] == "failed: MXNetError: out of memory" and mx["Audio s/s"] == "\u2013"
    assert mx["\u00f7 fastest of group"] == "\u2013" and mx["Achieved GFLOP/s"] == "\u2013"
    # the table of record keeps one row per record
    table = md.split("## Table of record")[1].split("## Speed and efficiency")[0]
    assert len([l for l in table.splitlines() if l.startswith("| ") and not l.startswith("| Framework")]) == 7


def test_peaks_per_device_and_theoretical(efficiency_dir, tmp_path):
    md = render.render(str(efficiency_dir), "cmd", None, str(tmp_path / "results.md"))
    section = md.split("## Measured matrix-product peak")[1].split("## Throughput")[0]
    assert "### AMD EPYC" in section
    header, rows = _table_rows(section, "Row")
    assert header[:9] == ["Row", "Preset", "Precision", "Batch", "Square GFLOP/s", "Input GFLOP/s",
                          "Recurrent GFLOP/s", "Shape roofline GFLOP/s", "Shapes (m\u00d7k\u00d7n)"]
    torch8 = rows[("pytorch", "8")]
    assert (torch8["Square GFLOP/s"], torch8["Input GFLOP/s"], torch8["Recurrent GFLOP/s"]) == ("40", "20", "2")
    assert torch8["Shape roofline GFLOP/s"] == "\u2013"                      # smoke: none
    assert torch8["Shapes (m\u00d7k\u00d7n)"] == "square 1024\u00d71024\u00d71024; input 1600\u00d7300\u00d732; recurrent 8\u00d732\u00d732"
    assert ("jax", "8") not in rows and ("mxnet", "8") not in rows          # no measured peak
    assert "Theoretical peak of this CPU, fp32 (theoretical, not measured): 333 GFLOP/s = 2 logical CPUs" in section


def test_shape_roofline_of_full_width_records(tmp_path):
    """The roofline: the sequential share at the recurrent rate (peak / 20), the rest at the square peak; in
    both tables for a `cpu` record, none for the same record at the smoke preset."""
    d = tmp_path / "results" / "records"
    d.mkdir(parents=True)
    for preset in ("cpu", "smoke"):
        rec = fixture_record("pytorch", "PyTorch", LOSSES, 5.0, row_of_record="pytorch", preset=preset,
                             config=FULL_MODEL.to_dict(), flops=flops_of(50e9, 300e9))
        results.write_record(str(d / ("pytorch_%s.json" % preset)), rec)
    md = render.render(str(tmp_path / "results"), "cmd", None, str(tmp_path / "results.md"))
    share = flops.sequential_share(FULL_MODEL)
    roof = 1 / (share / 15e9 + (1 - share) / 300e9)
    speed = md.split("## Speed and efficiency")[1].split("## Measured matrix-product peak")[0]
    cpu, smoke = speed.split("### smoke")
    assert _table_rows(cpu, "Row")[1][("pytorch", "8")]["% of shape roofline"] == "%.1f" % (100 * 50e9 / roof)
    assert _table_rows(smoke, "Row")[1][("pytorch", "8")]["% of shape roofline"] == "\u2013"
    peaks = md.split("## Measured matrix-product peak")[1].split("## Throughput")[0]
    assert "the recurrent product forward and its gradient" in peaks
    rows = [l for l in peaks.splitlines() if l.startswith("| pytorch ")]
    assert len(rows) == 2 and sorted(l.split("|")[8].strip() for l in rows) == ["%.3g" % (roof / 1e9), "\u2013"]


def test_where_the_time_goes(efficiency_dir, tmp_path):
    md = render.render(str(efficiency_dir), "cmd", None, str(tmp_path / "results.md"))
    section = md.split("## Where the time goes")[1].split("## Do they compute the same thing?")[0]
    header, rows = _table_rows(section, "Row")
    assert len(rows) == 1
    row = rows[("pytorch fp32", "8")]
    assert row["rnn %"] == "60.0" and row["convolution %"] == "10.0" and row["other %"] == "5.0"
    assert row["Tool"] == "torch.profiler (cpu)" and row["Profiled step"] == "8 s \u00d7 8" and row["Step s"] == "0.250"
    assert "rnn_input %" not in header                                    # no profile put time there
    assert header.index("convolution %") < header.index("rnn %") < header.index("other %")


@pytest.mark.plots
def test_flops_and_batch_size_plots(efficiency_dir, tmp_path):
    out = str(tmp_path / "results.md")
    render.write(str(efficiency_dir), out, "cmd", None)
    md = open(out).read()
    for name in plots.PLOTS.values():
        path = efficiency_dir / "plots" / name
        assert path.exists() and path.stat().st_size > 5000, name
        assert "](results/plots/%s)" % name in md
    groups = plots.sweep_groups(results.read_records(str(efficiency_dir / "records")))
    assert list(groups) == [("smoke", 1, 0, "AMD EPYC")]
    series = groups[("smoke", 1, 0, "AMD EPYC")]
    assert series[("pytorch", "fp32")] == [(8, 500.0), (32, 1000.0)] and series[("tensorflow", "fp32")] == [(8, 200.0), (32, 250.0)]
    assert series[("jax", "fp32")] == [(8, 400.0)]


@pytest.mark.plots
def test_records_without_the_new_sections_render_with_dashes(records_dir, tmp_path):
    md = render.render(str(records_dir), "cmd", None, str(tmp_path / "results.md"))
    assert "_No record has a measured matmul peak._" in md and "_No record has a profile section._" in md
    assert "_No preset ran on one device with more than one batch size._" in md
    assert not (records_dir / "plots" / plots.PLOTS["flops"]).exists()
    section = md.split("## Speed and efficiency")[1].split("## Measured matrix-product peak")[0]
    header, rows = _table_rows(section, "Row")
    assert rows[("jax", "8")]["Achieved GFLOP/s"] == "\u2013" and rows[("jax", "8")]["\u00f7 fastest of group"] == "1.00"
    assert rows[("pytorch", "8")]["\u00f7 fastest of group"] == "0.71"                  # 500 / 700


def test_variant_of_a_record_without_row_of_record():
    rec = fixture_record("jax+unroll", "JAX", [1.0] * 4, 10.0)
    assert report_records.row_of_record(rec) == "jax" and report_records.is_variant(rec)
    assert not report_records.is_variant(fixture_record("keras-jax", "Keras 3", [1.0] * 4, 10.0))


def test_a_row_compiled_fast_says_so_in_its_name():
    rec = fixture_record("jax", "JAX", [1.0] * 4, 10.0, options={"xla_flags": "--xla_backend_optimization_level=0"})
    assert report_records.row_name(rec) == "jax (LLVM -O0)"
    assert report_records.row_name(fixture_record("jax", "JAX", [1.0] * 4, 10.0, options={"xla_flags": None})) == "jax"


def test_flop_unit_by_magnitude():
    assert report_records.flop_unit([3e9, 9e11]) == (1e9, "GFLOP/s")
    assert report_records.flop_unit([3e9, 1.2e12]) == (1e12, "TFLOP/s")
    assert report_records.flop_unit([None]) == (1e9, "GFLOP/s")


COMMITTED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results", "records")


def test_committed_records_efficiency_is_plausible():
    """Every committed record with a measured efficiency: achieved training FLOP/s is positive and at most
    1.2 x the notebook's own measured square-matmul peak (more would mean the FLOPs or the peak are wrong),
    and below its shape roofline where it has one and its recurrence runs as separate products. cuDNN's fused RNN
    (``options.rnn_kernel`` ``aten._cudnn_rnn``) steps faster than a lone product of the recurrent shape (the
    H100's PyTorch bf16 row in CUDA graphs reached 1.85 x its shape roofline): such a row is held below its
    latency-aware roofline, which the same card's measured cuDNN RNN gives, where the card's figures are committed,
    else below 1.5 x its shape roofline (the H200's PyTorch tf32 row reached 1.01 x it)."""
    from runner.report.latency import latency_share, load_latency
    latency = load_latency(os.path.dirname(COMMITTED))
    checked = []
    for rec in results.read_records(COMMITTED):
        eff = (rec.get("flops") or {}).get("efficiency")
        if rec["status"] != "ok" or eff is None:
            continue
        assert 0 < eff < 1.2, "%s: efficiency %r" % (rec["target"], eff)
        f = rec["flops"]
        assert f["efficiency"] == pytest.approx(f["achieved_per_s"] / f["peak_matmul_per_s"], rel=1e-9)
        roof = report_records._roofline(rec)                       # a ceiling for separate products
        fused = (rec.get("options") or {}).get("rnn_kernel") == "aten._cudnn_rnn"
        share = latency_share(rec, latency) if fused else None
        if share is not None:
            assert 0 < share < 1.0, "%s %s: %.2f of its latency-aware roofline" % (rec["target"], rec["precision"],
                                                                                    share)
        else:
            assert roof is None or 0 < f["achieved_per_s"] < roof * (1.5 if fused else 1.0), \
                "%s: achieved %r, roofline %r" % (rec["target"], f["achieved_per_s"], roof)
        checked.append(rec["target"])
    if not checked:
        pytest.skip("no committed record has a flops section with an efficiency yet")


# ---- the summary, one table of record per device and preset, the ONNX table ---------------------------------
def _grouped_records(tmp_path, gpu=False):
    """Two devices x two presets: smoke on an AMD EPYC and the cpu preset on a Xeon, each with two frameworks,
    the cpu preset at two batch sizes; optionally one smoke row on a GPU."""
    d = tmp_path / "results" / "records"
    d.mkdir(parents=True)
    recs = [fixture_record("pytorch", "PyTorch", LOSSES, 500.0), fixture_record("mxnet", "MXNet", LOSSES, 700.0)]
    for target, framework, speeds in (("pytorch", "PyTorch", (6.0, 7.5)), ("cntk", "CNTK", (8.0, 9.0))):
        for batch, speed in zip((8, 32), speeds):
            recs.append(fixture_record(target, framework, LOSSES, speed, device="Intel Xeon", preset="cpu",
                                       batch_size=batch, onnx={"status": "ok", "opset": 17, "nodes_total": 9,
                                                               "vs_framework": {"max_rel": 1e-6},
                                                               "vs_reference": {"max_rel": 2e-6}}
                                       if target == "pytorch" and batch == 8 else None))
    if gpu:
        recs.append(fixture_record("jax", "JAX", LOSSES, 9000.0, device="NVIDIA H100", dtype="cuda"))
    for i, rec in enumerate(recs):
        if rec.get("onnx") is None:
            rec.pop("onnx", None)
        results.write_record(str(d / ("%02d_%s.json" % (i, rec["target"]))), rec)
    out = str(tmp_path / "results.md")
    render.write(str(tmp_path / "results"), out, "python -m runner.report", "abc")
    return open(out).read()


def test_summary_ranks_each_device_and_preset_apart_and_tables_follow_its_groups(tmp_path):
    md = _grouped_records(tmp_path)
    summary = md.split("## Summary")[1].split("\n## ")[0]
    assert len([l for l in summary.strip().splitlines()]) <= 15
    # the column headers name the device (short), the preset and the batch size
    assert "| Row | Xeon \u00b7 cpu \u00b7 bs 8 | Xeon \u00b7 cpu \u00b7 bs 32 | EPYC \u00b7 smoke \u00b7 bs 8 |" in summary
    rows = [l for l in summary.splitlines() if l.startswith("| ") and not l.startswith("| Row")]
    # the first group (the full-width cpu preset) ranks first: cntk 9.0 (#1), pytorch 7.5 (#3 at batch 32)...
    assert rows[0] == "| cntk | 8 (#2, 0.89) | 9 (#1, 1.00) | \u2013 |"
    assert rows[1] == "| pytorch | 6 (#4, 0.67) | 7.5 (#3, 0.83) | 500 (#2, 0.71) |"
    assert rows[2] == "| mxnet | \u2013 | \u2013 | 700 (#1, 1.00) |"
    # the legend says what the short names and presets stand for, and when
    assert "Xeon = Intel Xeon (2026-11-21); EPYC = AMD EPYC (2026-11-21)" in summary
    assert "smoke = CPU, CI and tests" in summary and "#1:" not in summary
    # the table of record: one table per device and preset, in the summary's order, without constant columns
    table = md.split("## Table of record")[1].split("\n## ")[0]
    assert [l for l in table.splitlines() if l.startswith("### ")] == [
        "### cpu on Intel Xeon, 2026-11-21", "### smoke on AMD EPYC, 2026-11-21"]
    header = [l for l in table.splitlines() if l.startswith("| Framework")][0]
    assert "| Batch |" in header and "Device" not in header and "Preset" not in header and "Version" not in header
    cpu_rows = [l for l in table.split("### smoke")[0].splitlines() if l.startswith("| ") and "Framework" not in l]
    assert len(cpu_rows) == 4 and cpu_rows[0].startswith("| CNTK") and "| 32 |" in cpu_rows[0]
    # Environments carry the version, audio hours and parameter count; agreement and environments a batch
    for section in ("## Do they compute the same thing?", "## Environments"):
        assert "| Batch |" in md.split(section)[1].split("\n## ")[0]
    # provenance: per command and machine
    made = md.split("## How these records were made")[1]
    assert "| Command | Machine |" in made and "AMD EPYC" in made
    assert "which 1 command made on 1 kind of machine ([how these records were made](#how-these-records-were-made))" in md


def test_no_gpu_sentence_appears_exactly_when_no_record_ran_on_a_gpu(tmp_path):
    sentence = "No record here ran on a GPU"
    assert sentence in _grouped_records(tmp_path / "a").split("## Table of record")[0]
    with_gpu = _grouped_records(tmp_path / "b", gpu=True)
    assert sentence not in with_gpu
    assert "| Row | H100 \u00b7 smoke \u00b7 bs 8 |" in with_gpu                  # the GPU group first
    assert "H100 = NVIDIA H100 (2026-11-21)" in with_gpu
    # a group where only one framework ran: said so, not ranked
    row = [l for l in with_gpu.splitlines() if l.startswith("| jax |")][0]
    assert row.startswith("| jax | 9000 (no other framework ran) |"), row


def test_onnx_table_has_only_records_with_an_onnx_section(tmp_path):
    md = _grouped_records(tmp_path)
    onnx = md.split("## ONNX exit route")[1].split("\n## ")[0]
    rows = [l for l in onnx.splitlines() if l.startswith("| ") and not l.startswith("| Row")]
    assert len(rows) == 1 and rows[0].startswith("| pytorch fp32 | cpu | 8 |"), rows
    assert "5 older records have no ONNX section" in onnx
    assert "issue" + " #" not in md


# ---- a corrupt record, a crash while rendering ---------------------------------------------------------------
def test_a_corrupt_record_is_one_warning_line_and_the_page_is_still_written(records_dir, tmp_path):
    """Invalid JSON, a truncated file and a record without ``status``: one warning line each, naming the file; the
    page is made from the good records and lists the bad ones as unreadable; the exit status is 0."""
    import json
    import subprocess
    import sys
    from tests.conftest import ROOT
    d = records_dir / "records"
    (d / "bad.json").write_text("{not json\n")
    (d / "cut.json").write_text(open(str(d / "jax.json")).read()[:100])
    rec = json.load(open(str(d / "pytorch.json")))
    del rec["status"]
    (d / "nostatus.json").write_text(json.dumps(rec))
    out = tmp_path / "page.md"
    proc = subprocess.run([sys.executable, "-m", "runner.report", "--results-dir", str(records_dir), "--output",
                           str(out)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 3 and all(l.startswith("python -m runner.report: warning: ") for l in lines), lines
    for name, why in (("bad.json", "Expecting property name"), ("cut.json", ""), ("nostatus.json", "no 'status'")):
        line = [l for l in lines if name in l]
        assert len(line) == 1 and why in line[0] and "page.md leaves it out" in line[0], lines
    md = out.read_text()
    table = md.split("## Table of record")[1].split("\n## ")[0]
    assert len([l for l in table.splitlines() if l.startswith("| ") and not l.startswith("| Framework")]) == 5
    unreadable = md.split("## Unreadable records")[1].split("\n## ")[0]
    for name in ("bad.json", "cut.json", "nostatus.json"):
        assert "`results/records/%s`" % name in unreadable
    assert "from 5 result record(s)" in md


def test_a_crash_while_rendering_leaves_the_old_page_whole(records_dir, tmp_path, monkeypatch):
    out = tmp_path / "results.md"
    render.write(str(records_dir), str(out), "the first command", None)
    old = out.read_text()

    def boom(records):
        raise RuntimeError("rendering failed")
    monkeypatch.setattr(render, "environment_rows", boom)
    with pytest.raises(RuntimeError):
        render.write(str(records_dir), str(out), "the second command", None)
    assert out.read_text() == old
    assert not [p for p in tmp_path.iterdir() if "partial" in p.name]


# ---- the latency-aware roofline: a column where the card's latency figures are in the results directory ----
def test_latency_roofline_column_for_the_card_with_figures(tmp_path):
    import json
    from common import roofline
    gpu = fixture_record("pytorch", "PyTorch", LOSSES, 2000.0, device="NVIDIA H200", dtype="cuda", preset="quick",
                         batch_size=32, scale=64, config=FULL_MODEL.to_dict())
    cpu = fixture_record("jax", "JAX", LOSSES, 100.0, config=SMOKE_MODEL.to_dict())
    # the same card at smoke width: full-width figures say nothing of a 32-wide recurrence's step
    narrow = fixture_record("jax", "JAX", LOSSES, 900.0, device="NVIDIA H200", dtype="cuda", preset="quick",
                            batch_size=32, scale=64, config=SMOKE_MODEL.to_dict())
    d = tmp_path / "records"
    d.mkdir()
    for rec in (gpu, cpu, narrow):
        results.write_record(str(d / ("%s_%s.json" % (rec["target"], rec["device"]["type"]))), rec)
    latency = {"benchmark": "rnn_latency", "device": {"type": "cuda", "name": "NVIDIA H200"},
               "sizes": {"batch": 32, "hidden": FULL_MODEL.rnn_hidden},
               "precisions": {"fp32": {"t_step_s": 14e-6, "gemm_flops_per_s": {"input": 50e12, "recurrent": 5e12}}}}
    (tmp_path / "latency").mkdir()
    (tmp_path / "latency" / "h200.json").write_text(json.dumps(latency))
    md = render.render(str(tmp_path), "cmd", None, str(tmp_path / "results.md"))
    speed = md.split("## Speed and efficiency")[1].split("## Measured matrix-product peak")[0]
    quick, smoke = speed.split("### quick")[1].split("###")[0], speed.split("### smoke")[1].split("###")[0]
    bound = roofline.epoch_bound(FULL_MODEL, roofline.deepmark_batches(32, 64), 14e-6, 50e12)["audio_s_per_s"]
    header, rows = _table_rows(quick, "Row")
    assert "% of latency roofline" in header
    assert rows[("pytorch", "32")]["% of latency roofline"] == "%.1f" % (100 * 2000.0 / bound)
    assert rows[("jax", "32")]["% of latency roofline"] == "–"          # figures of another width
    assert "% of latency roofline" not in _table_rows(smoke, "Row")[0]      # no figures for the CPU


# ---- the summary on its own: device names, rows that did not finish, data-parallel rows, the third line -------
@pytest.mark.parametrize("name, short", [
    ("NVIDIA H200", "H200"), ("Intel(R) Xeon(R) Processor", "Xeon"), ("AMD EPYC", "EPYC"),
    ("AMD EPYC 7B13 64-Core Processor", "EPYC"), ("NVIDIA GeForce RTX 4090", "RTX 4090"),
    ("NVIDIA A100-SXM4-80GB", "A100"), ("NVIDIA H100 80GB HBM3", "H100"), (None, "?")])
def test_short_device_names(name, short):
    assert report_records.short_device(name) == short


def test_two_devices_with_one_short_name_keep_their_full_names():
    keys = [("cuda", "NVIDIA H100 80GB HBM3", "quick"), ("cuda", "NVIDIA H100 PCIe", "quick"),
            ("cpu", "AMD EPYC", "smoke")]
    assert list(tables.device_short_names(keys).values()) == ["NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "EPYC"]


def _summary_of(tmp_path, recs, command="python -m runner.report"):
    d = tmp_path / "results" / "records"
    d.mkdir(parents=True)
    for i, rec in enumerate(recs):
        results.write_record(str(d / ("%02d_%s.json" % (i, rec["target"]))), rec)
    md = render.render(str(tmp_path / "results"), command, "abc", str(tmp_path / "results.md"))
    return md, md.split("## Summary")[1].split("\n## ")[0]


@pytest.mark.parametrize("error", ["interrupted (SIGINT)", "terminated (SIGTERM)", "a cell ran past the 900 s timeout",
                                   "timed out after 900 s (--timeout)"])
def test_a_row_stopped_by_a_signal_or_a_time_limit_is_not_finished_and_the_lone_row_is_not_ranked(tmp_path, error):
    stopped = results.failed_record("jax", "failed", error, framework="JAX", preset="smoke", precision="fp32",
                                    batch_size=8, device={"type": "cpu", "name": "AMD EPYC"})
    broken = results.failed_record("mxnet", "failed", "MXNetError: no kernel image", framework="MXNet",
                                   preset="smoke", precision="fp32", batch_size=8,
                                   device={"type": "cpu", "name": "AMD EPYC"})
    md, summary = _summary_of(tmp_path, [fixture_record("pytorch", "PyTorch", LOSSES, 500.0), stopped, broken])
    rows = {l.split(" | ")[0][2:]: l for l in summary.splitlines() if l.startswith("| ") and "Row" not in l}
    assert rows["pytorch"] == "| pytorch | 500 (no other framework finished) |"
    assert rows["jax"] == "| jax | not finished (interrupted) |"
    assert rows["mxnet"] == "| mxnet | failed |"
    table = md.split("## Table of record")[1]
    assert "not finished (interrupted): %s" % error in table               # the reason, in the table of record
    assert "failed: %s" % error not in table and "failed: MXNetError: no kernel image" in table


def _dp_record(tmp_path, target, framework, speed, mode=None, hosts=2):
    staging = tmp_path / "results" / ".staging"
    staging.mkdir(parents=True, exist_ok=True)
    script = staging / ("%s_w2.py" % target)
    script.write_text("# made from the notebook\n")
    rec = fixture_record(target, framework, LOSSES, speed, device="Intel Xeon", preset="smoke",
                         distributed=dict({"world_size": 2}, **dict(
                             {"hosts": [{"host": "a", "processes": 1}, {"host": "b", "processes": 1}]} if hosts > 1
                             else {}, **({"mxnet_dp": mode} if mode else {}))))
    rec["run"] = dict(rec["run"], executed_notebook=str(script), notebook="notebooks/%s" % {
        "mxnet": "MXNet_DS2.ipynb", "pytorch": "PyTorch_DS2.ipynb"}[target])
    return rec


def test_data_parallel_rows_are_labelled_in_every_table_and_link_their_committed_notebook(tmp_path):
    recs = [fixture_record("pytorch", "PyTorch", LOSSES, 500.0, device="Intel Xeon"),
            _dp_record(tmp_path, "pytorch", "PyTorch", 300.0),
            _dp_record(tmp_path, "mxnet", "MXNet", 400.0, mode="dist_sync"),
            _dp_record(tmp_path, "mxnet", "MXNet", 380.0, mode="local", hosts=1)]
    md, summary = _summary_of(tmp_path, recs)
    assert "2 workers" not in summary                                 # the summary is one process per row
    table = md.split("## Table of record")[1].split("\n## ")[0]
    for label in ("torch.nn / 2 workers, 2 hosts", "api of MXNet / 2 workers, dist_sync, 2 hosts",
                  "api of MXNet / 2 workers, local |"):
        assert label.replace("torch.nn", "api of PyTorch") in table, label
    assert ".staging" not in md and md.count("[source, 9b](") == 3
    assert "notebooks/MXNet_DS2.ipynb)" in table
    for section in ("## Speed and efficiency", "## Step time per utterance length", "## Environments",
                    "## How these records were made"):
        text = md.split(section)[1].split("\n## ")[0]
        assert "mxnet" in text and "2 workers, dist_sync, 2 hosts" in text and "2 workers, local" in text, section


def test_the_third_line_names_the_report_and_its_records(tmp_path):
    recs = [fixture_record("pytorch", "PyTorch", LOSSES, 500.0), fixture_record("jax", "JAX", LOSSES, 400.0)]
    md, _ = _summary_of(tmp_path / "a", recs)
    line = md.splitlines()[2]
    assert line.startswith("Generated by `python -m runner.report` (commit `abc`) on ") and \
        "from 2 result record(s) in `results/records`, which 1 command made on 1 kind of machine " \
        "([how these records were made](#how-these-records-were-made)); never edited by hand." in line
    md, _ = _summary_of(tmp_path / "b", recs, command="python run_all.py --frameworks jax")
    line = md.splitlines()[2]
    assert line.startswith("Generated by `python run_all.py --frameworks jax` (commit `abc`) on ") and \
        ": after its own rows it regenerated this page, as `python -m runner.report` does, from 2 result " \
        "record(s)" in line


@pytest.mark.plots
def test_readme_copy_of_the_summary_is_rewritten_between_its_markers(tmp_path, records_dir):
    page = render.render(str(records_dir), "python -m runner.report", "abc", str(tmp_path / "results.md"))
    block = render.summary_block(page)
    assert block.startswith("Seconds of audio trained per second") and "| Row |" in block
    assert "![" not in block and "## " not in block
    readme = tmp_path / "README.md"
    readme.write_text("# Title\n\n%s\n\nold table\n\n%s\n\nAfter.\n" % (render.README_BEGIN, render.README_END))
    assert render.sync_readme(page, str(readme))
    assert readme.read_text() == "# Title\n\n%s\n\n%s\n\n%s\n\nAfter.\n" % (render.README_BEGIN, block,
                                                                          render.README_END)
    assert not render.sync_readme(page, str(readme))                # current: left alone
    plain = tmp_path / "plain.md"
    plain.write_text("no markers\n")
    assert not render.sync_readme(page, str(plain)) and plain.read_text() == "no markers\n"


def _gpu_record(target, framework, speed, **kw):
    rec = fixture_record(target, framework, LOSSES, speed, device="NVIDIA H200", dtype="cuda", preset="quick",
                         batch_size=32, **kw)
    rec["timing"].update(train_s=30.0, projected_epoch_s=600.0, projected_scale=1280)
    rec["run"] = dict(rec["run"], wall_s=100.0, executed_notebook="results/notebooks/%s_quick_fp32_bs32_nvidia-h200"
                      ".ipynb" % target)
    return rec


def test_before_you_rent_a_gpu_says_what_ran_what_cannot_and_how_long_from_the_records(tmp_path):
    ok = _gpu_record("pytorch", "PyTorch", 1300.0, as_is=True)
    stopped = results.failed_record("jax", "failed", "interrupted (SIGINT)", framework="JAX", preset="quick",
                                    precision="fp32", batch_size=32, device={"type": "cuda", "name": "NVIDIA H200"},
                                    as_is=True)
    d = tmp_path / "results" / "records"
    d.mkdir(parents=True)
    results.write_record(str(d / "pytorch_quick_fp32_bs32_nvidia-h200.json"), ok)
    results.write_record(str(d / "jax.json"), stopped)
    results.write_record(str(d / "tf.json"), fixture_record("tensorflow", "TensorFlow", LOSSES, 300.0))
    md = render.render(str(tmp_path / "results"), "python -m runner.report", "abc", str(tmp_path / "results.md"))
    block = render.section_block(md, gpu_facts.TITLE, stop=("## ",))
    ran = [l for l in block.splitlines() if l.startswith("  - `")]
    assert ran[0].startswith("  - `jax` quick, batch 32, on an NVIDIA H200 through the frameworks as "
                             "installed") and "fp32 not finished (interrupted) (no record file)" in ran[0]
    assert "`pytorch` quick" in ran[1] and ran[1].endswith(            # its time: 100 s, and 100 - 30 + 600
        "fp32 ok, 1300 audio-s/s in 100 s, deepmark about 11 min ([record](results/records/pytorch_quick_fp32_bs32_"
        "nvidia-h200.json))")
    assert not any("tensorflow" in l for l in ran)                    # a CPU record is no GPU claim
    assert "**Routes no GPU has run:** the pinned environments" in block and "an offline wheelhouse" in block
    assert "as installed (`--use-installed`)" not in block.split("**Routes no GPU has run:**")[1].split("\n")[0]
    assert "`jax`" in block.split("**Environments no row has finished in on a GPU:**")[1].split("\n")[0]
    hopper = [l for l in block.splitlines() if "H100, H200 (Hopper), sm_90" in l][0]
    assert "`mxnet`: mxnet-cu112" in hopper and "no kernel image" in hopper and "`pytorch`" not in hopper
    assert "**How long a row takes:** the times above" in block
    assert "Run `python run_all.py --preset quick` first" in block


def test_a_gpu_run_that_skipped_parts_says_its_time_is_without_them(tmp_path):
    """A row's line gives each finished run's time; what its runs left out is said once where they all left out the
    same, else after each run's time."""
    session = _gpu_record("pytorch", "PyTorch", 1300.0, as_is=True, precision="bf16")
    session["options"] = {"skipped": ["export", "onnx", "forward"]}
    head = "  - `pytorch` quick, batch 32, on an NVIDIA H200 through the frameworks as installed (`--use-installed`): "
    lines = gpu_facts.ran_lines([_gpu_record("pytorch", "PyTorch", 1300.0, as_is=True), session], "", "")
    assert lines[1] == head + ("fp32 ok, 1300 audio-s/s in 100 s, deepmark about 11 min (no record file); bf16 ok, "
                               "1300 audio-s/s in 100 s, deepmark about 11 min, without the export, ONNX and the "
                               "forward timing (no record file)")
    session["options"] = {"skipped": ["forward"]}
    assert gpu_facts.ran_lines([session], "", "")[1] == head + (
        "bf16 ok, 1300 audio-s/s in 100 s, deepmark about 11 min (no record file); times without the forward timing")
    other = copy.deepcopy(session)
    other["precision"] = "tf32"
    assert gpu_facts.ran_lines([session, other], "", "")[1].endswith(
        "tf32 ok, 1300 audio-s/s in 100 s, deepmark about 11 min (no record file); bf16 ok, 1300 audio-s/s in 100 s, "
        "deepmark about 11 min (no record file); all times without the forward timing")
    assert gpu_facts.time_lines([session])[0].startswith("- **How long a row takes:** the times above")


def test_before_you_rent_a_gpu_names_the_fastest_full_model_record_on_each_card_with_its_roofline_share(tmp_path):
    """Any row, precision and route; the full model only (a smoke-width run is faster and says nothing); a finished
    record only; the share of the card's latency-aware roofline where the results directory has its figures."""
    import json
    from common import roofline
    h200 = [_gpu_record("pytorch", "PyTorch", 1300.0, config=FULL_MODEL.to_dict(), scale=64),
            _gpu_record("pytorch", "PyTorch", 2000.0, precision="tf32", config=FULL_MODEL.to_dict(), scale=64),
            fixture_record("jax", "JAX", LOSSES, 5000.0, device="NVIDIA H200", dtype="cuda", preset="smoke",
                           batch_size=8, config=SMOKE_MODEL.to_dict())]
    h100 = _gpu_record("pytorch+graphs", "PyTorch", 1500.0, config=FULL_MODEL.to_dict(), scale=64, variant="graphs")
    h100["device"]["name"] = "NVIDIA H100 80GB HBM3"
    killed = results.failed_record("jax", "failed", "interrupted (SIGINT)", framework="JAX", preset="quick",
                                   precision="fp32", batch_size=32, device={"type": "cuda", "name": "NVIDIA H100 "
                                                                            "80GB HBM3"})
    d = tmp_path / "results" / "records"
    d.mkdir(parents=True)
    for i, rec in enumerate(h200 + [h100, killed]):
        results.write_record(str(d / ("%d.json" % i)), rec)
    bare = render.section_block(render.render(str(tmp_path / "results"), "cmd", None, str(tmp_path / "results.md")),
                                gpu_facts.TITLE, stop=("## ",))
    assert [l for l in bare.splitlines() if l.startswith("- **Fastest on each card**")] == [
        "- **Fastest on each card** (the full model; any row, precision and route): on an NVIDIA H100 80GB HBM3, "
        "`pytorch+graphs` at fp32 (quick, batch 32): 1500 audio-s/s, no latency figures for the card (no record "
        "file); on an NVIDIA H200, `pytorch` at tf32 (quick, batch 32): 2000 audio-s/s, no latency figures for the "
        "card (no record file). Each card's fastest among the rows it ran, and the cards did not run the same rows: "
        "a row's speed on two cards is in the table of record."]          # the H100 ran no pytorch tf32
    (tmp_path / "results" / "latency").mkdir()
    (tmp_path / "results" / "latency" / "h200.json").write_text(json.dumps({
        "benchmark": "rnn_latency", "device": {"type": "cuda", "name": "NVIDIA H200"},
        "sizes": {"batch": 32, "hidden": FULL_MODEL.rnn_hidden},
        "precisions": {"tf32": {"t_step_s": 14e-6, "gemm_flops_per_s": {"input": 50e12, "recurrent": 5e12}}}}))
    md = render.render(str(tmp_path / "results"), "cmd", None, str(tmp_path / "results.md"))
    line = [l for l in render.section_block(md, gpu_facts.TITLE, stop=("## ",)).splitlines()
            if l.startswith("- **Fastest on each card**")][0]
    bound = roofline.epoch_bound(FULL_MODEL, roofline.deepmark_batches(32, 64), 14e-6, 50e12)["audio_s_per_s"]
    assert ("`pytorch` at tf32 (quick, batch 32): 2000 audio-s/s, %.0f%% of the card's latency-aware roofline (no "
            "record file). Each card's" % (100 * 2000.0 / bound)) in line
    assert not gpu_facts.fastest_lines([killed], "", "", {})              # nothing finished: no line


def test_fastest_on_each_card_counts_only_the_full_model_runs_among_the_rows_a_card_ran():
    """Each card ran the other's fastest row, but only at smoke width: the cards did not run the same rows."""
    def rec(target, card, speed, preset):
        return fixture_record(target, "JAX" if target == "jax" else "PyTorch", LOSSES, speed, device=card,
                              dtype="cuda", preset=preset, batch_size=32 if preset == "quick" else 8,
                              config=(FULL_MODEL if preset == "quick" else SMOKE_MODEL).to_dict())
    gpu = [rec("jax", "NVIDIA H100 80GB HBM3", 1500.0, "quick"), rec("pytorch", "NVIDIA H100 80GB HBM3", 9000.0, "smoke"),
           rec("pytorch", "NVIDIA H200", 1300.0, "quick"), rec("jax", "NVIDIA H200", 9000.0, "smoke")]
    line = gpu_facts.fastest_lines(gpu, "", "", {})[0]
    assert "`jax` at fp32 (quick, batch 32): 1500 audio-s/s" in line and "`pytorch` at fp32 (quick" in line
    assert line.endswith("the cards did not run the same rows: a row's speed on two cards is in the table of record.")
    same = gpu[:1] + [rec("pytorch", "NVIDIA H100 80GB HBM3", 900.0, "quick")] + gpu[2:3] + \
        [rec("jax", "NVIDIA H200", 1000.0, "quick")]
    assert gpu_facts.fastest_lines(same, "", "", {})[0].endswith("audio-s/s, no latency figures for the card "
                                                                 "(no record file).")


def test_before_you_rent_a_gpu_without_gpu_records_says_nothing_ran(tmp_path, records_dir):
    md = render.render(str(records_dir), "python -m runner.report", "abc", str(tmp_path / "results.md"))
    block = render.section_block(md, gpu_facts.TITLE, stop=("## ",))
    assert "**Has run on a GPU:** nothing yet" in block and "no row's time is known" in block
    assert "the pinned environments" in block and "the frameworks as installed" in block


def test_readme_copy_of_the_gpu_facts_is_rewritten_between_its_markers(tmp_path, records_dir):
    page = render.render(str(records_dir), "python -m runner.report", "abc", str(tmp_path / "results.md"))
    readme = tmp_path / "README.md"
    readme.write_text("# T\n\n%s\nstale facts\n%s\n\n## Next\n" % (render.GPU_BEGIN, render.GPU_END))
    assert render.sync_readme(page, str(readme))
    text = readme.read_text()
    assert "**Has run on a GPU:** nothing yet" in text and "stale facts" not in text and text.endswith("\n\n## Next\n")
    assert not render.sync_readme(page, str(readme))


def test_records_of_other_lengths_than_the_preset_keeps_are_their_own_group(tmp_path):
    """A smoke record made when the preset kept all 15 lengths ran other data: its own column and speed table,
    and the legend says what its data held."""
    new = fixture_record("pytorch", "PyTorch", LOSSES, 500.0)
    old = fixture_record("jax", "JAX", LOSSES, 300.0)
    old["data"] = {"audio_hours": 0.165, "checksum": "cd", "utterances": 100, "audio_seconds": 594}   # no lengths
    d = tmp_path / "records"
    d.mkdir()
    for rec in (new, old):
        results.write_record(str(d / ("%s.json" % rec["target"])), rec)
    md = render.render(str(tmp_path), "cmd", None, str(tmp_path / "results.md"))
    summary = md.split("## Summary")[1].split("## Table of record")[0]
    assert "EPYC \u00b7 smoke \u00b7 bs 8" in summary and "EPYC \u00b7 smoke, 15 lengths \u00b7 bs 8" in summary
    assert "smoke, 15 lengths = the smoke preset's model on 15 lengths: 100 utterances, 594 s of audio" in summary
    speed = md.split("## Speed and efficiency")[1].split("## Measured matrix-product peak")[0]
    assert "### smoke (scale 1" in speed and "### smoke, 15 lengths (scale 1" in speed


def test_the_step_time_fit_recovers_a_line_and_leaves_out_what_is_not_one():
    line = {str(s): {"median_ms": 7.5 + 23.0 * s} for s in range(1, 16)}
    fit = tables.step_time_fit(line)
    assert fit["fixed_ms"] == pytest.approx(7.5) and fit["ms_per_s"] == pytest.approx(23.0)
    assert fit["r2"] == pytest.approx(1.0) and fit["lengths"] == 15
    assert tables.step_time_fit({"1": {"median_ms": 5.0}, "2": {"median_ms": 6.0}}) is None       # two points
    assert tables.step_time_fit({str(s): {"median_ms": 5.0} for s in (1, 2, 3)}) is None           # flat
    assert tables.step_time_fit({"1": {"median_ms": None}, "2": {}, "3": {"median_ms": 1.0}}) is None
    # a CPU-like run whose steps fall again at the longest lengths: no line to speak of
    humped = {str(s): {"median_ms": 100.0 * min(s, 16 - s)} for s in range(1, 16)}
    assert tables.step_time_fit(humped)["r2"] < tables.FIT_MIN_R2
    linear = fixture_record("pytorch", "PyTorch", LOSSES, 500.0, device="NVIDIA H100", dtype="cuda")
    linear["timing"]["per_length"] = line
    humpy = fixture_record("jax", "JAX", LOSSES, 300.0)
    humpy["timing"]["per_length"] = humped
    rows = {r["Row"].split()[0]: r for r in tables.step_time_rows([linear, humpy])}
    assert rows["pytorch"]["Fixed ms"] == pytest.approx(7.5)
    assert rows["pytorch"]["ms per s of audio"] == pytest.approx(23.0)
    assert rows["jax"]["Fixed ms"] is None and rows["jax"]["ms per s of audio"] is None
    table = report_records.md_table(list(rows.values()), {"Fixed ms": "{:.1f}", "ms per s of audio": "{:.2f}"})
    assert "| 7.5 | 23.00 |" in table and "| – | – |" in table


def test_an_experiment_whose_runs_skipped_the_onnx_export_is_not_counted_as_failed_exports(tmp_path):
    from runner.report import checks
    def onnx(status):
        return {"status": status, "vs_framework": {"max_rel": 2e-6}, "vs_reference": {"max_rel": 1e-6}}
    for name, statuses in (("skipped_all", ["skipped", "skipped"]), ("mixed", ["ok", "failed", "skipped"])):
        d = tmp_path / "experiments" / name / "records"
        d.mkdir(parents=True)
        for i, status in enumerate(statuses):
            results.write_record(str(d / ("r%d.json" % i)),
                                 fixture_record("pytorch", "PyTorch", LOSSES, 500.0, onnx=onnx(status)))
    lines = checks.experiment_onnx_lines(str(tmp_path), str(tmp_path / "results.md"))
    assert len(lines) == 1 and lines[0].startswith("- [experiments/mixed](experiments/mixed): 1 of 2 exports pass")


def test_the_report_alone_records_a_row_whose_runner_was_killed_outright(records_dir, tmp_path):
    """A runner killed outright (SIGKILL) leaves its row's prepared record in ``.staging``: ``python -m
    runner.report`` writes it, with one line saying so, so the page does not show the row's earlier record as its
    latest; a live runner's row (this test's own claim) is left alone."""
    import subprocess
    import sys
    from runner.run import staging
    from tests.conftest import ROOT, dead_runners_claim
    stage = str(records_dir / ".staging")
    for target, framework in (("pytorch", "PyTorch"), ("jax", "JAX")):
        staging.claim(stage, target, lambda status, reason, t=target, f=framework: results.failed_record(
            t, status, reason, framework=f, preset="smoke", precision="fp32",
            device={"type": "cpu", "name": "AMD EPYC"}))
    dead_runners_claim(os.path.join(stage, "pytorch" + staging.OWNER))
    out = tmp_path / "page.md"
    proc = subprocess.run([sys.executable, "-m", "runner.report", "--results-dir", str(records_dir), "--output",
                           str(out)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    assert proc.returncode == 0, proc.stderr
    line = [l for l in proc.stdout.splitlines() if "records/pytorch.json" in l]
    assert len(line) == 1 and "its runner ended while the row ran" in line[0], proc.stdout
    rec = results.read_record(str(records_dir / "records" / "pytorch.json"))
    assert rec["status"] == "failed" and rec["error"] == staging.killed_reason(os.getpid()), rec
    assert results.read_record(str(records_dir / "records" / "jax.json"))["status"] == "ok"
    assert sorted(os.listdir(stage)) == ["jax.killed.json", "jax.owner"]
    assert "not finished (interrupted): the runner (pid %d)" % os.getpid() in out.read_text()


def test_data_parallel_table_gives_each_row_the_single_process_speed_and_names_simulated_hosts(tmp_path):
    """MXNet dist_sync is held to --mxnet-dp local (W devices, one process), but its *1 worker audio s/s* is the one
    process's; a record of the preset's former lengths is no twin; tools/simulate_hosts.sh's hosts say simulated."""
    from runner.report.data_parallel import SIMULATED_PREFIX, equivalence_rows
    from tests.conftest import ROOT
    single = fixture_record("mxnet", "MXNet", LOSSES, 450.0, device="Intel Xeon")
    dist = _dp_record(tmp_path, "mxnet", "MXNet", 400.0, mode="dist_sync")
    dist["distributed"]["hosts"] = [{"host": SIMULATED_PREFIX + "1", "processes": 1},
                                    {"host": SIMULATED_PREFIX + "2", "processes": 1}]
    local = _dp_record(tmp_path, "mxnet", "MXNet", 380.0, mode="local", hosts=1)
    torch = _dp_record(tmp_path, "pytorch", "PyTorch", 300.0)
    former = fixture_record("pytorch", "PyTorch", LOSSES, 500.0, device="Intel Xeon")
    former["data"]["lengths"] = list(range(1, 16))                # the smoke preset's former 15 lengths
    rows = {r["Row"]: r for r in equivalence_rows([single, dist, local, torch, former])}
    assert rows["mxnet fp32 (dist_sync)"]["1 worker audio s/s"] == 450.0
    assert rows["mxnet fp32 (dist_sync)"]["Hosts"].startswith("2 simulated hosts (%s1:1" % SIMULATED_PREFIX)
    assert rows["mxnet fp32 (local)"]["1 worker audio s/s"] == 450.0
    assert rows["pytorch fp32"]["Hosts"] == "2 hosts (a:1, b:1)"
    assert rows["pytorch fp32"]["1 worker audio s/s"] is None          # the only one-process run had other data
    assert rows["pytorch fp32"]["Equivalent"] == "no single-worker record with batch 8"
    script = open(os.path.join(ROOT, "tools", "simulate_hosts.sh")).read()
    assert "\nPREFIX=%s\n" % SIMULATED_PREFIX.rstrip(".") in script    # the addresses the script gives


def test_a_record_of_the_presets_former_lengths_is_compared_with_none_of_todays_records():
    """Its losses are other batches': against today's PyTorch row or float64 control they would read as a 280 %
    disagreement. It is a benchmark of its own, named so in every table."""
    from runner.report.checks import control_for
    today = fixture_record("pytorch", "PyTorch", LOSSES, 500.0)
    control = fixture_record("pytorch", "PyTorch", LOSSES, 100.0, precision="fp64")
    former = fixture_record("jax", "JAX", LOSSES, 400.0)
    former["data"]["lengths"] = list(range(1, 16))
    assert report_records.pytorch_twin(former, [today, control]) is None
    assert control_for(former, [control]) is None
    assert report_records.pytorch_twin(fixture_record("jax", "JAX", LOSSES, 400.0), [today]) is today
    assert report_records.preset_label(former) == "smoke, 15 lengths"
    assert report_records._group_key(former)[0] == "smoke, 15 lengths"


def test_the_rnn_split_is_a_dash_where_the_profile_does_not_make_it_and_the_rnn_total_sums_it():
    split = dict(PROFILE, shares=dict(PROFILE["shares"], rnn_input=0.3, rnn_recurrence=0.25, rnn=0.05))
    rows = {r["Row"]: r for r in tables.profile_rows([
        fixture_record("pytorch", "PyTorch", LOSSES, 500.0, profile=PROFILE),
        fixture_record("tensorflow", "TensorFlow", LOSSES, 200.0, profile=split)])}
    torch, tf = rows["pytorch fp32"], rows["tensorflow fp32"]
    assert torch["rnn_input %"] is None and torch["rnn_recurrence %"] is None          # not 0.0: not told apart
    assert torch["rnn %"] == pytest.approx(60.0) and torch[tables.RNN_TOTAL] == pytest.approx(60.0)
    assert tf["rnn_input %"] == pytest.approx(30.0) and tf[tables.RNN_TOTAL] == pytest.approx(60.0)
    assert list(tf).index("rnn %") + 1 == list(tf).index(tables.RNN_TOTAL)


def test_no_line_is_fitted_through_the_step_times_of_batches_that_are_not_full():
    """On the cpu preset a length's one batch holds 1 to 14 utterances: a line through those medians would not be
    one batch size's cost per second of length."""
    per = {str(s): {"median_ms": 10.0 + 20.0 * s, "utterances": 32 * 2, "steps": 2} for s in range(1, 16)}
    full = fixture_record("pytorch", "PyTorch", LOSSES, 500.0, batch_size=32)
    full["timing"]["per_length"] = per
    partial = fixture_record("jax", "JAX", LOSSES, 300.0, batch_size=32)
    partial["timing"]["per_length"] = dict(per, **{"15": {"median_ms": 310.0, "utterances": 1, "steps": 1}})
    rows = {r["Row"].split()[0]: r for r in tables.step_time_rows([full, partial])}
    assert rows["pytorch"]["ms per s of audio"] == pytest.approx(20.0)
    assert rows["jax"]["ms per s of audio"] is None and rows["jax"]["15 s"] == 310.0
    assert not tables.full_batches(partial["timing"]["per_length"], 32) and tables.full_batches({}, 32)


def test_a_measured_product_above_the_theoretical_peak_says_why(tmp_path):
    """A virtual machine reports its nominal clock: its theoretical figure (333 GFLOP/s from 2.6 GHz) can sit below
    a measured product (a Zen 5 EPYC's turbo); the page says so instead of leaving a 'peak' the run beat."""
    fast = fixture_record("jax", "JAX", LOSSES, 400.0, flops=flops_of(10e9, 528e9),
                          options={"xla_flags": "--xla_backend_optimization_level=0"})
    slow = fixture_record("pytorch", "PyTorch", LOSSES, 500.0, flops=flops_of(10e9, 40e9))
    for rec in (fast, slow):
        rec["config"] = SMOKE_MODEL.to_dict()
    section = tables.peak_section([fast, slow])
    assert "A measured square product reached 528 GFLOP/s, above it: the CPU ran faster than the clock" in section
    assert "above it" not in tables.peak_section([slow])
    assert "XLA compiled with LLVM's optimisation off" in "\n".join(tables.summary_section([fast, slow]))
    assert "jax on EPYC, smoke" in "\n".join(tables.summary_section([fast, slow]))


def test_provenance_keeps_a_dirty_commit_and_names_an_unnamed_installed_route():
    from runner.report.provenance import provenance_rows
    rec = fixture_record("pytorch", "PyTorch", LOSSES, 500.0, as_is=True)
    rec["run"] = dict(rec["run"], git_commit="89379904d00a1234567890-dirty", command="python run_all.py --preset quick")
    (row,) = provenance_rows([rec])
    assert row["Commits"] == "89379904d00a-dirty"
    assert row["Command"] == ("`python run_all.py --preset quick` with the frameworks as installed "
                              "(`DS2_USE_INSTALLED`, which the commands kept then did not name)")
    rec["run"]["command"] = "DS2_USE_INSTALLED=pytorch=/usr/bin/python3 python run_all.py"
    assert provenance_rows([rec])[0]["Command"] == "`DS2_USE_INSTALLED=pytorch=/usr/bin/python3 python run_all.py`"


def test_the_architecture_audit_says_which_builds_were_read_from_their_binaries_and_how_jit_runs():
    """A V100 has PyTorch only in the cu128/cu126 builds, whose architectures come from PyTorch's build scripts (the
    index was never reached here): the page says so instead of 'every environment has a build'; a build that runs
    through the driver's PTX JIT carries its own caveat."""
    from runner.envs.gpu_preflight import BUILDS
    volta, ampere, hopper = gpu_facts.audit((7, 0)), gpu_facts.audit((8, 0)), gpu_facts.audit((9, 0))
    assert "not read from their binaries" in volta["pytorch"] and "cu128" in volta["pytorch"]
    assert ampere["pytorch"] is None and ampere["jax"] is None                # cu130 and cuda12: read, native
    assert hopper["tensorflow"].endswith(BUILDS["tensorflow"][0].jit_note)
    lines = "\n".join(gpu_facts.cannot_lines())
    assert "every environment has a build" not in lines.split("sm_70:")[1].split("\n")[0]
    never = "\n".join(gpu_facts.never_lines([_gpu_record("pytorch", "PyTorch", 1300.0)]))
    assert "- **Rows of record no GPU has finished:** `tensorflow`, `mxnet`, `cntk`, `jax`, `keras-jax`" in never
    assert "`pytorch`" not in never.split("Rows of record")[1]
