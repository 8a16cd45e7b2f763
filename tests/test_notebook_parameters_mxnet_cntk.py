"""The MXNet and CNTK notebooks' parameters, variants and precisions.

Without a framework: what the parameters cells declare, that papermill can parse them, that the
notebooks' variants are the runner's, and that an unknown variant is refused in one line before any
framework loads; the ``skip`` parameter as the PyTorch notebook declares it, a bad one refused before any
framework loads, and sections 10, 11 and 11b run with each ``skip`` (tests/notebook_cells.py): a skipped part
touches nothing and says so.  With ``--full``, a smoke run of both rows with every part skipped.  With the MXNet environment (DS2_TEST_FRAMEWORKS selects ``mxnet``): the variant
``mxnet+static`` trains exactly like the row of record, and bf16 runs on a CPU."""
import ast
import json
import os

import numpy as np
import pytest

from common.spec import LOSS_RTOL
from runner.run import targets
from tests.conftest import FIRST_LOSS_RTOL, K_STEPS, ROOT, ok_record, selected_targets, smoke_run, variant_rtol
from tests import notebook_cells
from tests.notebook_cells import (BAD_SKIPS, EVERY_PART, SKIPS, assert_declared_as_in_pytorch, assert_every_part_skipped,
                                  assert_skipped_parts, run_cell, settings_names)

NOTEBOOKS = {"mxnet": "MXNet_DS2.ipynb", "cntk": "CNTK_DS2.ipynb"}
SELECTED = selected_targets()


def notebook(name):
    with open(os.path.join(ROOT, "notebooks", NOTEBOOKS[name])) as f:
        return json.load(f)


def cell(nb, tag):
    cells = [c for c in nb["cells"] if tag in c.get("metadata", {}).get("tags", [])]
    assert len(cells) == 1, tag
    return "".join(cells[0]["source"])


def parameters(name):
    return notebook_cells.parameters(NOTEBOOKS[name])


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_variant_profile_and_forward_repeats_parameters(name):
    p = parameters(name)
    assert p["variant"] == "" and p["profile"] is False and p["forward_repeats"] is None


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_papermill_parses_every_parameter_line(name):
    """papermill skips (and warns about) a line with more than one '=': a comment must not hold one."""
    for line in cell(notebook(name), "parameters").splitlines():
        assert line.count("=") <= 1, line


def settings_namespace(name, variant):
    """What the settings cell sees of the parameters cell, with ``variant`` replaced."""
    namespace = {}
    exec(cell(notebook(name), "parameters"), namespace)
    namespace["variant"] = variant
    return namespace


def test_mxnet_variants_are_the_runners():
    source = cell(notebook("mxnet"), "rosetta:settings")
    tree = ast.parse(source)
    declared = [ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                and any(getattr(t, "id", None) == "VARIANTS" for t in node.targets)]
    assert len(declared) == 1
    runner = {t.parameters["variant"] for t in targets.variants_of("mxnet")}
    assert set(declared[0]) == {""} | runner == {"", "static"}


def test_cntk_has_no_variant_in_the_runner():
    assert targets.variants_of("cntk") == []


@pytest.mark.parametrize("name, listed", [("mxnet", "static"), ("cntk", "variant=''")])
def test_an_unknown_variant_is_refused_in_one_line_before_the_framework_loads(name, listed):
    source = cell(notebook(name), "rosetta:settings")
    with pytest.raises(ValueError) as err:
        exec(source, settings_namespace(name, "fastest"))   # the check comes before any framework call
    message = str(err.value)
    assert "\n" not in message and "'fastest'" in message and listed in message


# ---- with the MXNet environment -------------------------------------------------------------------------
needs_mxnet = pytest.mark.skipif("mxnet" not in SELECTED, reason="the mxnet target is not selected")


@pytest.fixture(scope="module")
def mxnet_runs(smoke, smoke_bf16):
    """The row of record and the variant (fp32), and bf16: the session's smoke runs (tests/conftest.py)."""
    return smoke, smoke_bf16


def first_steps(rec, k=K_STEPS):
    return np.array(rec["losses"]["warmup"] + rec["losses"]["train"], dtype=np.float64)[:k]


