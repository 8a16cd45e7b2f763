"""runner/'s packages import only downward, in no circle, and no function is over 80 lines without a comment saying
why (tools/runner_structure.py reads the source; nothing is imported).  The layers, lowest first, are the list in
runner/__init__.py and docs/architecture.md."""
import os
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import runner_structure  # noqa: E402

LEAVES = {"runner.base", "runner.interrupt"}
ENVS = LEAVES | {"runner.validate", "runner.envs"}
RUN = ENVS | {"runner.run"}
#: package (or top-level module) -> the packages and modules it may import from (besides itself)
ALLOWED = {
    "runner": set(),
    "runner.base": set(),
    "runner.interrupt": set(),
    "runner.validate": {"runner.base"},
    "runner.envs": ENVS,
    "runner.run": RUN,
    "runner.dp": RUN,
    "runner.migrate": RUN,
    # the report reads records: never the launchers, the supervisor or anything else of runner.dp
    "runner.report": RUN | {"runner.migrate"},
    "runner.rosetta": {"runner.base", "runner.validate", "runner.run"},
    "runner.cli_checks": RUN | {"runner.dp"},
    "runner.cli_options": RUN | {"runner.cli_checks"},
    "runner.cli": RUN | {"runner.dp", "runner.migrate", "runner.report", "runner.cli_checks", "runner.cli_options"},
}


def package_of(module: str) -> str:
    """runner.report.tables -> runner.report; runner.cli -> runner.cli."""
    return ".".join(module.split(".")[:2])


def layer_violations(root: str = runner_structure.RUNNER) -> list:
    """'a imports b' for every import of the tree under ``root`` that goes up or sideways."""
    graph = runner_structure.imports(runner_structure.modules(root))
    out = []
    for module, targets in sorted(graph.items()):
        mine = package_of(module)
        assert mine in ALLOWED, "%s: a package or module that tests/test_runner_layers.py does not place" % module
        for target in sorted(targets):
            theirs = package_of(target)
            if theirs != mine and theirs not in ALLOWED[mine] and not (mine == "runner" or theirs == "runner"):
                out.append("%s imports %s" % (module, target))
    return out


def test_runner_imports_only_flow_downward():
    assert layer_violations() == []


def test_runner_has_no_import_circle():
    graph = runner_structure.imports(runner_structure.modules())
    assert runner_structure.circles(graph) == []


def test_the_layering_check_catches_a_report_module_that_imports_a_launcher(tmp_path):
    """The check above can fail: a copy of runner/ whose report imports runner.dp (the launch stack) is caught."""
    copy = tmp_path / "runner"
    shutil.copytree(runner_structure.RUNNER, str(copy), ignore=shutil.ignore_patterns("__pycache__"))
    with open(str(copy / "report" / "records.py"), "a") as f:
        f.write("\nfrom runner.dp import launchers  # noqa: E402,F401\n")
    assert layer_violations(str(copy)) == ["runner.report.records imports runner.dp.launchers"]
    with open(str(copy / "base.py"), "a") as f:            # and a leaf that imports upward makes a circle
        f.write("\nfrom runner.envs import bootstrap  # noqa: E402,F401\n")
    graph = runner_structure.imports(runner_structure.modules(str(copy)))
    assert any("runner.base" in c and "runner.envs.bootstrap" in c for c in runner_structure.circles(graph))


def test_no_runner_function_is_over_80_lines_without_a_comment_saying_why():
    assert runner_structure.long_functions(80) == []
