"""The package's layers (docs/architecture.md): a module imports only from the
layers below it, and no import circle exists outside the region. Read from the
sources (function-level imports included, ``if TYPE_CHECKING:`` blocks not), so
a lazy import that closes a circle fails here too."""

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


def _imports(modules: dict[str, tuple[Path, bool]]) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (not its own ancestors)."""
    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in modules.items():
        base = name if is_package else name.rpartition(".")[0]
        tree = ast.parse(path.read_text())
        typing_only = {
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


def test_no_import_circle_outside_the_region() -> None:
    graph = _imports(_modules())
    # Tarjan's strongly connected components.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
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

    for v in graph:
        if v not in index:
            visit(v)
    outside = [c for c in circles if not all(m.startswith("memscale._region") for m in c)]
    assert not outside, f"import circles outside the region: {outside}"
