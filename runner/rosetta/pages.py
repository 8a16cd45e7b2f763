"""The side-by-side Rosetta pages, generated from the notebooks' cell tags.

Every notebook tags its cells with the step they implement (``rosetta:model``, ...). This module
collects each step from every notebook and writes

- ``ROSETTA.md``: one section per step, every framework's code for it in turn (reads on GitHub);
- ``docs/rosetta.html``: one self-contained page with two columns, each showing the framework you
  pick, step by step -- translate from one framework to another at a glance.

    python -m runner.rosetta            # regenerate both (run_all.py does it too)
    python -m runner.rosetta --check    # exit 1 if the committed pages or translations are not current (CI)
    python -m runner.rosetta --extract pytorch   # docs/translations/ds2_pytorch.py only (a notebook's name, or "all")

Each notebook's cells tagged ``translation`` (model, canonical weights' loading, CTC loss, one training step) are also
written as one standalone file, ``docs/translations/ds2_<name>.py`` (runner/rosetta/extract.py; ``ds2_keras.py`` for the
three Keras 3 rows); both pages link to them.
"""
import html
import json
import os
import sys
from collections import OrderedDict
from typing import Dict, List

from common.results import atomic_write_text

from runner.rosetta import extract as rosetta_extract
from runner.base import ROOT
from runner.run.targets import ALL_TARGETS, TARGETS
from runner.validate import OneLineParser, refuse

#: the steps, in notebook order: (tag, title, what a reader compares there)
STEPS = [
    ("defaults", "Defaults each notebook overrides", "Where the framework's defaults differ from the spec, and why."),
    ("environment", "1. Environment", "Imports."),
    ("parameters", "2. Parameters", "The papermill parameters cell: the same names everywhere."),
    ("settings", "2b. Derived settings", "Preset lookup, device, precision switches."),
    ("data", "3. Data", "The shared DeepMark iterator and the conversion of a batch to the framework."),
    ("model", "4. Model", "The DS2 model with the framework's highest-level API."),
    ("weights", "5. Canonical weights", "Loading the shared NumPy weights into the framework's layouts."),
    ("loss", "6a. Loss", "CTC, blank 0, summed over the batch / batch size."),
    ("check", "6b. Correctness check", "First-batch loss against the NumPy reference."),
    ("optimizer", "7. Optimizer and training step", "SGD with momentum 0.9 and one training step."),
    ("warmup", "8. Warm-up", "One untimed step per batch shape."),
    ("epoch", "9. Timed epoch", "The whole iterator once, synchronised per step."),
    ("distributed", "9b. Training on W workers", "Data-parallel: W processes, each with its share of the global "
                                                 "batch; the gradients and the BatchNorm statistics are the global "
                                                 "batch's. The same warm-up and timed epoch (one worker: skipped)."),
    ("forward", "10. Forward-only timing", "Forward pass per utterance length."),
    ("peak", "10b. The device's matmul peak", "Dense matrix products at the run's precision: the roofline every row "
                                              "is held against."),
    ("export", "11. Export", "The trained model in the canonical format (the inverse of section 5), checked in "
                             "inference mode against the NumPy reference; the framework's own checkpoint."),
    ("onnx", "11b. Export to ONNX", "The inference-mode model through the framework's own ONNX exporter (dynamic batch and "
                                    "time axes), run by onnxruntime on a held-out batch and held to the framework's "
                                    "logits and the NumPy reference's; what the exporter cannot express, and the "
                                    "workaround."),
    ("profile", "12. Where the time goes", "One training step under the framework's own profiler, reduced to "
                                           "shares of convolutions, RNN, CTC, BatchNorm and the optimizer (after "
                                           "the export: its steps train the model further)."),
    ("learn", "12b. Learning a real task", "A learn preset only: the same training step on spoken English from the "
                                           "canonical weights, an inference-mode forward pass returning argmax ids "
                                           "every K steps, to a target CER (common/learn.py)."),
    ("record", "13. Result record", "The JSON record for results.md."),
]


def notebooks() -> "OrderedDict":
    """Notebook file -> display name, in the order of the targets (one entry per notebook)."""
    out = OrderedDict()
    for t in TARGETS.values():
        if t.notebook not in out and os.path.exists(t.notebook_path):
            out[t.notebook] = t.notebook.replace("_DS2.ipynb", "").replace("_", "/").replace("Keras3", "Keras 3")
    return out


def pair_names(names: List[str]) -> "OrderedDict":
    """{lower-case name: page label} that a pair link (``rosetta.html#left=jax&right=keras-torch``) accepts: each
    label ("JAX/Flax"), its parts ("JAX", "Flax") and its spelling without spaces ("Keras3"), and every row and
    variant target ("jax", "keras-torch", "pytorch+compile"), matched without regard to case."""
    labels = {nb: name for nb, name in notebooks().items()}
    out = OrderedDict()
    for name in names:
        for alias in [name, name.replace(" ", "")] + name.split("/"):
            out.setdefault(alias.lower(), name)
    for row, target in ALL_TARGETS.items():
        if labels.get(target.notebook) in names:
            out.setdefault(row.lower(), labels[target.notebook])
    return out


