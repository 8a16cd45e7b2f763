"""The PyTorch and TensorFlow notebooks' parameters: a variant switch that
is validated, a profile switch, the preset's forward repeats, and bf16 allowed on a CPU."""
import ast
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = {"PyTorch_DS2.ipynb": {"compile", "graphs", "bidir2"}, "TensorFlow_DS2.ipynb": {"xla"}}


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
