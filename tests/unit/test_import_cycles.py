"""No import circle among the modules of the house: orchestrator/, trainer/, bloom_kernels/ and
simulation/ (reading the source with ast: nothing is imported, so this costs well under a second).

Every import counts, also those inside a function (a deferred import still ties two modules
together: mock.py <-> mock_exec.py was one) and those under `if TYPE_CHECKING:` (two modules
that name each other's types are one design: simulation's trainer <-> world was one). When this
fails it prints the circle; break it by moving what both sides need into a module that imports
neither (e.g. slurm/mock_core.py, trainer/checkpoint_format.py), or by naming what one side
needs as a Protocol of its own (simulation/incarnation.py's Surroundings).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("orchestrator", "trainer", "bloom_kernels", "simulation")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, modules: set[str], name: str | None = None) -> set[str]:
    """The modules of `modules` that `path` (module `name`) imports, absolute or relative, anywhere
    in the file. `from pkg import name` counts as importing pkg.name when that is a module, else pkg."""
    name = name or module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            # `import a.b.c` imports a, a.b and a.b.c; count the deepest module of ours.
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    files = [p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")]
    modules = {module_name(p) for p in files}
    return {module_name(p): imported_modules(p, modules) for p in files}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None (iterative DFS with colours)."""
    colour: dict[str, int] = {}
    for start in sorted(graph):
        if colour.get(start):
            continue
        stack = [(start, iter(sorted(graph[start])))]
        path = [start]
        colour[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                colour[node] = 2
                stack.pop()
                path.pop()
            elif colour.get(child) == 1:
                return path[path.index(child) :] + [child]
            elif not colour.get(child):
                colour[child] = 1
                path.append(child)
                stack.append((child, iter(sorted(graph.get(child, ())))))
    return None


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_a_type_only_import_counts(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import world\n")
    assert imported_modules(module, {"pkg.m", "pkg.world"}, name="pkg.m") == {"pkg.world"}


def test_no_import_cycle_in_the_house():
    graph = import_graph()
    assert "orchestrator.slurm.mock_exec" in graph and "trainer.checkpoint" in graph  # the scan sees them
    assert "simulation.world" in graph and "bloom_kernels.dispatch" in graph
    assert "orchestrator.slurm.mock_core" in graph["orchestrator.slurm.mock_exec"]  # and their imports
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
