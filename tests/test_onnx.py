"""The ONNX exit route: every notebook's section 11b on the session's smoke run (tests/conftest.py
``smoke``), the check of a file on the command line (``python -m common.onnx_check``), which must fail on a
perturbed weight and refuse bad input with one line and exit 2, and the table in results.md."""
import os
import subprocess
import sys

import numpy as np
import pytest

from common import onnx_check, results
from common.spec import get_preset
from runner.report import checks
from runner.migrate import repo_path
from runner.run.targets import TARGETS
from tests.conftest import full_targets, ok_record, ROOT, selected_targets

import onnx          # noqa: E402  pinned in the runner environment (envs/runner.txt), as onnxruntime
import onnxruntime   # noqa: E402,F401

CFG = get_preset("smoke").config


def cli(*args):
    return subprocess.run([sys.executable, "-m", "common.onnx_check"] + [str(a) for a in args], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)


def assert_one_line_error(proc, *fragments):
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m common.onnx_check: error: "), proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


# ---- the module alone -------------------------------------------------------------------------------------
def test_held_out_batch_is_new_to_the_export():
    from common.data import DeepMarkIterator
    held = onnx_check.held_out_batch(CFG, 0)
    assert (held.batch_size, held.seconds, held.frames) == (3, 3, 300)
    assert held.features.shape == (3, 300, CFG.n_freq) and held.labels.min() >= 1
    check = DeepMarkIterator(8, 1, 0, n_freq=CFG.n_freq).batch(0)          # what every export traces
    assert (check.batch_size, check.frames) != (held.batch_size, held.frames)
    same_length = [b for b in DeepMarkIterator(3, 1, 0, n_freq=CFG.n_freq).one_batch_per_length() if b.seconds == 3][0]
    assert not np.array_equal(same_length.features, held.features)         # another seed: other data
    assert np.array_equal(onnx_check.held_out_batch(CFG, 0).features, held.features)   # and reproducible


