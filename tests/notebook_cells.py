"""A notebook cell's own statements run in the runner's interpreter, without its framework: what the tests of the
``skip`` parameter use to follow a cell's branches in a second (tests/test_notebook_parameters_*.py).

:func:`run_cell` runs a cell's top-level statements, less its definitions (``def``, ``class``, ``import``: what the
statements call is what matters) and, in section 11, less what comes before the state is computed (the test gives
``exported``), in a namespace that holds what the test gives and, for any other name, a :class:`Tripwire`: a branch
that touches the framework, the model or a batch raises :class:`Touched` naming what it touched."""
import ast
import builtins
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Touched(Exception):
    """A statement used something the test did not give: the framework, the model, a batch."""


class Tripwire:
    """Stands for a name the test does not give; any use of it raises :class:`Touched`."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, attribute):
        raise Touched("%s.%s" % (self._name, attribute))

    def __call__(self, *args, **kwargs):
        raise Touched("%s()" % self._name)

    def __iter__(self):
        raise Touched("iter(%s)" % self._name)

    def __bool__(self):
        raise Touched("bool(%s)" % self._name)

    def _touch(self, *args):
        raise Touched("an operation on %s" % self._name)

    # indexing, sizes, numbers and comparisons: a branch that computes with what it was not given is Touched too
    __getitem__ = __setitem__ = __len__ = __contains__ = __float__ = __int__ = __index__ = _touch
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _touch
    __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = __pow__ = __rpow__ = __neg__ = __matmul__ = _touch
    __lt__ = __le__ = __gt__ = __ge__ = _touch


class Namespace(dict):
    """A cell's namespace: the names given, a :class:`Tripwire` for any other that is not a builtin."""

    def __missing__(self, name):
        if hasattr(builtins, name):
            raise KeyError(name)            # the lookup goes on to the builtins
        return Tripwire(name)


def tagged_source(notebook, tag, first=False):
    """The source of the one cell of ``notebooks/<notebook>`` tagged ``tag`` (``first``: of the first of several,
    such as the JAX notebook's two settings cells, whose first holds the checks)."""
    with open(os.path.join(ROOT, "notebooks", notebook)) as f:
        cells = [c for c in json.load(f)["cells"] if tag in c.get("metadata", {}).get("tags", [])]
    assert len(cells) == 1 or (first and cells), (notebook, tag, len(cells))
    return "".join(cells[0]["source"])


def parameters(notebook):
    """The values of ``notebooks/<notebook>``'s tagged ``parameters`` cell, by name."""
    return {t.id: ast.literal_eval(node.value) for node in ast.parse(tagged_source(notebook, "parameters")).body
            if isinstance(node, ast.Assign) for t in node.targets}


def run_cell(notebook, tag, whole=False, first=False, **given):
    """Run the cell tagged ``tag`` (``first``: the first of several) with the names ``given``; its namespace
    afterwards.  ``whole``: every statement, definitions and imports included (a settings cell, whose checks come
    before its framework loads); else section 11's cell from the statement after ``exported = ...`` on (the test
    gives ``exported``)."""
    tree = ast.parse(tagged_source(notebook, tag, first))
    if not whole:
        body = tree.body
        export = [i for i, node in enumerate(body) if isinstance(node, ast.Assign)
                  and [getattr(t, "id", None) for t in node.targets] == ["exported"]]
        if export:                          # section 11: what comes after the state is computed
            body = body[export[0] + 1:]
        tree.body = [node for node in body if not isinstance(
            node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom))]
    namespace = Namespace(given)
    exec(compile(tree, "%s [%s]" % (notebook, tag), "exec"), {}, namespace)
    return namespace


def skip_parts(notebook, skip):
    """Sections 10, 11 and 11b of ``notebook`` run with ``skip`` (fp32, one process): each one's outcome, or the
    :class:`Touched` (or other error) that stopped it where the part ran and needed the framework."""
    from common import compile_cache, exports, onnx_check
    from common.timing import BenchmarkTimer
    outcome = {}
    timer = BenchmarkTimer(sync=Tripwire("sync"))
    for part, tag in (("forward", "rosetta:forward"), ("export", "rosetta:export"), ("onnx", "rosetta:onnx")):
        try:
            ns = run_cell(notebook, tag, skip=skip, precision="fp32", exports=exports, onnx_check=onnx_check,
                          compile_cache=compile_cache, xla_cache_dir=None, timer=timer, forward_repeats=3,
                          exported={})
        except Exception as e:              # the part ran: it needs what the test does not give
            outcome[part] = e
            continue
        outcome[part] = {"forward": lambda: (dict(ns["forward_ms"]), timer.forward_repeats),
                         "export": lambda: ns["export_info"], "onnx": lambda: ns["onnx_info"]}[part]()
    return outcome