def cells_by_step(path: str) -> Dict[str, List[dict]]:
    """{step: [{"type": "code"|"markdown", "source": str}, ...]} of one notebook."""
    with open(path) as f:
        nb = json.load(f)
    steps = OrderedDict()
    for cell in nb["cells"]:
        for tag in cell.get("metadata", {}).get("tags", []):
            if tag.startswith("rosetta:"):
                source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
                steps.setdefault(tag[len("rosetta:"):], []).append(
                    {"type": cell["cell_type"], "source": source.strip("\n")})
    return steps


def translation_links(page_dir: str) -> "OrderedDict":
    """Display name -> [(translation name, its path relative to ``page_dir``)], for the notebooks that have one."""
    out = OrderedDict()
    for nb, name in notebooks().items():
        out[name] = [(t, os.path.relpath(rosetta_extract.output_path(t), page_dir)) for t in rosetta_extract.rows()
                     if os.path.basename(rosetta_extract.notebook_of(t)) == nb]
    return out


TRANSLATION_TITLE = "The translation as one file"
TRANSLATION_WHAT = ("The cells tagged `translation` -- model, loading the canonical weights, CTC loss, one training "
                    "step -- as one standalone .py file per notebook (`python -m runner.rosetta --extract NAME`; "
                    "Keras 3's picks its backend by `KERAS_BACKEND`): the framework and NumPy only, the DS2 "
                    "configuration as a dataclass. Run with a weights file that any notebook exports, it builds the "
                    "model, loads the file and takes one training step.")


def collect() -> "OrderedDict":
    return OrderedDict((name, cells_by_step(os.path.join(ROOT, "notebooks", nb)))
                       for nb, name in notebooks().items())


def _block(cell: dict) -> str:
    if cell["type"] == "markdown":   # the notebook's headings become bold text under this page's headings
        return "\n".join("**%s**" % line.lstrip("#").strip() if line.startswith("#") else line
                         for line in cell["source"].splitlines()) + "\n"
    fence = "```"
    while fence in cell["source"]:
        fence += "`"
    return "%spython\n%s\n%s\n" % (fence, cell["source"], fence)


def render_markdown(data: "OrderedDict") -> str:
    names = list(data)
    lines = [
        "# DS2 Rosetta: every step, every framework",
        "",
        "Generated from the notebooks' cell tags by `python -m runner.rosetta`; do not edit. The same DeepSpeech2 "
        "model, data, weights, loss, optimizer and timing in %s. For two frameworks side by side, open "
        "[docs/rosetta.html](docs/rosetta.html) in a browser." % ", ".join(names),
        "",
        "Steps: " + " · ".join("[%s](#%s)" % (title, _anchor(title)) for _, title, _ in STEPS),
        "",
        "## %s" % TRANSLATION_TITLE,
        "",
        TRANSLATION_WHAT,
        "",
    ]
    for name, links in translation_links(ROOT).items():
        lines.append("- %s: %s" % (name, ", ".join("[%s](%s)" % (p, p) for _, p in links) or "_none yet_"))
    lines.append("")
    for tag, title, what in STEPS:
        lines += ["## %s" % title, "", what, ""]
        for name in names:
            cells = data[name].get(tag)
            lines += ["### %s" % name, ""]
            if not cells:
                lines += ["_This notebook has no cell for this step._", ""]
                continue
            lines += [_block(c) for c in cells]
    return "\n".join(lines)


def _anchor(title: str) -> str:
    keep = "".join(ch for ch in title.lower() if ch.isalnum() or ch in " -")
    return keep.replace(" ", "-")


def _highlighter():
    """Python code -> HTML with Pygments' token classes (styled by :func:`_pygments_css`)."""
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import PythonLexer
    lexer, formatter = PythonLexer(), HtmlFormatter(cssclass="hl")
    return lambda code: highlight(code, lexer, formatter)


def _pygments_css() -> str:
    from pygments.formatters import HtmlFormatter
    return HtmlFormatter(style="default").get_style_defs(".hl")


def _markdown_renderer(highlight):
    """Markdown (tables, code spans, lists, fenced code) -> HTML with mistune; raw HTML is escaped,
    a notebook's own headings become small headings under this page's steps, fenced Python is highlighted."""
    import mistune

    class Renderer(mistune.HTMLRenderer):
        def heading(self, text, level, **attrs):
            return "<h4 class=\"nbh\">%s</h4>\n" % text

        def block_code(self, code, info=None):
            if info and info.split()[0] in ("python", "py"):
                return highlight(code)
            return super().block_code(code, info)

    return mistune.create_markdown(escape=True, renderer=Renderer(escape=True), plugins=["table", "strikethrough"])


