"""The structural map of the tree: every import, no circles, no arrow back up a floor.

The graph is read from the source (every ``import``, also inside function bodies, where a
loop would otherwise hide), so the test needs no import of the project and fails on the
first arrow that goes the wrong way, naming it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("strategies", "models", "datasets", "harness", "benchmarks")
#: The one import name of the installed code: ``strategies/`` is ``growbench.strategies``, and so on.
PROJECT = "growbench"

#: Floors, lowest first: a module may import from its own floor or any below, never above.
#: Inside ``harness`` the wings have floors of their own (the last matching prefix wins).
FLOORS: list[tuple[str, ...]] = [
    ("strategies",),
    ("models",),
    ("datasets",),
    ("harness", "harness.env", "harness.memory", "harness.plugins", "harness.optim_state", "harness.validate",
     "harness.configs"),
    ("harness.store",),
    ("harness.capture", "harness.reference"),
    ("harness.measure", "harness.train"),
    ("harness.runner",),
    # The recommendation's parts (harness.recommend is their index), beside the targets and the example.
    ("harness.recommend", "harness.rule", "harness.targets", "harness.example"),
    ("harness.report",),
    ("harness.cli",),
    ("benchmarks",),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def absolute_imports(path: Path) -> list[str]:
    """Every absolute module name ``path`` imports (``import a.b``, ``from a.b import c``), as written."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.append(node.module)
    return found


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The project's modules ``name`` imports: ``from a import b`` counts ``a.b`` when it is a module, else ``a``.

    The project is imported as ``growbench.<folder>``; the graph names modules by folder.
    """
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name.removeprefix(f"{PROJECT}.") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            elif base == PROJECT:  # from growbench import strategies
                base = ""
            else:
                base = base.removeprefix(f"{PROJECT}.")
            targets = [f"{base}.{a.name}".lstrip(".") if f"{base}.{a.name}".lstrip(".") in known else base
                       for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import a.b.c` of a non-module attribute: its module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports_of(name, path, set(mods)) for name, path in mods.items()}


def floor(name: str) -> int:
    best, best_len = None, -1
    for level, prefixes in enumerate(FLOORS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = level, len(prefix)
    assert best is not None, f"{name} has no floor in tests/test_structure.py FLOORS"
    return best


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_no_arrow_goes_up_a_floor():
    upward = [f"{a} (floor {floor(a)}) -> {b} (floor {floor(b)})"
              for a, targets in graph().items() for b in sorted(targets)
              if floor(b) > floor(a) and not (a == b.rpartition(".")[0] or b.startswith(a + "."))]
    assert upward == []


def test_the_project_is_imported_by_its_package_name_only():
    # `import strategies` works from the checkout's root and nowhere else: installed, only growbench exists.
    sources = [*modules().values(), *(ROOT / "tests").rglob("*.py")]
    bare = [f"{path.relative_to(ROOT)}: {target}" for path in sources
            for target in absolute_imports(path) if target.split(".")[0] in PACKAGES[:-1]]
    assert bare == []


def test_strategies_imports_nothing_of_the_project():
    outward = {(a, b) for a, targets in graph().items() if a.startswith("strategies")
               for b in targets if not b.startswith("strategies")}
    assert outward == set()


@pytest.mark.parametrize("pair", [("a", {"b"}), ("b", {"a"})])
def test_the_cycle_finder_finds_a_cycle(pair):
    # The checks above pass on an empty answer: make sure the finder is not blind.
    edges = {"a": {"b"}, "b": {"a"}, "c": {"a"}}
    edges[pair[0]] = pair[1]
    assert cycles(edges) == [["a", "b"]]


def test_the_reader_sees_imports_inside_functions():
    edges = graph()
    assert "strategies.spec" in edges["strategies.factory"]
    assert {"strategies", "datasets.registry"} <= edges["harness.measure"]  # through growbench.<folder>
    assert all(name in edges for name in ("harness.cli", "models.block", "datasets.minilm"))


def test_every_section_reference_resolves_inside_the_repository():
    import re

    headings = set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)[. ]", (ROOT / "docs" / "mathematics.md").read_text(), re.M))
    sources = [p for pkg in (*PACKAGES, "tests") for p in (ROOT / pkg).rglob("*.py")] + [ROOT / "README.md"]
    dangling, outside = [], []
    for path in sources:
        text = path.read_text(encoding="utf-8")
        for ref in re.findall(r"docs/mathematics\.md ((?:§[\d.]+[,–-]? ?)+)", text):
            dangling += [f"{path.name}: §{n}" for n in re.findall(r"§?(\d+(?:\.\d+)?)", ref) if n not in headings]
        if path.name != "test_structure.py":
            outside += [f"{path.name}: {m}" for m in re.findall(r"shared/MATH|MATH §|seed 00\d", text)]
    assert dangling == []
    assert outside == []
