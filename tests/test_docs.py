"""The reader's pages: README.md, docs/*.md, and the generated results.md, ROSETTA.md and docs/rosetta.html.

Every relative link resolves to a file a clone has (tracked by git) and, where it names one, a heading (GitHub's
anchors); no page cites an issue number; no table cell of README.md or docs/ is longer than 150 characters;
README.md stays within 200 lines and its headline is results.md's summary; docs/running.md lists every option
of run_all.py's parser, and only those."""
import glob
import os
import re
import subprocess

import pytest

from tests.conftest import ROOT

PAGES = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
GENERATED = [os.path.join(ROOT, "results.md"), os.path.join(ROOT, "ROSETTA.md")]
HTML_PAGES = sorted(glob.glob(os.path.join(ROOT, "docs", "*.html")))
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
HREF = re.compile(r"""\b(?:href|src)=["']([^"']+)["']""")


def prose(text):
    """The page without its fenced code blocks."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def anchor(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped (hyphens and underscores kept), spaces to
    hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    with open(path) as f:
        return {anchor(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", prose(f.read()), flags=re.M)}


def rel(path):
    return os.path.relpath(path, ROOT)


def tracked():
    """The repository's files as a clone has them (``git ls-files``), and the folders that hold them; None
    without git (an unpacked archive): then a file on disk counts."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             universal_newlines=True)
    except OSError:
        return None
    if out.returncode != 0:
        return None
    files = {os.path.normpath(os.path.join(ROOT, f)) for f in out.stdout.split("\0") if f}
    folders = set()
    for f in files:
        d = os.path.dirname(f)
        while len(d) > len(ROOT) and d not in folders:
            folders.add(d)
            d = os.path.dirname(d)
    return files | folders


TRACKED = tracked()


def broken_links(page, targets, in_clone=TRACKED):
    """The links of ``page`` that lead nowhere in a clone: a file git does not track (or, without git, that is not
    there), or a heading a Markdown page lacks."""
    bad = []
    for target in targets:
        if re.match(r"^[a-z]+:", target):                  # http:, https:, mailto:
            continue
        path, _, frag = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not os.path.exists(resolved) or (in_clone is not None and resolved not in in_clone):
            bad.append("%s: no file %s in a clone" % (target, rel(resolved)))
        elif frag and resolved.endswith(".md") and frag not in anchors(resolved):
            bad.append("%s: no heading #%s in %s" % (target, frag, rel(resolved)))
    return bad


@pytest.mark.parametrize("page", PAGES + GENERATED, ids=rel)
def test_every_relative_link_resolves_to_a_tracked_file_and_heading(page):
    text = prose(open(page).read())
    bad = broken_links(page, LINK.findall(text) + IMAGE.findall(text))
    assert not bad, bad


@pytest.mark.parametrize("page", HTML_PAGES, ids=rel)
def test_every_link_of_an_html_page_resolves_to_a_tracked_file(page):
    bad = broken_links(page, [t for t in HREF.findall(open(page).read()) if not t.startswith("#")])
    assert not bad, bad


def test_the_link_check_refuses_a_file_a_clone_lacks(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "kept.md").write_text("# Kept\n")
    (tmp_path / "ignored.py").write_text("")
    clone = {str(tmp_path / "kept.md")}
    assert broken_links(str(page), ["kept.md", "kept.md#kept", "https://example.org/x"], clone) == []
    assert broken_links(str(page), ["ignored.py"], clone) == ["ignored.py: no file %s in a clone"
                                                              % rel(str(tmp_path / "ignored.py"))]
    assert len(broken_links(str(page), ["kept.md#nothing", "missing.md"], clone)) == 2


