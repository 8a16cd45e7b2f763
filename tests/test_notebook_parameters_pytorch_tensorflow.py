"""The PyTorch and TensorFlow notebooks' parameters: a variant switch that
is validated, a profile switch, the preset's forward repeats, and bf16 allowed on a CPU.  TensorFlow's ``skip``
parameter as the PyTorch notebook declares it, a bad one refused before TensorFlow loads, and sections 10, 11 and 11b
run with each ``skip`` without TensorFlow (tests/notebook_cells.py); with ``--full``, a smoke run with every part
skipped."""
import ast
import json
import os

import pytest

from tests.conftest import ok_record, selected_targets, smoke_run
from tests.notebook_cells import (BAD_SKIPS, EVERY_PART, SKIPS, assert_declared_as_in_pytorch, assert_every_part_skipped,
                                  assert_skipped_parts, run_cell, settings_names)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = {"PyTorch_DS2.ipynb": {"compile", "graphs", "bidir2", "bidir2+graphs"}, "TensorFlow_DS2.ipynb": {"xla"}}


def cells(name):
    with open(os.path.join(ROOT, "notebooks", name)) as f:
        return json.load(f)["cells"]


def tagged(name, tag):
    found = [c["source"] if isinstance(c["source"], str) else "".join(c["source"])
             for c in cells(name) if tag in c.get("metadata", {}).get("tags", [])]
    assert len(found) == 1, "%s: %d cells tagged %s" % (name, len(found), tag)
    return found[0]


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_parameters(name):
    values = {}
    for node in ast.parse(tagged(name, "parameters")).body:
        if isinstance(node, ast.Assign):
            values[node.targets[0].id] = ast.literal_eval(node.value)
    assert values["variant"] == "" and values["profile"] is False and values["forward_repeats"] is None


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_settings_validate_the_variant_and_refuse_only_tf32_on_a_cpu(name):
    settings = tagged(name, "rosetta:settings")
    tree = ast.parse(settings)
    variants = next(ast.literal_eval(n.value) for n in tree.body
                    if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "VARIANTS")
    assert set(variants) == {""} | NOTEBOOKS[name]
    assert "raise ValueError(\"unknown variant" in settings
    assert "needs a CUDA GPU: TF32" in settings and "precision != \"fp32\"" not in settings


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_record_passes_peak_profile_and_the_variant(name):
    record = tagged(name, "rosetta:record")
    assert "peak=peak" in record and "profile=record_profile" in record and '"variant": variant' in record
    assert "record_profile = None" in tagged(name, "rosetta:profile")
    assert "measure_matmul_peak(make_matmul, sync" in tagged(name, "rosetta:peak")


# ---- TensorFlow's skip parameter: the PyTorch notebook's, in its own sections 10, 11 and 11b -----------------------
TF = "TensorFlow_DS2.ipynb"


def tf_parameters():
    return {node.targets[0].id: ast.literal_eval(node.value) for node in ast.parse(tagged(TF, "parameters")).body
            if isinstance(node, ast.Assign)}


def test_tensorflow_declares_checks_and_records_skip_as_pytorch_does():
    assert tf_parameters()["skip"] == []
    assert_declared_as_in_pytorch(TF)


@pytest.mark.parametrize("skip, words", BAD_SKIPS)
def test_a_bad_skip_is_refused_in_one_line_before_tensorflow_loads(skip, words):
    given = dict(tf_parameters(), **settings_names(), skip=skip)
    with pytest.raises(ValueError) as err:               # not Touched: nothing of TensorFlow is reached
        run_cell(TF, "rosetta:settings", whole=True, **given)
    assert "\n" not in str(err.value) and words in str(err.value), str(err.value)


@pytest.mark.parametrize("skip", SKIPS, ids=",".join)
def test_a_skipped_tensorflow_part_touches_nothing_and_says_so(skip):
    """Sections 10, 11 and 11b run in this interpreter, without TensorFlow (tests/notebook_cells.py)."""
    assert_skipped_parts(TF, skip)


@pytest.mark.full
def test_a_tensorflow_run_with_every_part_skipped_trains_checks_and_records_it(tmp_path_factory):
    if "tensorflow" not in selected_targets():
        pytest.skip("tensorflow is not selected (DS2_TEST_FRAMEWORKS)")
    run = smoke_run(tmp_path_factory, "skip_tensorflow", ["tensorflow"], "--skip", ",".join(EVERY_PART))
    assert_every_part_skipped(run, ok_record(run, "tensorflow"))
