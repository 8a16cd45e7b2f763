"""The notebooks' shared anatomy, and the Rosetta pages generated from it."""
import ast
import json
import os
import re
import shutil
import subprocess
from urllib.parse import quote

import pytest

from runner.rosetta import extract
from runner.rosetta import pages
from runner.run.targets import TARGETS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(set(t.notebook for t in TARGETS.values()))
SECTIONS = ["## 1. Environment", "## 2. Parameters", "## 3. Data", "## 4. Model", "## 5. Canonical weights",
            "## 6. Loss and correctness check", "## 7. Optimizer and training step", "## 8. Warm-up",
            "## 9. Timed epoch", "## 10. Forward-only timing", "## 11. Export",
            "## 12. Where the time goes", "## 13. Result record"]
COMMON_PARAMETERS = {"preset", "batch_size", "scale", "precision", "seed", "device", "forward_repeats",
                     "init_weights", "result_path", "target"}


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
    for line in source(params[0]).splitlines():     # papermill skips (and warns about) a line with two '='
        assert line.count("=") <= 1, "papermill cannot parse the parameter line %r" % line


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_has_every_section_in_order(name):
    nb = load(name)
    headings = [line.strip() for c in nb["cells"] if c["cell_type"] == "markdown"
                for line in source(c).splitlines() if re.match(r"^## \d+\. ", line)]
    assert [h for h in headings if h in SECTIONS] == SECTIONS, headings
    tags = [t[len("rosetta:"):] for c in nb["cells"] for t in c.get("metadata", {}).get("tags", [])
            if t.startswith("rosetta:")]
    wanted = [step for step, _, _ in pages.STEPS]
    steps = [t for t in tags if t in wanted]
    steps = [t for i, t in enumerate(steps) if i == 0 or steps[i - 1] != t]   # a step may span consecutive cells
    assert steps == sorted(set(tags) & set(wanted), key=wanted.index)  # in step order
    assert set(wanted) <= set(tags), set(wanted) - set(tags)


#: names that belong to data-parallel training: none of them may appear in the code of sections 3-7
DATA_PARALLEL_NAMES = re.compile(r"\b(workers|world|my_share|strategy|kv|mesh|replicate|all_reduce|dist)\b")


def sections_of(nb):
    """[(heading of the enclosing '## ' section, cell)] in notebook order."""
    out, current = [], None
    for cell in nb["cells"]:
        for line in source(cell).splitlines() if cell["cell_type"] == "markdown" else ():
            if line.startswith("## "):
                current = line.strip()
        out.append((current, cell))
    return out


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_sections_1_to_7_are_the_translation_and_data_parallel_training_is_one_later_section(name):
    """The translation reads without interruption: no data-parallel subsection or name in sections 3-7 (section 2's
    settings may check the workers and, where the framework needs it before its first operation, join the
    process group); every data-parallel subsection is in section 9b, between the timed epoch and section 10."""
    cells = sections_of(load(name))
    headings = [h for h in dict.fromkeys(h for h, _ in cells) if h]
    assert "## 9b. Training on W workers" in headings, headings
    i = headings.index("## 9b. Training on W workers")
    assert headings[i - 1] == "## 9. Timed epoch" and headings[i + 1].startswith("## 10. "), headings
    translation = SECTIONS[2:7]
    for heading, cell in cells:
        text = source(cell)
        if heading in translation and cell["cell_type"] == "code":
            found = DATA_PARALLEL_NAMES.findall(text)
            assert not found, "%s: %s uses %s" % (name, heading, sorted(set(found)))
        for line in text.splitlines() if cell["cell_type"] == "markdown" else ():
            if line.startswith("###") and "data-parallel" in line.lower():
                assert heading == "## 9b. Training on W workers", "%s: %r is in %s" % (name, line, heading)


def test_rosetta_pages_are_current():
    assert pages.stale() == [], "run: python -m runner.rosetta"


def test_rosetta_pages_show_every_framework_for_every_step():
    data = pages.collect()
    assert len(data) == len(NOTEBOOKS)
    md = pages.render_markdown(data)
    for _, title, _ in pages.STEPS:
        section = md.split("## %s\n" % title)[1].split("\n## ")[0]
        for name in data:
            assert "### %s\n" % name in section
    html = pages.render_html(data)
    assert html.count("<h2>") == len(pages.STEPS) + 1 and "<select id=\"left\">" in html   # + the translation