def test_the_link_check_finds_a_broken_link_and_anchor(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n## Some heading (with `code`)\n\n[ok](#some-heading-with-code) [no](#nothing)\n")
    assert "some-heading-with-code" in anchors(str(page))
    assert "nothing" not in anchors(str(page))


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_no_page_cites_an_issue_number_and_no_cell_is_long(page):
    text = prose(open(page).read())
    assert not re.search(r"issues? #\d", text), re.search(r".{0,60}issues? #\d.{0,20}", text).group(0)
    long_cells = [c.strip()[:60] for line in text.splitlines() if line.startswith("|")
                  for c in re.split(r"(?<!\\)\|", line)[1:-1] if len(c.strip()) > 150]
    assert not long_cells, long_cells


def test_readme_is_short_and_its_headline_is_results_md_summary():
    from runner.report import render
    readme = open(os.path.join(ROOT, "README.md")).read()
    assert len(readme.splitlines()) <= 200
    summary = render.summary_block(open(os.path.join(ROOT, "results.md")).read())
    assert "| Row |" in summary and "Devices: " in summary
    assert "%s\n\n%s\n\n%s" % (render.README_BEGIN, summary, render.README_END) in readme, \
        "python -m runner.report copies results.md's summary into README.md"


def test_readme_gpu_facts_are_results_md_before_you_rent_a_gpu():
    from runner.report import render
    from runner.report import gpu_facts
    readme = open(os.path.join(ROOT, "README.md")).read()
    block = render.section_block(open(os.path.join(ROOT, "results.md")).read(), gpu_facts.TITLE, stop=("## ",))
    assert "**Has run on a GPU**" in block and "Run `python run_all.py --preset quick` first" in block
    assert "%s\n\n%s\n\n%s" % (render.GPU_BEGIN, block, render.GPU_END) in readme, \
        "python -m runner.report copies results.md's GPU facts into README.md"


#: a sentence that says something ran or was measured on a named GPU ...
GPU_CLAIM = re.compile(r"\b(H100|H200|A100|V100|B200|L40S)\b")
CLAIM_VERB = re.compile(r"\b(ran|has run|have run|were made|was made|measured|took|trained|records?)\b", re.I)
#: ... names a committed record in its paragraph: a record's file, results.md, or README.md's GPU facts
NAMES_RECORD = re.compile(r"results/records/[^)\s]+\.json|results\.md|#before-you-rent-a-gpu")


def test_every_gpu_claim_in_the_docs_names_a_committed_record():
    bad = []
    for path in ["README.md"] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))):
        text = open(os.path.join(ROOT, path)).read()
        for para in re.split(r"\n\s*\n", text):
            if para.lstrip().startswith(("|", "<!--", "Devices:")):      # tables and generated blocks: from records
                continue
            claims = [s for s in re.split(r"(?<=[.;:])\s+", para) if GPU_CLAIM.search(s) and CLAIM_VERB.search(s)]
            if claims and not NAMES_RECORD.search(para):
                bad.append("%s: %s" % (os.path.relpath(path, ROOT), claims[0][:160]))
            for link in re.findall(r"\((?:\.\./)?(results/records/[^)\s]+\.json)\)", para):
                if not os.path.exists(os.path.join(ROOT, link)):
                    bad.append("%s: links a missing record %s" % (os.path.relpath(path, ROOT), link))
    assert not bad, "\n".join(bad)


# ---- docs/running.md lists every option of run_all.py --------------------------------------------------------
ENTRY = re.compile(r"^(?:- |\| )`(--[a-z0-9][a-z0-9-]*)(?: [^`]*)?`", re.M)


def option_entries(text):
    """{option: [its entries]} of the page's section "run_all.py options": list items (and table rows) that
    start with the option in a code span."""
    section = text.split("\n## run_all.py options\n", 1)[1].split("\n## ", 1)[0]
    entries = {}
    for match in ENTRY.finditer(section):
        end = section.find("\n- ", match.end())
        entries.setdefault(match.group(1), []).append(section[match.start():end if end > 0 else len(section)])
    return entries


