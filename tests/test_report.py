"""results.md and its plots from fixture records, failed and skipped rows included."""
import copy
import os

import pytest

from common import results
from runner import report


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
    return rec


@pytest.fixture
def records_dir(tmp_path):
    base = [65.5, 120.0, 118.0, 60.0, 90.0, 88.0, 70.0, 66.0, 64.0, 62.0, 61.0, 60.5]
    d = tmp_path / "results" / "records"
    d.mkdir(parents=True)
    recs = [
        fixture_record("pytorch", "PyTorch", base, 500.0),
        fixture_record("tensorflow", "TensorFlow", [v * (1 + 2e-5) for v in base], 300.0),
        fixture_record("jax", "JAX", [v * (1 - 5e-4) for v in base], 700.0),
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
    report.write(str(records_dir), out, "python run_all.py --preset smoke", "abc123")
    md = open(out).read()
    for heading in ("# DS2 Rosetta results", "## Table of record", "## Throughput", "## Step time per utterance length",
                    "## Do they compute the same thing?", "## Environments", "## How these records were made"):
        assert heading in md
    assert "from 5 result record(s)" in md and "commit `abc123`" in md
    table = md.split("## Table of record")[1].split("## Throughput")[0]
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


def test_plots_are_written_non_empty_and_embedded(records_dir, tmp_path):
    out = str(tmp_path / "results.md")
    report.write(str(records_dir), out, "cmd", None)
    md = open(out).read()
    for name in report.PLOTS.values():
        path = records_dir / "plots" / name
        assert path.exists() and path.stat().st_size > 5000, name
        assert open(str(path), "rb").read(8) == b"\x89PNG\r\n\x1a\n"
        assert "](results/plots/%s)" % name in md
    assert not [p for p in (records_dir / "plots").iterdir() if "partial" in p.name]


def test_no_completed_runs(tmp_path):
    d = tmp_path / "records"
    d.mkdir()
    results.write_record(str(d / "cntk.json"), results.failed_record("cntk", "skipped", "no interpreter", framework="CNTK"))
    md = report.render(str(tmp_path), "cmd", None, str(tmp_path / "results.md"))
    assert "skipped: no interpreter" in md and "_No completed runs._" in md
    assert not (tmp_path / "plots" / "throughput.png").exists()


def test_agreement_prefers_pytorch_on_the_same_device_and_precision(records_dir):
    recs = results.read_records(str(records_dir / "records"))
    torch_cpu = [r for r in recs if r["target"] == "pytorch"][0]
    torch_gpu = copy.deepcopy(torch_cpu)
    torch_gpu["device"] = {"type": "cuda", "name": "H100"}
    jax_gpu = copy.deepcopy([r for r in recs if r["target"] == "jax"][0])
    jax_gpu["device"] = {"type": "cuda", "name": "H100"}
    assert report.pytorch_twin(jax_gpu, recs + [torch_gpu]) is torch_gpu
    assert report.pytorch_twin(jax_gpu, recs) is torch_cpu       # fp32 PyTorch on another device