HTML_STYLE = """
body { font-family: system-ui, sans-serif; margin: 0; }
header { position: sticky; top: 0; background: #f4f4f4; padding: .6em 1em; border-bottom: 1px solid #ccc; z-index: 1; }
select { font-size: 1em; margin: 0 .5em; }
h2 { margin: 1.2em 1em .2em; font-size: 1.15em; }
p.what { margin: 0 1em .5em; color: #555; }
.row { display: grid; grid-template-columns: 1fr 1fr; gap: 1em; margin: 0 1em; }
.col { min-width: 0; }
.col > b { display: block; margin: .3em 0; }
pre { background: #fafafa; border: 1px solid #ddd; padding: .6em; overflow-x: auto; font-size: 12px; margin: .3em 0; }
.md { font-size: 13px; background: #fffdf3; border: 1px solid #eee; padding: .2em .6em; margin: .3em 0; overflow-x: auto; }
.md h4.nbh { font-size: 1em; margin: .5em 0 .3em; }
.md table { border-collapse: collapse; margin: .4em 0; max-width: 100%; }
.md th, .md td { border: 1px solid #ccc; padding: .2em .4em; vertical-align: top; text-align: left;
                 overflow-wrap: anywhere; }
.md th { background: #f0ede0; }
.md code { background: #f3f3f3; padding: 0 .2em; border-radius: 3px; font-size: 12px; }
.md pre code { background: none; padding: 0; }
.md ul, .md ol { padding-left: 1.4em; }
.none { color: #999; font-style: italic; }
#pick-note { margin: .4em 0 0; padding: .3em .6em; background: #fff0f0; border: 1px solid #d88; color: #900; }
"""

