"""The executed smoke notebooks show no warnings in their cell outputs.

A warning in a cell's output is something a reader of the executed notebook sees and should not
have to (a copy the framework makes behind our back, a deprecated call).  Framework start-up chatter
goes to the kernel's own log (results/logs), not to cell outputs, so it does not count here.
"""
import glob
import os

import nbformat

from tests.conftest import ROOT  # noqa: F401  (puts the repository on sys.path)


def warnings_in(path):
    """[(cell number, text)] of the stream and error outputs that mention "Warning"."""
    nb = nbformat.read(path, as_version=4)
    found = []
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if out.output_type == "stream":
                text = out.text
            elif out.output_type == "error":
                text = "%s: %s\n%s" % (out.ename, out.evalue, "\n".join(out.traceback))
            else:
                continue
            if "Warning" in text:
                found.append((i, text))
    return found


def test_executed_notebooks_print_no_warnings(smoke):
    notebooks = sorted(glob.glob(os.path.join(smoke.results_dir, "notebooks", "*.ipynb")))
    assert notebooks, "the smoke run left no executed notebooks in %s\n%s" % (smoke.results_dir, smoke.output)
    problems = ["%s, cell %d:\n%s" % (os.path.basename(path), cell, text.strip())
                for path in notebooks for cell, text in warnings_in(path)]
    assert not problems, "warnings in the executed notebooks' outputs:\n\n" + "\n\n".join(problems)


def test_the_scan_finds_a_warning(tmp_path):
    """The scan itself: a stream output with a warning is found, other outputs are not."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x", outputs=[
        nbformat.v4.new_output("stream", name="stderr", text="a.py:3: UserWarning: The given NumPy array is not "
                                                              "writable\n"),
        nbformat.v4.new_output("execute_result", data={"text/plain": "'Warning' in a value is fine"},
                               execution_count=1)]),
        nbformat.v4.new_code_cell("y", outputs=[nbformat.v4.new_output("stream", name="stdout", text="ok\n")])]
    path = str(tmp_path / "nb.ipynb")
    nbformat.write(nb, path)
    assert warnings_in(path) == [(0, "a.py:3: UserWarning: The given NumPy array is not writable\n")]