def test_running_md_lists_each_option_of_the_parser_once_with_its_default():
    from runner.cli_options import build_parser
    parser = build_parser()
    options = {o for a in parser._actions for o in a.option_strings if o.startswith("--") and o != "--help"}
    entries = option_entries(open(os.path.join(ROOT, "docs", "running.md")).read())
    missing, unknown = sorted(options - set(entries)), sorted(set(entries) - options)
    assert not missing, "in run_all.py's parser, not in docs/running.md's options: %s" % missing
    assert not unknown, "in docs/running.md's options, not in run_all.py's parser: %s" % unknown
    twice = sorted(o for o, e in entries.items() if len(e) > 1)
    assert not twice, "listed more than once: %s" % twice
    no_default = sorted(o for o, (e,) in entries.items() if "(default: " not in " ".join(e.split()))
    assert not no_default, "say what happens without it, '(default: ...)': %s" % no_default


def test_the_option_check_reads_list_items():
    text = "# Page\n\n## run_all.py options\n\n- `--a N`: one (default: 1).\n- `--b`: two\n  lines (default: off).\n" \
           "\n## Next\n\n- `--c`: not an option here\n"
    assert {o: len(e) for o, e in option_entries(text).items()} == {"--a": 1, "--b": 1}
    assert "lines (default: off)" in option_entries(text)["--b"][0]


def test_no_page_or_source_cites_an_issue_number():
    """History lives in CHANGELOG.md: no tracked text file of the product (code, docs, pins, tests) cites an
    issue number. Executed notebooks are records of past runs and keep their sources as they ran."""
    out = subprocess.run(["git", "grep", "-n", "-i", "issue" + " #", "--", ".", ":!CHANGELOG.md", ":!*.ipynb"],
                         cwd=ROOT, stdout=subprocess.PIPE, universal_newlines=True).stdout
    assert out == "", out


PROJECT_PATH = re.compile(r"(?<![\w./-])((?:runner|common|tools|benchmarks|tests|envs|docs|notebooks)/[\w/.-]+"
                          r"\.(?:py|sh|md|txt|ipynb|json|gz|html|yml|png|textproto))")
NOT_THIS_REPOSITORY = {
    "tools/launch.py": "MXNet's own launcher, named by docs/data-parallel.md",
    "tests/test_x.py": "docs/running.md's example of a file name",
    "envs/x.txt": "a made-up requirements file in tests/test_installer.py",
}


def missing_project_paths(texts):
    """The paths into this repository that ``texts`` ({file: text}) name and a clone lacks; a name in capitals
    (``notebooks/NAME.ipynb``) is a pattern, not a path."""
    bad = []
    for source, text in sorted(texts.items()):
        for path in sorted(set(PROJECT_PATH.findall(text))):
            if path in NOT_THIS_REPOSITORY or re.search(r"/[^/]*[A-Z]{4}", path.replace("_DS2", "")):
                continue
            if not os.path.exists(os.path.join(ROOT, path)):
                bad.append("%s names %s, which a clone lacks" % (source, path))
    return bad


def test_every_path_a_page_pin_or_source_names_exists():
    """A comment, page or message that names one of the project's files (``runner/envs/gpu_preflight.py``) names
    one that is there: a module moved or renamed leaves no pointer to where it was. Records of past runs
    (results/) and the CHANGELOG's history keep the names of their day; the made-up files of tests/test_tier.py
    and of this file's own checks are not paths."""
    names = subprocess.run(["git", "ls-files", "-z", "--", ".", ":!results", ":!CHANGELOG.md", ":!tests/test_tier.py",
                            ":!tests/test_docs.py"],
                           cwd=ROOT, stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout.split("\0")
    texts = {}
    for name in filter(None, names):
        if name.endswith((".png", ".gz", ".whl")):
            continue
        try:
            with open(os.path.join(ROOT, name), encoding="utf-8") as f:
                texts[name] = f.read()
        except (UnicodeDecodeError, FileNotFoundError):
            continue
    assert len(texts) > 100
    assert missing_project_paths(texts) == []


def test_the_path_check_finds_a_moved_module():
    texts = {"envs/a.txt": "# the preflight (runner/preflight.py) decides; runner/envs/gpu_preflight.py",
             "docs/x.md": "`python docs/translations/ds2_NAME.py` or notebooks/PyTorch_DS2.ipynb"}
    assert missing_project_paths(texts) == ["envs/a.txt names runner/preflight.py, which a clone lacks"]
