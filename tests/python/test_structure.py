"""The Python binding's structure, read from its source (python/kdloss), not from the installed
copy: one floor per layer, imports only downward and no import circle; no function longer than 60
lines; no `# noqa: E402`; no issue-tracker numbers in comments; no file named that does not exist.

Floors, bottom up (docs/ARCHITECTURE.md, "The Python binding"):
    _lib -> kdloss (package) -> _backend -> _calls -> _ops -> _args -> functional -> modules,
    adapters
    -> liger -> kdloss.torch (package)
Every import, at module level or inside a function, must point to a lower floor.
"""

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PKG = ROOT / "python" / "kdloss"

FLOORS = {
    "kdloss._lib": 0,
    "kdloss": 1,
    "kdloss.torch._backend": 2,
    "kdloss.torch._calls": 3,
    "kdloss.torch._ops": 4,
    "kdloss.torch._args": 5,
    "kdloss.torch.functional": 6,
    "kdloss.torch.modules": 7,
    "kdloss.torch.adapters": 7,
    "kdloss.torch.liger": 8,
    "kdloss.torch": 9,
}


def _sources():
    if not PKG.is_dir():
        pytest.skip(f"{PKG} not found (tests run from a source checkout)")
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = path.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _package_of(name, path):
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _imports(name, path, modules):
    """The kdloss modules `name` imports anywhere in its source (a from-import of a submodule
    counts as that submodule)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "kdloss")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _package_of(name, path).split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "kdloss":
                continue
            subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in modules]
            found.update(subs if subs and len(subs) == len(node.names) else [target] + subs)
    found.discard(name)
    return found


def _graph():
    modules = _sources()
    return modules, {n: _imports(n, p, modules) for n, p in modules.items()}


def test_every_module_has_a_floor():
    modules, _ = _graph()
    assert sorted(set(modules) - set(FLOORS)) == [], "a new module needs its floor here"


def test_imports_point_only_downward():
    _, graph = _graph()
    upward = [(a, b) for a, deps in graph.items() for b in deps
              if b in FLOORS and FLOORS[b] >= FLOORS[a]]
    assert upward == [], f"imports that do not point to a lower floor: {upward}"


def _cycles(graph):
    """Every import circle (as a list of modules), found by depth-first search."""
    cycles, state = [], {}

    def visit(n, stack):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                cycles.append(stack[stack.index(m):] + [m])
            elif m not in state:
                visit(m, stack)
        stack.pop()
        state[n] = 2
    for n in sorted(graph):
        if n not in state:
            visit(n, [])
    return cycles


def test_no_import_circle():
    _, graph = _graph()
    assert _cycles(graph) == []


def test_the_checks_can_fail(tmp_path):
    # a planted circle is found, and a planted upward import is seen as an edge
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c", "a"]]
    src = tmp_path / "_calls.py"
    src.write_text("def f():\n    from . import functional as F\n    return F\n")
    deps = _imports("kdloss.torch._calls", src, {"kdloss.torch.functional"})
    assert deps == {"kdloss.torch.functional"}
    long_fn = tmp_path / "long.py"
    long_fn.write_text("def f():\n" + "    x = 1\n" * 61)
    assert [n for _, _, n in _functions(long_fn)] == [62]


def _functions(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.lineno, node.end_lineno - node.lineno + 1


def test_no_function_longer_than_60_lines():
    modules = _sources()
    long = [f"{p.relative_to(ROOT)}:{line} {fn} ({n} lines)" for p in modules.values()
            for fn, line, n in _functions(p) if n > 60]
    assert long == []


def test_no_e402_and_no_issue_numbers():
    bad = []
    for path in _sources().values():
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if "noqa: E402" in line or re.search(r"\bissues? [0-9]", line, re.IGNORECASE):
                bad.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert bad == []


_FILE_REF = re.compile(r"(?<![\w./-])((?:[\w-]+/)*[\w-]+\.(?:md|h|c|cu|cuh|py|sh|cmake))\b")


def test_named_files_exist():
    """Every file a comment or docstring in python/ names (docs/MATH.md, include/kdloss.h,
    tests/python/test_fsdp2.py, ...) exists in the tree, by its path or, for a bare name, as
    some file of that name."""
    names = {p.name for p in ROOT.rglob("*") if p.is_file() and ".git" not in p.parts}
    missing = []
    for path in _sources().values():
        for i, line in enumerate(path.read_text().splitlines(), 1):
            for ref in _FILE_REF.findall(line):
                ok = (ROOT / ref).exists() if "/" in ref else ref in names
                if not ok and "/" in ref:  # relative to the package (kdloss/torch/_ops.py)
                    ok = (ROOT / "python" / ref).exists()
                if not ok:
                    missing.append(f"{path.relative_to(ROOT)}:{i}: {ref}")
    assert missing == []