HTML_HEAD = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>DS2 Rosetta: side by side</title>
<style>%s%s</style></head><body>
<header>DS2 Rosetta &mdash; compare
<select id="left"></select> with <select id="right"></select>
<small>(generated from the notebooks by <code>python -m runner.rosetta</code>; do not edit;
link to a pair by label or row name, in any case: <code>rosetta.html#left=MXNet&amp;right=CNTK</code>,
<code>rosetta.html#left=pytorch&amp;right=jax</code>)</small>
<p id="pick-note" role="alert" hidden></p></header>
"""

HTML_SCRIPT = """<script>
const names = %s;
const aliases = %s;   // lower-case label, part of a label, or row name -> label
const rows = %s;
const l = document.getElementById("left"), r = document.getElementById("right");
const note = document.getElementById("pick-note");
for (const n of names) { l.add(new Option(n, n)); r.add(new Option(n, n)); }
function fromHash() {   // rosetta.html#left=MXNet&right=jax picks the two frameworks, by label or row name
  const p = new URLSearchParams(location.hash.slice(1));
  const unknown = [];
  const pick = function (key, fallback) {
    const given = p.get(key);
    if (given === null || given.trim() === "") { return fallback; }
    const key2 = given.trim().toLowerCase();
    if (Object.prototype.hasOwnProperty.call(aliases, key2)) { return aliases[key2]; }
    unknown.push("\u201c" + given + "\u201d (" + key + ")");
    return fallback;
  };
  l.value = pick("left", names[0]);
  r.value = pick("right", names[Math.min(1, names.length - 1)]);
  note.hidden = unknown.length === 0;
  note.textContent = unknown.length === 0 ? "" : "No framework here is called " + unknown.join(" or ") + "; showing "
    + l.value + " and " + r.value + " instead. Pick one above, or link by a label (" + names.join(", ")
    + ") or a row name (" + rows.join(", ") + ").";
}
function show() {   // each step holds every framework once: show the two picked, left one first
  document.querySelectorAll("[data-fw]").forEach(function (el) {
    const fw = el.dataset.fw;
    el.hidden = !(fw === l.value || fw === r.value);
    if (el.hidden) { delete el.dataset.side; } else { el.dataset.side = fw === l.value ? "left" : "right"; }
    el.style.order = fw === l.value ? 0 : 1;
  });
  const hash = "#left=" + encodeURIComponent(l.value) + "&right=" + encodeURIComponent(r.value);
  if (location.hash !== hash) { history.replaceState(null, "", hash); }
}
l.onchange = r.onchange = function () { note.hidden = true; show(); };
window.addEventListener("hashchange", function () { fromHash(); show(); });
fromHash(); show();
</script></body></html>
"""


def render_html(data: "OrderedDict") -> str:
    names = list(data)
    highlight = _highlighter()
    markdown = _markdown_renderer(highlight)
    parts = [HTML_HEAD % (HTML_STYLE, _pygments_css())]
    parts.append("<h2>%s</h2><p class=\"what\">%s</p><div class=\"row\">" % (
        html.escape(TRANSLATION_TITLE), markdown(TRANSLATION_WHAT)[3:-5]))
    for name, links in translation_links(os.path.dirname(OUTPUTS["html"])).items():
        body = ", ".join("<a href=\"%s\"><code>%s</code></a>" % (html.escape(p), html.escape(os.path.basename(p)))
                         for _, p in links) or "<span class=\"none\">none yet</span>"
        parts.append("<div class=\"col\" data-fw=\"%s\"><b>%s</b><p>%s</p></div>" % (
            html.escape(name), html.escape(name), body))
    parts.append("</div>")
    for tag, title, what in STEPS:
        parts.append("<h2>%s</h2><p class=\"what\">%s</p><div class=\"row\">" % (html.escape(title), html.escape(what)))
        for name in names:
            cells = data[name].get(tag) or []
            body = "".join(("<div class=\"md\">%s</div>" % markdown(c["source"])) if c["type"] == "markdown"
                           else highlight(c["source"]) for c in cells) or "<p class=\"none\">no cell for this step</p>"
            parts.append("<div class=\"col\" data-fw=\"%s\"><b>%s</b>%s</div>" % (html.escape(name), html.escape(name), body))
        parts.append("</div>")
    rows = [row for row, t in TARGETS.items() if notebooks().get(t.notebook) in names]
    parts.append(HTML_SCRIPT % (json.dumps(names), json.dumps(pair_names(names)), json.dumps(rows)))
    return "".join(parts)


OUTPUTS = {
    "md": os.path.join(ROOT, "ROSETTA.md"),
    "html": os.path.join(ROOT, "docs", "rosetta.html"),
}


def render_all() -> Dict[str, str]:
    """{path: text} of both pages and every row's translation."""
    data = collect()
    out = OrderedDict([(OUTPUTS["md"], render_markdown(data)), (OUTPUTS["html"], render_html(data))])
    out.update(rosetta_extract.render_all())
    return out


def leftover_translations() -> List[str]:
    """Files in docs/translations/ that no notebook generates (a translation renamed or merged)."""
    if not os.path.isdir(rosetta_extract.OUTPUT_DIR):
        return []
    wanted = {rosetta_extract.output_path(t) for t in rosetta_extract.rows()}
    return sorted(p for p in (os.path.join(rosetta_extract.OUTPUT_DIR, f) for f in os.listdir(rosetta_extract.OUTPUT_DIR))
                  if p.endswith(".py") and p not in wanted)


def write() -> None:
    for path, text in render_all().items():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write_text(path, text)
    for path in leftover_translations():
        os.remove(path)


def extract(row: str) -> str:
    """Write one notebook's translation (``docs/translations/ds2_<name>.py``); returns its path."""
    path = rosetta_extract.output_path(row)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write_text(path, rosetta_extract.render(row))
    return path


def stale() -> List[str]:
    """The pages and translations whose committed text differs from what the notebooks generate now."""
    out = []
    for path, text in render_all().items():
        try:
            with open(path) as f:
                current = f.read()
        except OSError:
            current = None
        if current != text:
            out.append(os.path.relpath(path, ROOT))
    return out + [os.path.relpath(p, ROOT) + " (generated by no notebook)" for p in leftover_translations()]


PROG = "python -m runner.rosetta"


def main(argv=None) -> int:
    """Exit status: 0 written (or current), 1 --check found a page out of date, 2 bad input (one line)."""
    p = OneLineParser(prog=PROG, description="Generate ROSETTA.md and docs/rosetta.html.")
    p.add_argument("--check", action="store_true", help="exit 1 if the pages or translations are not current")
    p.add_argument("--extract", metavar="NAME", choices=rosetta_extract.rows() + ["all"],
                   help="write docs/translations/ds2_NAME.py only: the notebook's cells tagged 'translation' as one "
                        "standalone file (names: %s; or all)" % ", ".join(rosetta_extract.rows()))
    args = p.parse_args(argv)
    if args.check and args.extract:
        return refuse(PROG, "--check and --extract %s: --check compares every page and translation, --extract writes "
                            "one; give one" % args.extract)
    if args.extract:
        for row in rosetta_extract.rows() if args.extract == "all" else [args.extract]:
            print("wrote %s" % os.path.relpath(extract(row), ROOT))
        return 0
    if args.check:
        bad = stale()
        if bad:
            print("not current: %s (run python -m runner.rosetta)" % ", ".join(bad), file=sys.stderr)
            return 1
        print("ROSETTA.md, docs/rosetta.html and docs/translations/ are current")
        return 0
    written = render_all()
    write()
    print("wrote %s" % ", ".join(os.path.relpath(p, ROOT) for p in written))
    return 0
