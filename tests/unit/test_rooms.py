"""The orchestrator's seven rooms and the arrows allowed between them (orchestrator/__init__.py,
docs/architecture.md). Read from the source with ast, like the circle check: every import counts,
deferred and type-only ones too. When this fails it names the file and the import; move what both
sides need down a room (usually into contract/), never add the arrow."""

from __future__ import annotations

from pathlib import Path

from test_import_cycles import REPO, import_graph

# From the floor up: a room imports only the rooms below it. contract is the floor (every record
# and its one reader/writer); views never reach into the controller: a view that needs the
# controller's judgement reads it from a record.
LAYERS = ("contract", "plan", "slurm", "operate", "views", "controller", "cli")
ROOMS = tuple(sorted(LAYERS))
TOP_MODULES = {"__init__.py", "errors.py", "demo.py"}
ALLOWED = {room: {*LAYERS[: LAYERS.index(room)], "errors"} for room in LAYERS}
ALLOWED |= {"errors": set(), "demo": {*LAYERS, "errors"}}


def room_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "orchestrator" and len(parts) > 1 else None


def forbidden_arrows(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, imports in sorted(graph.items()):
        source = room_of(module)
        if source is None:
            continue
        for target in sorted(imports):
            room = room_of(target)
            if room is not None and room != source and room not in ALLOWED[source]:
                found.append(f"{module} imports {target} ({source} -> {room})")
    return found


def test_the_top_level_holds_the_seven_rooms():
    top = REPO / "orchestrator"
    packages = sorted(p.name for p in top.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    modules = {p.name for p in top.glob("*.py")}
    assert packages == list(ROOMS)
    assert modules == TOP_MODULES, f"loose modules: {sorted(modules - TOP_MODULES)}: put each in its room"


def test_every_arrow_between_rooms_is_allowed():
    graph = import_graph()
    assert "orchestrator.views.dashboard" in graph and "orchestrator.contract.checkpoints" in graph
    problems = forbidden_arrows(graph)
    assert not problems, "\n".join(problems)


def test_a_planted_view_to_controller_arrow_is_found():
    graph = {"orchestrator.views.status_screen": {"orchestrator.controller.supervisor"}}
    assert forbidden_arrows(graph) == [
        "orchestrator.views.status_screen imports orchestrator.controller.supervisor (views -> controller)"
    ]
    assert Path(REPO / "orchestrator" / "controller").is_dir()