@pytest.mark.full
@needs_mxnet
def test_mxnet_static_variant_trains_like_the_row_of_record(mxnet_runs):
    fp32, _ = mxnet_runs
    row, var = fp32.record("mxnet"), fp32.record("mxnet+static")
    assert row["status"] == var["status"] == "ok", (row["error"], var["error"])
    assert row["variant"] == "" and row["options"]["variant"] == "" and row["options"]["static_shape"] is False
    assert var["variant"] and "static_shape" in var["variant"]
    assert var["options"]["variant"] == "static" and var["options"]["static_shape"] is True
    assert var["checks"]["loss"]["ok"] and var["checks"]["loss"]["rel_diff"] <= FIRST_LOSS_RTOL
    rel = np.abs(first_steps(var) - first_steps(row)) / np.abs(first_steps(row))
    assert rel.max() <= variant_rtol("mxnet+static"), rel
    for rec in (row, var):
        square = rec["flops"]["peak_matmul"]["square"]
        assert square["shape"] == [1024, 1024, 1024] and square["flops_per_s"] > 0
        assert 0 < rec["flops"]["efficiency"] < 1


# an AVX2-only CPU (the CI's) has no oneDNN bfloat16 convolution: the runner skips the row there with this
# reason (tests/test_run_all.py: test_which_precisions_run_on_a_cpu), and so does this test, saying it
MXNET_BF16_ON_THIS_CPU = targets.TARGETS["mxnet"].cpu_precision_reason("bf16")


@pytest.mark.full
@needs_mxnet
@pytest.mark.skipif(MXNET_BF16_ON_THIS_CPU is not None, reason=str(MXNET_BF16_ON_THIS_CPU))
def test_mxnet_bf16_runs_on_a_cpu(mxnet_runs):
    _, bf16 = mxnet_runs
    rec = bf16.record("mxnet", precision="bf16")
    if rec["status"] == "skipped":      # the runner's CPU rule, not the notebook: it does not run the notebook
        pytest.skip(rec["error"])
    assert rec["status"] == "ok", rec["error"]
    loss = rec["checks"]["loss"]
    assert loss["ok"] and loss["rtol"] == LOSS_RTOL["bf16"] and loss["precision"] == "bf16"
    assert rec["options"]["amp"].startswith("bfloat16")


# ---- the skip parameter: the PyTorch notebook's, in each notebook's own sections 10, 11 and 11b ---------------------
@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_skip_is_declared_checked_and_recorded_as_in_the_pytorch_notebook(name):
    assert parameters(name)["skip"] == []
    assert_declared_as_in_pytorch(NOTEBOOKS[name])


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
@pytest.mark.parametrize("skip, words", BAD_SKIPS)
def test_a_bad_skip_is_refused_in_one_line_before_the_framework_loads(name, skip, words):
    given = dict(parameters(name), **settings_names(), skip=skip)
    with pytest.raises(ValueError) as err:               # not Touched: nothing of the framework is reached
        run_cell(NOTEBOOKS[name], "rosetta:settings", whole=True, **given)
    assert "\n" not in str(err.value) and words in str(err.value), str(err.value)


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
@pytest.mark.parametrize("skip", SKIPS, ids=",".join)
def test_a_skipped_part_touches_nothing_and_says_so(name, skip):
    """Sections 10, 11 and 11b run in this interpreter, without the framework (tests/notebook_cells.py)."""
    assert_skipped_parts(NOTEBOOKS[name], skip)


@pytest.fixture(scope="module")
def skipped_run(tmp_path_factory):
    """Both rows on smoke with every part skipped, in one run_all.py."""
    rows = [name for name in sorted(NOTEBOOKS) if name in SELECTED]
    if not rows:
        pytest.skip("neither mxnet nor cntk is selected (DS2_TEST_FRAMEWORKS)")
    return smoke_run(tmp_path_factory, "skip_mxnet_cntk", rows, "--skip", ",".join(EVERY_PART))


@pytest.mark.full
@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_a_run_with_every_part_skipped_trains_checks_and_records_it(skipped_run, name):
    if name not in SELECTED:
        pytest.skip("%s is not selected (DS2_TEST_FRAMEWORKS)" % name)
    assert_every_part_skipped(skipped_run, ok_record(skipped_run, name))