def test_rosetta_pages_link_every_translation():
    md = pages.render_markdown(pages.collect())
    section = md.split("## %s\n" % pages.TRANSLATION_TITLE)[1].split("\n## ")[0]
    for row in extract.rows():
        rel = os.path.relpath(extract.output_path(row), ROOT)
        assert "](%s)" % rel in section and os.path.exists(extract.output_path(row)), row
    page = pages.render_html(pages.collect())
    for row in extract.rows():
        assert "href=\"%s\"" % os.path.relpath(extract.output_path(row), os.path.join(ROOT, "docs")) in page


# ---- docs/rosetta.html in a real browser -------------------------------------------------------------
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium():
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if not browser:
        pytest.skip("no Chromium to open docs/rosetta.html in (apt-get install chromium; .ci/run installs it)")
    return browser


def rendered_dom(tmp_path, fragment):
    """The page's DOM after its script ran, as headless Chromium has it."""
    url = "file://%s#%s" % (pages.OUTPUTS["html"], fragment)
    proc = subprocess.run([chromium()] + CHROMIUM_FLAGS + ["--user-data-dir=%s" % (tmp_path / "profile"),
                                                          "--dump-dom", url],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=180)
    assert proc.returncode == 0 and "<h2>" in proc.stdout, proc.stderr[-2000:]
    from bs4 import BeautifulSoup
    return BeautifulSoup(proc.stdout, "html.parser")


@pytest.mark.parametrize("left, right", [("MXNet", "CNTK"), ("Keras 3", "PyTorch")])
def test_rosetta_page_in_chromium_shows_the_two_frameworks_rendered(tmp_path, left, right):
    names = list(pages.collect())
    assert left in names and right in names
    dom = rendered_dom(tmp_path, "left=%s&right=%s" % (quote(left), quote(right)))
    rows = dom.select("div.row")
    assert len(rows) == len(pages.STEPS) + 1
    links = {p["data-fw"]: p for p in rows[0].select("div.col[data-fw]") if not p.has_attr("hidden")}
    assert set(links) == {left, right}                                # the translation files of the two shown
    for name, pane in links.items():
        rows_of = [t for t in extract.rows()
                   if pages.notebooks().get(os.path.basename(extract.notebook_of(t))) == name]
        assert len(pane.select("a[href$='.py']")) == len(rows_of), (name, pane.get_text())
    for row, (tag, _, _) in zip(rows[1:], pages.STEPS):
        panes = row.select("div.col[data-fw]")
        assert sorted(p["data-fw"] for p in panes) == sorted(names)
        shown = {p["data-fw"]: p for p in panes if not p.has_attr("hidden")}
        assert set(shown) == {left, right}, (tag, set(shown))          # the other frameworks are hidden
        assert shown[left]["data-side"] == "left" and shown[right]["data-side"] == "right"
        assert "order: 0" in shown[left]["style"] and "order: 1" in shown[right]["style"]
        for name, pane in shown.items():
            if tag == "defaults":          # the overrides table: a real table with code spans
                table = pane.select_one("div.md table")
                assert table is not None, (name, pane.get_text()[:300])
                assert [th.get_text() for th in table.select("thead th")] == ["Default", "Here", "Why"]
                assert len(table.select("tbody tr")) >= 3 and table.select("td code")
                assert "|---|" not in pane.get_text()
            if tag in ("environment", "model", "loss", "optimizer"):     # highlighted code: Pygments' tokens
                spans = pane.select("div.hl pre span[class]")
                kinds = set(c for span in spans for c in span["class"])
                assert {"n", "o"} <= kinds and len(kinds) >= 4, (name, tag, kinds)   # names, operators, ...
                if tag == "environment":
                    assert "kn" in kinds, (name, kinds)                             # import


def test_rosetta_page_is_one_offline_file():
    with open(pages.OUTPUTS["html"]) as f:
        page = f.read()
    assert "<style>" in page and ".hl .k " in page                 # Pygments' CSS inline
    for external in ("<link", "src=\"http", "src='http", "@import", "url(http"):
        assert external not in page
    assert "<table>" in page and "<code>" in page and "| --- |" not in page    # Markdown rendered when generated


