import json
import os

import pytest

from common import results


def ok_record(target="pytorch", speed=100.0, **kw):
    r = results.new_record(target, kw.pop("framework", "PyTorch"), "torch.nn", "cuDNN RNN",
                           versions={"framework": "2.13.0"}, device={"type": "cpu", "name": "CPU x"},
                           precision="fp32", preset="smoke", batch_size=8, scale=1, seed=0,
                           data={"audio_hours": 0.165, "checksum": "ab"},
                           checks={"params": {"count": 29429, "ok": True},
                                   "loss": {"rel_diff": 2e-7, "ok": True}},
                           timing={"train_s": 594 / speed, "audio_s_per_s": speed, "utterances_per_s": 1.5,
                                   "step_ms_median": 3.0, "step_ms_p90": 4.0, "warmup_s": 1.0,
                                   "forward_ms": {"1": 1.0, "15": 9.0}},
                           losses={"first": 65.5, "last": 60.25}, memory={"host_peak_rss_bytes": 2 ** 30})
    r.update(kw)
    return r


def test_round_trip(tmp_path):
    rec = ok_record()
    path = results.write_record(str(tmp_path / "pytorch.json"), rec)
    back = results.read_record(path)
    assert back["schema_version"] == results.SCHEMA_VERSION
    assert back["timing"] == rec["timing"] and back["run"]["finished"]
    assert [p.name for p in tmp_path.iterdir()] == ["pytorch.json"]


def test_numpy_values_and_non_finite_numbers(tmp_path):
    np = pytest.importorskip("numpy")
    rec = ok_record(losses={"first": np.float32(1.5), "last": float("nan"), "train": np.arange(3)})
    back = results.read_record(results.write_record(str(tmp_path / "r.json"), rec))
    assert back["losses"] == {"first": 1.5, "last": None, "train": [0, 1, 2]}


def test_atomic_write_leaves_old_file_or_nothing(tmp_path, monkeypatch):
    path = str(tmp_path / "r.json")
    results.write_record(path, ok_record(speed=1.0))
    before = open(path).read()

    def boom(*a, **k):
        raise KeyboardInterrupt("interrupted mid-write")
    monkeypatch.setattr(os, "fsync", boom)           # dies after the text is written, before the rename
    with pytest.raises(KeyboardInterrupt):
        results.write_record(path, ok_record(speed=2.0))
    assert open(path).read() == before
    assert os.listdir(str(tmp_path)) == ["r.json"]     # no partial file left behind
    with pytest.raises(KeyboardInterrupt):
        results.write_record(str(tmp_path / "new.json"), ok_record())
    assert not os.path.exists(str(tmp_path / "new.json"))


@pytest.mark.parametrize("change, message", [
    ({"schema_version": 0}, "schema_version"),
    ({"status": "great"}, "status"),
    ({"status": "failed", "error": None}, "reason"),
    ({"target": ""}, "target"),
])
def test_invalid_records_are_refused(tmp_path, change, message):
    rec = ok_record()
    rec.update(change)
    with pytest.raises(ValueError, match=message):
        results.write_record(str(tmp_path / "r.json"), rec)
    assert not os.listdir(str(tmp_path))


def test_failed_record_and_one_line():
    rec = results.failed_record("mxnet", "failed", "\n  Traceback...\nMore", framework="MXNet")
    assert rec["status"] == "failed" and rec["error"] == "Traceback..." and rec["framework"] == "MXNet"
    assert results.one_line("x" * 500).endswith("\u2026") and len(results.one_line("x" * 500)) == 300
    with pytest.raises(ValueError):
        results.failed_record("mxnet", "ok", "fine")


def test_load_and_render(tmp_path):
    results.write_record(str(tmp_path / "a.json"), ok_record("pytorch", speed=100.0))
    results.write_record(str(tmp_path / "b.json"), ok_record("jax", speed=300.0, framework="JAX"))
    results.write_record(str(tmp_path / "c.json"), results.failed_record(
        "mxnet", "failed", "no kernel image | sm_90", framework="MXNet", preset="smoke"))
    results.write_record(str(tmp_path / "d.json"), results.failed_record(
        "cntk", "skipped", "no CNTK interpreter given", framework="CNTK"))
    (tmp_path / "notes.txt").write_text("not a record")
    df = results.load_records(str(tmp_path))
    assert len(df) == 4 and "timing.audio_s_per_s" in df.columns
    md = results.render_markdown(df)
    lines = md.strip().splitlines()
    assert lines[0].startswith("| Framework | API / variant |") and len(lines) == 6
    assert lines[2].startswith("| JAX") and lines[3].startswith("| PyTorch")      # fastest first
    assert "failed: no kernel image \\| sm_90" in lines[4]                       # reason kept, pipe escaped
    assert "skipped: no CNTK interpreter given" in lines[5]
    assert "| 300.0 |" in lines[2] and "pass 2.0e-07" in lines[2] and "1.0 / 9.0" in lines[2]
    assert all(line.count("|") == lines[0].count("|") for line in lines if "\\|" not in line)


def test_peak_memory_column_is_the_training_peak_where_the_record_has_it(tmp_path):
    """On a CPU the table's peak memory is the process's peak at the end of the timed pass (a profiled step after
    it can take several times more); a record from before that field shows the process's peak at the record, unless
    it was profiled (that peak is the profiler's: a dash)."""
    with_training = ok_record("pytorch", memory={"host_peak_rss_bytes": 20 * 2 ** 30,
                                                 "host_peak_rss_training_bytes": 4 * 2 ** 30})
    results.write_record(str(tmp_path / "a.json"), with_training)
    results.write_record(str(tmp_path / "b.json"), ok_record("jax", speed=300.0, framework="JAX"))
    profiled = ok_record("mxnet", framework="MXNet", memory={"host_peak_rss_bytes": 20 * 2 ** 30},
                         profile={"tool": "profiler", "categories": {}})
    results.write_record(str(tmp_path / "c.json"), profiled)
    md = results.render_markdown(results.load_records(str(tmp_path)), columns=["Framework", "Peak mem GiB"])
    assert md.strip().splitlines()[2:] == ["| JAX | 1.00 |", "| MXNet | \u2013 |", "| PyTorch | 4.00 |"]


def test_empty_directory(tmp_path):
    assert results.render_markdown(results.load_records(str(tmp_path))) == "_No result records._\n"


def test_record_json_is_plain(tmp_path):
    path = results.write_record(str(tmp_path / "r.json"), ok_record())
    text = open(path).read()
    assert "NaN" not in text and json.loads(text)["target"] == "pytorch"
