"""The notebooks' shared anatomy, and the Rosetta pages generated from it."""
import ast
import json
import os
import re

import pytest

from runner import rosetta
from runner.targets import TARGETS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(set(t.notebook for t in TARGETS.values()))
SECTIONS = ["## 1. Environment", "## 2. Parameters", "## 3. Data", "## 4. Model", "## 5. Canonical weights",
            "## 6. Loss and correctness check", "## 7. Optimizer and training step", "## 8. Warm-up",
            "## 9. Timed epoch", "## 10. Forward-only timing", "## 11. Result record"]
COMMON_PARAMETERS = {"preset", "batch_size", "scale", "precision", "seed", "device", "forward_repeats",
                     "result_path", "target"}


def load(name):
    path = os.path.join(ROOT, "notebooks", name)
    if not os.path.exists(path):
        pytest.fail("notebooks/%s does not exist" % name)
    with open(path) as f:
        return json.load(f)


def source(cell):
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_clean_and_parameterised(name):
    nb = load(name)
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code), "committed with outputs"
    params = [c for c in code if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(params) == 1, "exactly one cell tagged 'parameters'"
    names = {t.id for node in ast.parse(source(params[0])).body if isinstance(node, ast.Assign) for t in node.targets}
    assert COMMON_PARAMETERS <= names, COMMON_PARAMETERS - names


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_has_every_section_in_order(name):
    nb = load(name)
    headings = [line.strip() for c in nb["cells"] if c["cell_type"] == "markdown"
                for line in source(c).splitlines() if re.match(r"^## \d+\. ", line)]
    assert [h for h in headings if h in SECTIONS] == SECTIONS, headings
    tags = [t[len("rosetta:"):] for c in nb["cells"] for t in c.get("metadata", {}).get("tags", [])
            if t.startswith("rosetta:")]
    wanted = [step for step, _, _ in rosetta.STEPS]
    assert [t for t in tags if t in wanted] == sorted(set(tags) & set(wanted), key=wanted.index)  # in step order
    assert set(wanted) <= set(tags), set(wanted) - set(tags)


def test_rosetta_pages_are_current():
    assert rosetta.stale() == [], "run: python -m runner.rosetta"


def test_rosetta_pages_show_every_framework_for_every_step():
    data = rosetta.collect()
    assert len(data) == len(NOTEBOOKS)
    md = rosetta.render_markdown(data)
    for _, title, _ in rosetta.STEPS:
        section = md.split("## %s\n" % title)[1].split("\n## ")[0]
        for name in data:
            assert "### %s\n" % name in section
    html = rosetta.render_html(data)
    assert html.count("<h2>") == len(rosetta.STEPS) and "<select id=\"left\">" in html
