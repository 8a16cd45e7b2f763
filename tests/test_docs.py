"""The reader's pages: README.md and docs/*.md.

Every relative link resolves to a file and, where it names one, a heading (GitHub's anchors); no page cites an
issue number; no table cell is longer than 150 characters; README.md stays within 200 lines and its headline
table is results.md's summary."""
import glob
import os
import re

import pytest

from tests.conftest import ROOT

PAGES = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")


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


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_relative_link_resolves_to_a_file_and_heading(page):
    text = prose(open(page).read())
    bad = []
    for target in LINK.findall(text) + IMAGE.findall(text):
        if re.match(r"^[a-z]+:", target):                  # http:, https:, mailto:
            continue
        path, _, frag = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not os.path.exists(resolved):
            bad.append("%s: no file %s" % (target, rel(resolved)))
        elif frag and resolved.endswith(".md") and frag not in anchors(resolved):
            bad.append("%s: no heading #%s in %s" % (target, frag, rel(resolved)))
    assert not bad, bad


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
    readme = open(os.path.join(ROOT, "README.md")).read()
    assert len(readme.splitlines()) <= 200
    summary = open(os.path.join(ROOT, "results.md")).read().split("## Summary\n\n")[1].split("\n\n")[0]
    assert summary.startswith("| Row |") and summary in readme, "copy results.md's summary table into README.md"
