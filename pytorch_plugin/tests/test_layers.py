"""The package's layers (docs/architecture.md): a module imports only from the
layers below it, and no module imports itself back through others (no import
circle anywhere, the region's modules included). Read from the sources with
:mod:`ast`: function-level imports count (a lazy import that only dodges a
circle at run time is still a circle), and so do ``if TYPE_CHECKING:`` imports
for the circle test (a module that names an upper module's class in its
annotations depends on that module's design; ``from __future__ import
annotations`` only hides it at run time). A lower module that needs an upper
object takes it as an argument, typed by a ``Protocol`` of its own."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "memscale"

#: Bottom to top; a module's layer is that of its longest listed prefix.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("memscale.errors", "memscale._version", "memscale._hooks"),
    ("memscale._native",),
    ("memscale.config", "memscale._stats"),
    ("memscale._allocator",),
    ("memscale._region",),
    ("memscale._blocks",),
    ("memscale._dropin", "memscale.hf", "memscale.lightning", "memscale.metrics"),
    ("memscale.trace", "memscale.demo", "memscale._cli", "memscale.__main__"),
    ("memscale._plan",),
)


def _modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return out


def _imports(modules: dict[str, tuple[Path, bool]], typing: bool = False) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (not its own ancestors);
    ``typing``: with those imported under ``if TYPE_CHECKING:``."""
    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in modules.items():
        base = name if is_package else name.rpartition(".")[0]
        tree = ast.parse(path.read_text())
        typing_only = set() if typing else {
            id(node)
            for block in ast.walk(tree)
            if isinstance(block, ast.If) and getattr(block.test, "id", "") == "TYPE_CHECKING"
            for stmt in block.body
            for node in ast.walk(stmt)
        }
        deps: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = base.split(".")[: len(base.split(".")) - node.level + 1]
                    target = ".".join(parts + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                submodules = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in modules]
                deps.update(submodules)
                if len(submodules) < len(node.names):
                    deps.add(target)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
        graph[name] = {d for d in deps if d in modules and d != name and not name.startswith(d + ".")}
    return graph


def _layer(module: str) -> int:
    best, length = len(LAYERS), -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > length:
                best, length = index, len(prefix)
    return best  # memscale itself (__init__) is above everything


def test_every_import_points_down_or_sideways() -> None:
    graph = _imports(_modules())
    upward = sorted(
        f"{module} -> {dep}"
        for module, deps in graph.items()
        for dep in deps
        if _layer(dep) > _layer(module)
    )
    assert not upward, "imports against the layers of docs/architecture.md:\n" + "\n".join(upward)


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` larger than one module
    (Tarjan's algorithm), each sorted, largest first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
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
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(circles, key=lambda c: (-len(c), c))


def test_no_import_circle() -> None:
    graph = _imports(_modules(), typing=True)
    circles = import_circles(graph)
    report = []
    for circle in circles:
        members = set(circle)
        report.append(f"{len(circle)} modules:")
        report += [f"  {m} -> {', '.join(sorted(graph[m] & members))}" for m in circle]
    assert not circles, "import circles (type-only and function-level imports included):\n" + "\n".join(report)


#: The region's modules, bottom to top (``memscale/_region/__init__.py``'s
#: docstring): each imports only from the groups below its own, never from its
#: own group (type-only imports included).
REGION_LAYERS: tuple[tuple[str, ...], ...] = (
    ("schema", "cells", "volatile", "reclaim", "entry", "counters"),
    ("tensor", "device", "arguments"),
    ("replay", "verify", "steps"),
    ("state",),
    ("rebuild", "native"),
    ("externals",),
    ("outputs", "shapes"),
    ("inplace",),
    ("dispatch",),
    ("session",),
    ("mode",),
    ("region",),
    ("check",),
)


def test_region_modules_import_downward() -> None:
    graph = _imports(_modules(), typing=True)
    region = "memscale._region."
    level = {f"{region}{name}": i for i, group in enumerate(REGION_LAYERS) for name in group}
    members = {m for m in graph if m.startswith(region)}
    assert members == set(level), (
        f"region modules missing from REGION_LAYERS: {sorted(members - set(level))}; "
        f"listed but absent: {sorted(set(level) - members)}"
    )
    wrong = sorted(
        f"{module} -> {dep}"
        for module in members
        for dep in graph[module]
        if dep in level and level[dep] >= level[module]
    )
    assert not wrong, "region imports not pointing to a lower group of REGION_LAYERS:\n" + "\n".join(wrong)