# ---- what the tests of the skip parameter share (tests/test_notebook_parameters_*.py) ------------------------------
#: every combination run_all.py --skip accepts (export only with onnx)
SKIPS = [["forward"], ["onnx"], ["forward", "onnx"], ["export", "onnx"], ["export", "onnx", "forward"]]
#: a skip parameter the settings cell refuses, and what its one line says
BAD_SKIPS = [("forward", "skip is a list of parts"), (["export"], "export without onnx"),
             (["warmup"], "unknown part 'warmup'")]
#: a full-tier run's --skip: every part, in the order the record keeps
EVERY_PART = ["forward", "onnx", "export"]


def settings_names():
    """What a settings cell reads besides its parameters, as the environment cell imports it (no framework)."""
    from common import envinfo, parallel, spec
    return dict(os=os, parallel=parallel, get_preset=spec.get_preset, check_precision=spec.check_precision,
                check_skip=spec.check_skip, is_learn_preset=spec.is_learn_preset, nvidia_smi_gpus=envinfo.gpus)


def _skip_line(notebook, tag):
    return next(line for line in tagged_source(notebook, tag).splitlines() if line.startswith("skip ="))


def assert_declared_as_in_pytorch(notebook):
    """The parameter and its check: the PyTorch notebook's lines, comments included; check_skip imported; section 2's
    markdown names it; the record's options.skipped."""
    for tag in ("parameters", "rosetta:settings"):
        assert _skip_line(notebook, tag) == _skip_line("PyTorch_DS2.ipynb", tag), (notebook, tag)
    assert "check_skip" in tagged_source(notebook, "rosetta:environment")
    with open(os.path.join(ROOT, "notebooks", notebook)) as f:
        markdown = ["".join(c["source"]) for c in json.load(f)["cells"] if c["cell_type"] == "markdown"
                    and "".join(c["source"]).startswith("## 2. Parameters")]
    assert len(markdown) == 1 and "`skip`: parts a timed run leaves out" in markdown[0]
    assert '"skipped": skip' in tagged_source(notebook, "rosetta:record")


def assert_skipped_parts(notebook, skip):
    """A skipped part times no batch, writes no file and records why; a part that is not skipped runs (it reaches
    the framework, which is not here: :class:`Touched`, not any error a broken branch might raise)."""
    from common import exports
    outcome = skip_parts(notebook, skip)
    for part in ("forward", "export", "onnx"):
        if part not in skip:
            assert isinstance(outcome[part], Touched), (part, repr(outcome[part]))
    if "forward" in skip:
        assert outcome["forward"] == ({}, None)          # forward_ms empty, forward_repeats None
    if "export" in skip:
        assert outcome["export"] == exports.skipped(skip)
    if "onnx" in skip:
        assert outcome["onnx"]["status"] == "skipped"
        assert outcome["onnx"]["reason"] == "skip=%s: not run" % ",".join(skip)


def assert_every_part_skipped(run, rec):
    """A record of ``run_all.py --skip forward,onnx,export``: trained and checked; no forward timing, no export file,
    no ONNX route, and options.skipped says so."""
    assert rec["options"]["skipped"] == EVERY_PART
    assert rec["timing"]["forward_ms"] == {} and rec["timing"]["forward_repeats"] is None
    assert rec["export"]["status"] == "skipped" and "no file is written" in rec["export"]["reason"]
    assert rec["onnx"]["status"] == "skipped" and rec["onnx"]["reason"] == "skip=%s: not run" % ",".join(EVERY_PART)
    assert rec["checks"]["loss"]["ok"] and rec["checks"]["params"]["ok"] and rec["checks"]["param_summary"]
    weights = os.path.join(str(run.results_dir), "weights")
    written = os.listdir(weights) if os.path.isdir(weights) else []
    assert not [name for name in written if name.startswith(rec["target"] + "_")], written


def settings_until_framework(notebook, **overrides):
    """The notebook's first settings cell (the JAX notebook has two: its second turns the cache on) with its
    parameters and ``overrides``, its imports left out, XLA's helpers (common.compile_cache, common.xla_autotune) and
    a plain dict for ``os.environ``: (the variables it set, what stopped it: :class:`Touched` where it reached the
    framework, the exception it raised, or None)."""
    import types
    from common import compile_cache, xla_autotune
    with open(os.path.join(ROOT, "notebooks", notebook)) as f:
        cells = [c for c in json.load(f)["cells"] if "rosetta:settings" in c["metadata"].get("tags", [])]
    tree = ast.parse("".join(cells[0]["source"]))
    tree.body = [node for node in tree.body if not isinstance(node, (ast.Import, ast.ImportFrom))]
    environ = {}
    given = dict(parameters(notebook), **settings_names())
    given.update(compile_cache=compile_cache, xla_autotune=xla_autotune, os=types.SimpleNamespace(environ=environ),
                 **overrides)
    try:
        exec(compile(tree, notebook, "exec"), {}, Namespace(given))
    except Exception as e:
        return environ, e
    return environ, None
