"""The contract is closed: outside orchestrator/contract, no module reads a heartbeat or an event
as a raw dict. They go through the typed readers (contract.read_heartbeats, contract.events
.read_events) and use attributes.

Two checks over the source of every production module (orchestrator/, trainer/, bloom_kernels/,
simulation/, bench/), by its syntax tree:
- no `x["k"]` or `x.get("k")` where k is a field only heartbeats or events have (the kind key
  "event", "extra", beat_time, failure_time, resume_step, ...): reading one of those is reading a
  raw beat or event;
- no raw read of the files themselves: read_jsonl/read_json/open/json.loads applied to
  `paths.events`, `paths.heartbeats` or `paths.heartbeat(r)`.
The field list is computed from the contract's own dataclasses, minus names so common that other
records share them (job_id, step, time...): those are covered by the second check. A line that
reads a dict of its own that happens to use such a key (a report's incident, a notification's
payload) says so on a line of that statement: `# not a beat or event: <what it is>`.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from orchestrator.contract import Heartbeat
from orchestrator.contract.events import event_kinds

REPO = Path(__file__).resolve().parents[2]
SCANNED = ["orchestrator", "trainer", "bloom_kernels", "simulation", "bench"]
CONTRACT = REPO / "orchestrator" / "contract"
# Field names other records share (config, SLURM's JSON, the job table, scenario facts): a read of
# one of these is not evidence of a raw beat or event. Raw reads of the files are checked apart.
SHARED = {
    "time", "version", "job_id", "job_ids", "step", "reason", "state", "status", "nodes", "host", "rank",
    "user", "uid", "kind", "error", "message", "why", "cause", "path", "file", "size", "level", "result",
    "log", "where", "args", "note", "pid", "phase", "launch", "loss", "exit_code", "world_size", "node",
    "request", "now", "by", "previous", "basis", "jobs", "excluded", "intent", "score", "how", "action",
    "files", "directory", "problem", "seconds", "traceback", "fields", "name", "threshold",
    "details", "compute_seconds", "consumed_samples", "last_step", "step_seconds", "outcome", "exclude",
}
OPT_OUT = "# not a beat or event:"
RAW_READERS = {"read_jsonl", "read_json", "open", "loads", "read_text", "read_untrusted"}
RUN_FILES = {"events", "heartbeats"}


def record_only_fields() -> set[str]:
    names = {"event", "extra"}
    names |= {f.name for f in dataclasses.fields(Heartbeat)}
    for kind in event_kinds().values():
        names |= {f.name for f in dataclasses.fields(kind)}
    return names - SHARED


def production_files() -> list[Path]:
    files = []
    for top in SCANNED:
        for path in sorted((REPO / top).rglob("*.py")) if (REPO / top).is_dir() else []:
            if CONTRACT not in path.parents:
                files.append(path)
    return files


def statements(tree: ast.AST) -> dict[int, tuple[int, int]]:
    """line -> (first, last) line of the innermost statement that holds it."""
    spans: dict[int, tuple[int, int]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and not isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.If, ast.For,
                                                                   ast.While, ast.With, ast.Try)):
            for line in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                first, last = spans.get(line, (0, 10**9))
                if last - first > (node.end_lineno or node.lineno) - node.lineno:
                    spans[line] = (node.lineno, node.end_lineno or node.lineno)
    return spans


def key_reads(tree: ast.AST, keys: set[str]) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            key = node.slice
            if isinstance(key, ast.Constant) and key.value in keys:
                found.append((node.lineno, f'[{key.value!r}]'))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value in keys
        ):
            found.append((node.lineno, f".get({node.args[0].value!r})"))
    return found


def _names_a_run_file(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and sub.attr in RUN_FILES:
            return True
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr == "heartbeat":
            return True
    return False


def raw_file_reads(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name not in RAW_READERS:
            continue
        target = [*node.args, func.value] if isinstance(func, ast.Attribute) else list(node.args)
        if any(_names_a_run_file(arg) for arg in target):
            found.append((node.lineno, f"{name}(...) of a run file"))
    return found


def violations(files: list[Path]) -> list[str]:
    keys = record_only_fields()
    out = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        tree = ast.parse(text, filename=str(path))
        spans = statements(tree)
        for line, what in key_reads(tree, keys) + raw_file_reads(tree):
            first, last = spans.get(line, (line, line))
            if not any(OPT_OUT in lines[n - 1] for n in range(first, last + 1)):
                out.append(f"{path.relative_to(REPO) if REPO in path.parents else path}:{line}: {what}")
    return out


def test_no_module_outside_the_contract_reads_a_beat_or_an_event_by_string_key():
    keys = record_only_fields()
    assert {"event", "extra", "beat_time", "progress_time", "failure_time", "resume_step"} <= keys
    found = violations(production_files())
    assert found == [], "raw beat/event reads outside orchestrator/contract (use the typed readers):\n" + "\n".join(found)


def test_the_check_finds_what_it_looks_for(tmp_path):
    """The detector itself: each way of reading a raw record is found, typed access is not."""
    source = tmp_path / "sample.py"
    source.write_text(
        "def f(paths, e, beat, ev):\n"
        "    a = e['event']\n"
        "    b = beat.get('beat_time')\n"
        "    c = read_jsonl(paths.events)\n"
        "    d = json.loads(paths.heartbeat(3).read_text())\n"
        "    ok = ev.failure_time + beat.step\n"
        "    cfg = config['step']\n"
        "    own = incident['resume_step']  # not a beat or event: the report's incident\n"
    )
    found = violations([source])
    lines = sorted(int(item.split(":")[1]) for item in found)
    assert lines == [2, 3, 4, 5, 5], found