def test_markdown_cells_are_rendered_with_mistune_and_pygments():
    to_html = pages._markdown_renderer(pages._highlighter())
    out = to_html("## Notes\n\n- one `x`\n- two\n\n1. first\n\n| a | b |\n|---|---|\n| `c` | d |\n\n"
                  "<script>alert(1)</script>\n\n```python\nimport os\n```\n")
    assert '<h4 class="nbh">Notes</h4>' in out and "<h2" not in out        # below the page's own headings
    assert "<ul>\n<li>one <code>x</code></li>" in out and "<ol>" in out
    assert "<table>" in out and "<th>a</th>" in out and "<td><code>c</code></td>" in out
    assert "<script>" not in out and "&lt;script&gt;" in out                # raw HTML is shown, not run
    assert '<div class="hl"><pre><span></span><span class="kn">import</span>' in out


def shown_pair(dom):
    """The two frameworks the page shows, left first, and the message about a name it does not know (or None)."""
    row = dom.select("div.row")[1]
    side = {p["data-side"]: p["data-fw"] for p in row.select("div.col[data-fw]") if not p.has_attr("hidden")}
    note = dom.select_one("#pick-note")
    return side.get("left"), side.get("right"), None if note is None or note.has_attr("hidden") else note.get_text()


def test_a_pair_link_takes_row_names_and_labels_in_any_case_and_says_when_it_does_not_know_one(tmp_path):
    names = list(pages.collect())
    aliases = pages.pair_names(names)
    for row in TARGETS:                                                   # every row name leads to its notebook
        assert aliases[row] == pages.notebooks()[TARGETS[row].notebook], row
    # one page load each (about 3 s in Chromium): a row name in upper and lower case, a label quoted and lower-cased
    for fragment, want in [("left=KERAS-TORCH&right=mxnet", ("Keras 3", "MXNet")),
                           ("left=%s&right=cntk" % quote("keras 3"), ("Keras 3", "CNTK"))]:
        left, right, note = shown_pair(rendered_dom(tmp_path / fragment.replace("&", "_"), fragment))
        assert (left, right) == want and note is None, (fragment, left, right, note)
    left, right, note = shown_pair(rendered_dom(tmp_path / "unknown", "left=pytorch&right=Nope"))
    assert left == "PyTorch" and right == names[1]
    assert note and "\u201cNope\u201d (right)" in note and "keras-torch" in note, note


#: measures, after the page's own script: every panel shown, then each table's width against its panel's
MEASURE = """<script>
window.addEventListener("load", function () {
  document.querySelectorAll("div.col[data-fw]").forEach(function (c) { c.hidden = false; });
  const out = [];
  document.querySelectorAll("div.col[data-fw] table").forEach(function (t) {
    const col = t.closest("div.col"), box = col.getBoundingClientRect(), tb = t.getBoundingClientRect();
    out.push({fw: col.dataset.fw, left: tb.left - box.left, right: tb.right - box.right, width: tb.width,
              panel: box.width, viewport: window.innerWidth});
  });
  const pre = document.createElement("pre");
  pre.id = "measured";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script></body>"""


@pytest.mark.parametrize("width", [1280, pytest.param(1400, marks=pytest.mark.full), 1920])
def test_rosetta_page_in_chromium_keeps_every_table_inside_its_panel(tmp_path, width):
    """At common window widths each table of every framework's panel wraps inside the panel: none is wider than
    its panel or reaches past its right edge (the "defaults this notebook overrides" tables are the widest).  The
    default tier loads the narrowest and the widest (a page load is about 4 s); ``--full`` adds 1400."""
    with open(pages.OUTPUTS["html"]) as f:
        page = f.read()
    probe = tmp_path / "rosetta.html"
    probe.write_text(page.replace("</body>", MEASURE, 1))
    proc = subprocess.run([chromium()] + CHROMIUM_FLAGS + [
        "--user-data-dir=%s" % (tmp_path / "profile"), "--window-size=%d,1000" % width, "--virtual-time-budget=5000",
        "--dump-dom", "file://%s#left=PyTorch&right=JAX" % probe],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    from bs4 import BeautifulSoup
    measured = json.loads(BeautifulSoup(proc.stdout, "html.parser").select_one("#measured").get_text())
    assert measured and all(abs(m["viewport"] - width) <= 20 for m in measured), measured[:1]
    assert {m["fw"] for m in measured} >= {"PyTorch", "JAX/Flax"}                 # the overrides tables at least
    wide = [m for m in measured if m["width"] > m["panel"] + 0.5 or m["right"] > 0.5]
    assert not wide, wide