def tiny_model(path, with_loop=True, meta=None):
    """A valid ONNX model without DS2 metadata: Identity, and a Loop whose body holds two nodes."""
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T", 161])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "T", 161])
    nodes = [helper.make_node("Identity", ["x"], ["y"])]
    if with_loop:
        body = helper.make_graph(
            [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Identity", ["v_in"], ["v_out"])],
            "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                     helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                     helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [])],
            [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
             helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [])])
        nodes.append(helper.make_node("Loop", ["", "", "v0"], ["v"], body=body))
    graph = helper.make_graph(nodes, "tiny", [x], [y],
                              initializer=[helper.make_tensor("v0", TensorProto.FLOAT, [], [1.0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    if meta:
        helper.set_model_props(model, meta)
    onnx.save(model, str(path))
    return model


def test_node_counts_walk_subgraphs_and_opset(tmp_path):
    model = tiny_model(tmp_path / "tiny.onnx")
    counts, total, top = onnx_check.node_counts(model)
    assert counts == {"Identity": 3, "Loop": 1} and total == 4 and top == 2
    assert onnx_check.opset(model) == 17


def test_annotate_writes_layouts_and_config(tmp_path):
    path = str(tmp_path / "tiny.onnx")
    tiny_model(path)
    onnx_check.annotate(path, CFG, "TNF", "NTC", target="x", preset="smoke")
    meta = onnx_check.metadata(onnx.load(path))
    assert meta["input_layout"] == "TNF" and meta["output_layout"] == "NTC" and meta["target"] == "x"
    assert onnx_check._config_of(meta) == CFG
    assert not os.path.exists(path + ".partial")
    with pytest.raises(ValueError):
        onnx_check.annotate(path, CFG, "NCT", "TNC")


def test_export_failed_and_skipped_sections():
    try:
        raise RuntimeError("Unsupported: ONNX export of operator rnn_relu\nmore detail")
    except RuntimeError as e:
        section = onnx_check.export_failed("torch.onnx.export", "2.13.0", e, op="bidirectional RNN")
    assert section["status"] == "failed" and section["failed_op"] == "bidirectional RNN"
    assert section["reason"] == "bidirectional RNN: RuntimeError: Unsupported: ONNX export of operator rnn_relu"
    assert onnx_check.skipped("fp32 only; this run is bf16")["status"] == "skipped"
    assert "failed" in onnx_check.summary_line(section)


# ---- the command line's bad input: one line, exit 2, before anything runs --------------------------------
def test_cli_missing_file():
    assert_one_line_error(cli("/nonexistent/model.onnx"), "/nonexistent/model.onnx", "no such file")


def test_cli_corrupt_file(tmp_path):
    path = tmp_path / "corrupt.onnx"
    path.write_bytes(os.urandom(4096))
    assert_one_line_error(cli(path), "not a readable ONNX model")
    truncated = tmp_path / "truncated.onnx"
    tiny_model(tmp_path / "whole.onnx")
    truncated.write_bytes((tmp_path / "whole.onnx").read_bytes()[:-20])
    assert_one_line_error(cli(truncated), str(truncated))


def test_cli_file_without_ds2_metadata(tmp_path):
    path = tmp_path / "foreign.onnx"
    tiny_model(path)
    assert_one_line_error(cli(path), "no DS2 metadata")


def test_cli_missing_weights(tmp_path):
    path = str(tmp_path / "model.onnx")
    tiny_model(path)
    onnx_check.annotate(path, CFG)
    assert_one_line_error(cli(path), "model.npz does not exist")


# ---- every notebook's section 11b on the smoke run ------------------------------------------------------
#: what each target's ONNX route does on this CPU (smoke): "ok", or a fragment of the recorded reason.  A route
#: that starts or stops working shows here first; the README's table says the same.
EXPECTED = {
    "pytorch": "ok", "pytorch+compile": "ok",
    "tensorflow": "ok", "tensorflow+xla": "ok",
    "keras-tensorflow": "ok", "keras-tensorflow+xla": "ok",
    "keras-jax": "ok",
    "keras-torch": "at the traced time length 1",      # Keras's torch export fixes every None dimension to 1
    "jax": "ok", "jax+unroll": "ok", "jax+hoist": "ok", "jax+bidir2": "ok",
    "mxnet": "ok", "mxnet+static": "ok",
    "cntk": "ok",
}
NAMES = [t for t in selected_targets() if t in EXPECTED]


def assert_onnx_verdict(target, o):
    """What every run's onnx section holds, at any width: the route's expected failure, or ok within 1e-4 of the
    framework and of the NumPy reference on the held-out batch. True when the route worked."""
    if EXPECTED[target] != "ok":
        assert o["status"] == "failed" and EXPECTED[target] in o["reason"], (target, o)
        return False
    assert o["status"] == "ok", (target, o.get("reason"))
    assert o["batch"] == {"batch_size": 3, "seconds": 3, "frames": 300, "seed": 1}, (target, o["batch"])
    for key in ("vs_framework", "vs_reference"):
        assert 0 <= o[key]["max_rel"] <= onnx_check.ONNX_RTOL, (target, key, o[key])
    return True


@pytest.mark.parametrize("target", full_targets(NAMES))
def test_onnx_section_of_every_row(smoke, target):
    rec = ok_record(smoke, target)
    o = rec.get("onnx")
    assert o, "the record of %s has no onnx section" % target
    assert o["exporter"] and o.get("exporter_version"), o
    if not assert_onnx_verdict(target, o):
        return
    path = repo_path(o["path"])
    assert os.path.getsize(path) == o["bytes"] > 0
    assert o["opset"] >= 9 and o["nodes_total"] >= 10 and sum(o["nodes"].values()) == o["nodes_total"]
    tp = o["throughput"]
    assert tp["onnxruntime"]["audio_s_per_s"] > 0 and tp["framework"]["audio_s_per_s"] > 0
    meta = onnx_check.metadata(onnx.load(path, load_external_data=False))
    assert meta["input_layout"] in onnx_check.INPUT_LAYOUTS and meta["output_layout"] in onnx_check.OUTPUT_LAYOUTS
    assert onnx_check._config_of(meta) == CFG


def perturbed_copy(path, out):
    """The file with its largest weight (an initializer, or a Constant node's value) moved by 1 % of its largest
    magnitude: a wrong export."""
    from onnx import numpy_helper
    model = onnx.load(path)
    tensors = list(model.graph.initializer) + [a.t for n in model.graph.node if n.op_type == "Constant"
                                               for a in n.attribute if a.name == "value"]
    tensor = max((t for t in tensors if t.data_type == onnx.TensorProto.FLOAT), key=lambda t: int(np.prod(t.dims)))
    w = numpy_helper.to_array(tensor)
    tensor.CopyFrom(numpy_helper.from_array((w + 0.01 * np.abs(w).max()).astype(w.dtype), tensor.name))
    onnx.save(model, str(out))
    return tensor.name


@pytest.mark.parametrize("target", [t for t in NAMES if EXPECTED[t] == "ok" and "+" not in t])
def test_cli_passes_the_export_and_fails_a_perturbed_weight(smoke, target, tmp_path):
    rec = ok_record(smoke, target)
    path = repo_path(rec["onnx"]["path"])
    weights = repo_path(rec["export"]["path"])
    proc = cli(path, "--weights", weights)
    assert proc.returncode == 0 and ": ok" in proc.stdout, (proc.stdout, proc.stderr)
    bad = tmp_path / "perturbed.onnx"
    name = perturbed_copy(path, bad)
    proc = cli(bad, "--weights", weights)
    assert proc.returncode == 1 and "MISMATCH" in proc.stdout, (name, proc.stdout, proc.stderr)


# ---- the committed full-width records (results/experiments/onnx_cpu_amd, the `cpu` preset) --------------
FULL_WIDTH_RECORDS = os.path.join(ROOT, "results", "experiments", "onnx_cpu_amd", "records")


def test_full_width_records_hold_the_onnx_check():
    """The full model (92 M parameters) through each exporter: the records a `--preset cpu` run committed."""
    assert os.path.isdir(FULL_WIDTH_RECORDS), "no committed full-width ONNX records under %s" % FULL_WIDTH_RECORDS
    full_width = results.read_records(FULL_WIDTH_RECORDS)
    config = get_preset("cpu").config
    assert sorted(r["target"] for r in full_width) == sorted(TARGETS)       # one record per row of record
    for rec in full_width:
        name = rec["target"]
        assert rec["status"] == "ok" and rec["preset"] == "cpu", (name, rec["status"], rec["error"])
        assert rec["config"]["rnn_hidden"] == config.rnn_hidden and rec["config"]["rnn_layers"] == config.rnn_layers
        if assert_onnx_verdict(name, rec["onnx"]):      # the full model's float32 weights are in the file
            assert rec["onnx"]["bytes"] > 4 * config.param_count, (name, rec["onnx"]["bytes"])


# ---- results.md -----------------------------------------------------------------------------------------
def test_onnx_table_rows():
    from tests.test_report import LOSSES, fixture_record
    ok = fixture_record("pytorch", "PyTorch", LOSSES, 500.0, onnx={
        "status": "ok", "reason": None, "exporter": "torch.onnx.export", "exporter_version": "2.13.0", "opset": 18,
        "bytes": 2_500_000, "nodes": {"RNN": 2, "Conv": 2, "Clip": 4, "Add": 1}, "nodes_total": 9,
        "vs_framework": {"max_rel": 3e-7}, "vs_reference": {"max_rel": 4e-7}, "workaround": None,
        "throughput": {"onnxruntime": {"audio_s_per_s": 900.0}, "framework": {"audio_s_per_s": 300.0}}})
    failed = fixture_record("mxnet", "MXNet", LOSSES, 400.0, onnx=onnx_check.export_failed(
        "mx.onnx.export_model", "1.9.1", "AttributeError: No conversion function registered for op type RNN",
        op="RNN"))
    old = fixture_record("cntk", "CNTK", LOSSES, 400.0)
    broken = results.failed_record("jax", "failed", "boom", framework="JAX", preset="smoke", precision="fp32")
    rows = checks.onnx_rows([ok, failed, old, broken])
    assert [r["Row"] for r in rows] == ["pytorch fp32", "mxnet fp32"]      # no row for a record without a section
    assert rows[0]["ONNX"] == "ok" and rows[0]["MB"] == 2.5 and rows[0]["Nodes"] == "9 (RNN 2, Conv 2, Clip 4)"
    assert rows[0]["onnxruntime \u00f7 framework"] == 3.0
    assert rows[1]["ONNX"] == "failed" and rows[1]["Reason / workaround"].startswith("RNN: AttributeError")
    text = "\n".join(checks.onnx_section([ok, failed, old]))
    assert "## ONNX exit route" in text and "| pytorch fp32 | smoke | 8 |" in text and "1e-4" in text
    assert "1 older record has no ONNX section" in text and "| cntk" not in text
