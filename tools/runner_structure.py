"""The shape of runner/, measured from its source: modules and their lines, the longest functions, how deep the
imports stand, and any import circle.  Standard library only (``ast``); from runner, only its option checks
(runner/validate.py, standard library too).

    python tools/runner_structure.py            # the figures
    python tools/runner_structure.py --long 80  # only the functions over 80 lines that carry no comment saying why

A function over the limit is accepted when a comment on its ``def`` line or the line above says why, and names the
length: ``# long: ...`` (tests/test_runner_layers.py holds runner/ to it)."""
import ast
import os
import sys
from typing import Dict, List, Set, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from runner.validate import OneLineParser, positive_int  # noqa: E402  (standard library only)
RUNNER = os.path.join(ROOT, "runner")
#: the comment that lets a function be longer than the limit, on its ``def`` line or the line above
LONG_MARK = "# long:"


def modules(root: str = RUNNER) -> Dict[str, str]:
    """{dotted module name: path} of every .py file under runner/ (a package is named by its ``__init__``)."""
    found = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                parts = os.path.relpath(path, os.path.dirname(root))[:-3].split(os.sep)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                found[".".join(parts)] = path
    return found


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module an ``from X import ...`` names, relative levels resolved."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(mods: Dict[str, str]) -> Dict[str, Set[str]]:
    """{module: the runner modules it imports}, at any depth in the file (a function's late import counts too).
    ``from runner.pkg import name`` counts as importing ``runner.pkg.name`` when that is a module, else the package."""
    graph = {}
    for name, path in mods.items():
        is_package = path.endswith("__init__.py")
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        out = set()
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, is_package, node)
                targets = [base + "." + a.name if base + "." + a.name in mods else base for a in node.names]
            for t in targets:
                while t and t not in mods:      # runner.pkg.mod.attr -> runner.pkg.mod
                    t = t.rpartition(".")[0]
                if t and t != name and t.split(".")[0] == "runner":
                    out.add(t)
        graph[name] = out
    return graph


def circles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Every strongly connected group of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def depth(graph: Dict[str, Set[str]]) -> Tuple[int, List[str]]:
    """The longest chain of imports (modules in it, and the chain), a circle's modules counted once."""
    best: Dict[str, List[str]] = {}

    def chain(v, seen):
        if v in best:
            return best[v]
        longest = []
        for w in sorted(graph.get(v, ())):
            if w not in seen:
                c = chain(w, seen | {w})
                if len(c) > len(longest):
                    longest = c
        best[v] = [v] + longest
        return best[v]

    top = max((chain(v, {v}) for v in sorted(graph)), key=len)
    return len(top), top


def functions(mods: Dict[str, str]) -> List[Tuple[int, str, bool]]:
    """(lines, module.function, whether a ``# long:`` comment says why) of every function and method."""
    out = []
    for name, path in mods.items():
        with open(path, encoding="utf-8") as f:
            source = f.read()
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source, path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                near = lines[max(first - 2, 0):node.lineno]
                out.append((node.end_lineno - first + 1, "%s.%s" % (name, node.name),
                            any(LONG_MARK in line for line in near)))
    return sorted(out, reverse=True)


def long_functions(limit: int = 80) -> List[str]:
    """The functions over ``limit`` lines with no comment saying why."""
    return ["%s (%d lines)" % (f, n) for n, f, why in functions(modules()) if n > limit and not why]


def main(argv=None) -> int:
    p = OneLineParser(prog="python tools/runner_structure.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--long", type=positive_int, metavar="N",
                   help="list only the functions over N lines (N >= 1) with no comment why")
    args = p.parse_args(argv)
    if args.long is not None:
        bad = long_functions(args.long)
        print("\n".join(bad) if bad else "no function over %d lines without a comment saying why" % args.long)
        return 1 if bad else 0
    mods = modules()
    sizes = sorted(((sum(1 for _ in open(p, encoding="utf-8")), m) for m, p in mods.items()), reverse=True)
    graph = imports(mods)
    n, top = depth(graph)
    print("modules: %d, %d lines" % (len(mods), sum(s for s, _ in sizes)))
    print("largest modules: " + ", ".join("%s %d" % (m, s) for s, m in sizes[:3]))
    print("longest functions: " + ", ".join("%s %d" % (f, k) for k, f, _ in functions(mods)[:5]))
    print("functions over 80 lines: %d (%d without a comment saying why)"
          % (sum(1 for k, _, _ in functions(mods) if k > 80), len(long_functions(80))))
    print("import depth: %d modules (%s)" % (n, " -> ".join(top)))
    found = circles(graph)
    print("import circles: %d%s" % (len(found), "".join("\n  " + " <-> ".join(c) for c in found)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
