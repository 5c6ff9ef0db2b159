"""Issue 22, "Done when": every reader of a file another user could have written or planted, fed
random bytes, deep nesting, records with the right keys and random values, huge sizes, FIFOs
(with and without a writer), directories, symlinks and hard links. For each: 0 exceptions other
than the reader's own error type escape it, and 0 reads block (each runs in a thread, bounded).

Readers (where the file sits; what may escape):
    contract.read_untrusted_json       any file                    UntrustedFileError
    contract.read_owned_json           any file                    ContractError
    read_allocation / read_decision / read_standby_go   jobs/<id>/  ContractError
    read_manifest                      checkpoints/step_N/         ContractError
    read_latest                        checkpoints/latest          nothing
    read_heartbeats                    heartbeats/                 ContractError (a newer version)
    controller.requests.read_requests  control/kill, nodes-clear   nothing
    contract.requests.read_accepted    accepted/kill               nothing
    controller.exclude.read_excluded   excluded-nodes.json         nothing
    aux_files.read_result              aux/<kind>-<id>/            AuxResultError
    the launcher's health results      jobs/<id>/health/<node>.json  nothing
    contract.directive.read_rollback   accepted/rollback           DirectiveError
Runs as any user (no real users needed): what is checked is the code's handling, not the kernel's.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fakes import make_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.contract import (
    Allocation,
    ContractError,
    Decision,
    Heartbeat,
    LaunchEnd,
    LauncherState,
    Manifest,
    OperatorRequest,
    Phase,
    RunPaths,
    UntrustedFileError,
    read_allocation,
    read_decision,
    read_heartbeats,
    read_latest,
    read_manifest,
    read_owned_json,
    read_untrusted_json,
)
from orchestrator.contract.allocation import StandbyGo, read_standby_go
from orchestrator.contract.directive import DirectiveError, Rollback, read_rollback
from orchestrator.contract.exclude import read_excluded
from orchestrator.contract.manifest import FileEntry
from orchestrator.contract.requests import read_accepted
from orchestrator.controller.requests import read_requests
from orchestrator.controller.stacks import collect_stacks
from orchestrator.operate.aux_files import AuxResultError, read_result, result_json
from orchestrator.slurm.launcher.launcher import JobPlan, Launcher
from orchestrator.slurm.launcher.srun_lines import Layout

READ_SECONDS = 5.0  # a read that takes longer is blocked (a FIFO opened without O_NONBLOCK)
OPERATORS = make_config().operators


@dataclass(frozen=True)
class Reader:
    name: str
    file: Callable[[RunPaths], Path]  # where the hostile file goes
    read: Callable[[RunPaths], Any]
    may_raise: tuple[type[BaseException], ...] = ()
    valid: dict[str, Any] = field(default_factory=dict)  # a record it accepts: mutated by the fuzzer


def _aux_job(paths: RunPaths) -> SimpleNamespace:
    folder = paths.aux / "eval-1"
    return SimpleNamespace(folder=folder, result_pickle=folder / "1_0_result.pkl", submitted_pickle=folder / "x")


def _health_result(paths: RunPaths) -> Any:
    plan = JobPlan(paths.root, Layout(1, 1, 1, 60), ["python3", "-m", "trainer", str(paths.root)], 0.0, True, 60.0)
    return Launcher(plan, env={"SLURM_JOB_ID": "7"})._health_result(paths.health("7") / "node01.json")


BEAT = Heartbeat(0, 4, "node01", "7", 42, 3, Phase.STEP, 100.0, 99.0, 50.0)
ALLOCATION = Allocation(
    "7", LauncherState.WAITING_DECISION, 0, ["node01", "node02"], ["node03"], {"node04": "bad"}, {},
    LaunchEnd.from_srun(0, 1, "srun: error: node02: task 1: Killed"), waits_for_decisions=True,
)  # fmt: skip
REQUEST = OperatorRequest("kill", "oncall", 1001, "why", False, 1.0)
ROLLBACK = Rollback("r1", 10, ((5, 9),), 0.5, 3, "spike", "controller", 1.0)
READERS = [
    Reader("read_untrusted_json", lambda p: p.root / "f", lambda p: read_untrusted_json(p.root / "f"),
           (UntrustedFileError,), {"a": [1, {"b": None}]}),
    Reader("read_owned_json", lambda p: p.root / "f", lambda p: read_owned_json(p.root / "f"), (ContractError,),
           {"a": 1}),
    Reader("read_allocation", lambda p: p.allocation("7"), lambda p: read_allocation(p.allocation("7")),
           (ContractError,), ALLOCATION.to_dict()),
    Reader("read_decision", lambda p: p.launch_decision("7", 0), lambda p: read_decision(p.launch_decision("7", 0)),
           (ContractError,), Decision(0, "relaunch", ("node02",), "dead_rank").to_dict()),
    Reader("read_standby_go", lambda p: p.standby_go("7", 1), lambda p: read_standby_go(p.standby_go("7", 1)),
           (ContractError,), StandbyGo(1, ("node01",), 1, "127.0.0.1", 29500).to_dict()),
    Reader("read_manifest", lambda p: p.checkpoint(5) / "MANIFEST.json", lambda p: read_manifest(p.checkpoint(5)),
           (ContractError,), Manifest({"a.pt": FileEntry(3, "ab")}, step=5, layout={"tp": 1}).to_dict()),
    Reader("read_latest", lambda p: p.latest, lambda p: read_latest(p.checkpoints)),
    Reader("read_heartbeats", lambda p: p.heartbeat(0), lambda p: read_heartbeats(p.heartbeats), (ContractError,),
           BEAT.to_dict()),
    Reader("read_requests kill", lambda p: p.control_request("kill"), lambda p: read_requests(p, OPERATORS),
           valid={"version": 1, "reason": "why", "now": True}),
    Reader("read_requests nodes-clear", lambda p: p.control_request("nodes-clear"),
           lambda p: read_requests(p, OPERATORS), valid={"version": 1, "reason": "x", "nodes": ["node01"], "all": False}),
    Reader("read_accepted", lambda p: p.accepted_request("kill"), lambda p: read_accepted(p, "kill"),
           valid=REQUEST.to_dict()),
    Reader("read_excluded", lambda p: p.exclude_list, read_excluded,
           valid={"nodes": {"node01": {"since": 1.0, "reason": "x", "by": "controller"}}}),
    Reader("aux read_result", lambda p: result_json(_aux_job(p)), lambda p: read_result(_aux_job(p)),
           (AuxResultError,), {"status": "success", "result": {"loss": 1.0}}),
    Reader("launcher health result", lambda p: p.health("7") / "node01.json", _health_result,
           valid={"ok": False, "reason": "gpu", "allocation_problem": ""}),
    Reader("read_rollback", lambda p: p.accepted_request("rollback"), read_rollback, (DirectiveError,),
           ROLLBACK.to_dict()),
]  # fmt: skip

# Keys of every record above, with random values: what reaches the typed records' validation.
RECORD_KEYS = [
    "version", "job_id", "state", "launch", "nodes", "spares", "unhealthy", "left_out", "ended", "note", "action",
    "leave_out", "reason", "files", "step", "layout", "probe", "rank", "host", "phase", "status", "result", "ok",
    "allocation_problem", "master_addr", "master_port", "tasks_per_node", "to_step", "skip_samples", "id",
    "lr_scale", "user", "uid", "now", "time", "name", "all", "all_nodes", "world", "pid", "beat_time", "seq",
    "exit_code", "srun_exit_code", "failed_host", "requested_by", "requested_at", "lr_scale_steps",
]  # fmt: skip
SCALARS = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12)
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=20)
DELETE = object()
NOISE = st.one_of(
    st.binary(max_size=2048),
    st.integers(1, 6000).map(lambda n: b"[" * n),
    st.integers(1, 3000).map(lambda n: b'{"nodes":' * n + b"1" + b"}" * n),
    st.integers(1, 3000).map(lambda n: b'{"a":[' * n + b"]}" * n),
    VALUES.map(lambda v: json.dumps(v).encode()),
)  # fmt: skip


def mutated(valid: dict[str, Any]) -> st.SearchStrategy[bytes]:
    """`valid` with one to four of its keys (or other records' keys) deleted or given random
    values, or one of its values nested deeply: what gets past the first checks of a record."""
    keys = st.sampled_from(sorted(valid) or ["x"]) | st.sampled_from(RECORD_KEYS)  # its own keys half the time

    def edit(changes: dict[str, Any]) -> bytes:
        record = dict(valid)
        for key, value in changes.items():
            if value is DELETE:
                record.pop(key, None)
            else:
                record[key] = value
        return json.dumps(record).encode()

    deep = st.tuples(st.sampled_from(sorted(valid) or ["x"]), st.integers(30, 3000)).map(
        lambda kn: json.dumps(valid).replace(f'"{kn[0]}": ', f'"{kn[0]}": ' + "[" * kn[1], 1).encode()
        + b"]" * kn[1]
    )
    changes = st.dictionaries(keys, st.just(DELETE) | VALUES, min_size=1, max_size=4)
    return changes.map(edit) | deep


def prepared_run(base: Path) -> RunPaths:
    """A run directory with the folders the readers look in (aux/ owner-only, as the aux check wants)."""
    paths = RunPaths.of(base / "run")
    for folder in (paths.root, paths.control, paths.accepted, paths.heartbeats, paths.jobs):
        folder.mkdir(mode=0o755, exist_ok=True)
    for folder in (paths.aux, _aux_job(paths).folder):
        folder.mkdir(mode=0o700)
    return paths


def bounded(reader: Reader, paths: RunPaths) -> BaseException | None:
    """Run the reader in a thread; the exception it let out (None: none), or a failure when it blocked."""
    caught: list[BaseException | None] = []

    def read() -> None:
        try:
            reader.read(paths)
            caught.append(None)
        except BaseException as exc:  # noqa: BLE001 - judged below
            caught.append(exc)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(READ_SECONDS)
    assert not thread.is_alive(), f"{reader.name} blocked for more than {READ_SECONDS} s"
    return caught[0]


def check(reader: Reader, paths: RunPaths) -> None:
    escaped = bounded(reader, paths)
    if escaped is not None and not isinstance(escaped, reader.may_raise):
        raise AssertionError(f"{reader.name} let out {type(escaped).__name__}: {escaped}") from escaped


@pytest.mark.parametrize("reader", READERS, ids=[r.name for r in READERS])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_deep_and_misshapen_content_only_raises_the_readers_error(reader, data):
    body = data.draw(NOISE | mutated(reader.valid), label="body")
    with tempfile.TemporaryDirectory() as base:
        paths = prepared_run(Path(base))
        target = reader.file(paths)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(body)
        check(reader, paths)


HOSTILE_VALUES = [None, True, -1, 2**70, 1.5, float("nan"), "", "x" * 5000, "../../etc", [], [None], {}, {"a": None},
                  [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[0]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]  # fmt: skip


def single_field_edits(valid: dict[str, Any]) -> list[tuple[str, Any]]:
    """Every field (and every field of a field that is an object), set to each hostile value or
    removed: (what, the record)."""
    edits = []
    for key, value in valid.items():
        for hostile in [DELETE, *HOSTILE_VALUES]:
            record = dict(valid)
            record.pop(key) if hostile is DELETE else record.__setitem__(key, hostile)
            edits.append((f"{key}={'(removed)' if hostile is DELETE else repr(hostile)[:20]}", record))
        if isinstance(value, dict):
            for what, inner in single_field_edits(value):
                edits.append((f"{key}.{what}", {**valid, key: inner}))
    return edits


@pytest.mark.parametrize("reader", READERS, ids=[r.name for r in READERS])
def test_every_field_of_a_record_given_a_hostile_value_only_raises_the_readers_error(reader, tmp_path):
    """Deterministic, beside the fuzzer: each field of a record the reader accepts, one at a time."""
    paths = prepared_run(tmp_path)
    target = reader.file(paths)
    target.parent.mkdir(parents=True, exist_ok=True)
    for what, record in single_field_edits(reader.valid):
        target.unlink(missing_ok=True)
        target.write_text(json.dumps(record))
        try:
            check(reader, paths)
        except AssertionError as exc:
            raise AssertionError(f"{what}: {exc}") from exc


def test_the_valid_records_are_read(tmp_path):
    """The fuzzer's starting points are records each reader accepts (else it mutates garbage)."""
    for reader in READERS:
        base = tmp_path / reader.name.replace(" ", "-")
        base.mkdir()
        paths = prepared_run(base)
        target = reader.file(paths)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(reader.valid))
        assert bounded(reader, paths) is None, reader.name


def plant(kind: str, target: Path, base: Path) -> list[int]:
    """Put a `kind` of hostile file at `target`; returns descriptors to close afterwards."""
    valid = base / "valid.json"
    valid.write_text('{"version": 1, "reason": "x", "nodes": ["node01"]}')
    fifo = base / "fifo"
    if not fifo.exists():
        os.mkfifo(fifo)
    keep: list[int] = []
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "fifo with a writer":
        os.mkfifo(target)
        keep.append(os.open(target, os.O_RDWR))  # holds it open: a non-blocking read gets EAGAIN
    elif kind == "directory":
        target.mkdir()
    elif kind == "huge":
        with open(target, "wb") as handle:
            handle.truncate(1 << 30)  # sparse: 1 GiB that costs nothing
    elif kind == "symlink to JSON":
        target.symlink_to(valid)
    elif kind == "symlink to a FIFO":
        target.symlink_to(fifo)
    elif kind == "symlink to /dev/zero":
        target.symlink_to("/dev/zero")
    elif kind == "dangling symlink":
        target.symlink_to(base / "nowhere")
    elif kind == "hard link":
        os.link(valid, target)
    else:  # pragma: no cover
        raise ValueError(kind)
    return keep


KINDS = [
    "fifo", "fifo with a writer", "directory", "huge", "symlink to JSON", "symlink to a FIFO",
    "symlink to /dev/zero", "dangling symlink", "hard link",
]  # fmt: skip


@pytest.mark.parametrize("reader", READERS, ids=[r.name for r in READERS])
def test_fifos_links_folders_and_huge_files_never_block_nor_escape(reader, tmp_path):
    for kind in KINDS:
        base = tmp_path / kind.replace(" ", "-").replace("/", "")
        base.mkdir()
        paths = prepared_run(base)
        target = reader.file(paths)
        target.parent.mkdir(parents=True, exist_ok=True)
        keep = plant(kind, target, base)
        try:
            check(reader, paths)
        except AssertionError as exc:
            raise AssertionError(f"{kind}: {exc}") from exc
        finally:
            for fd in keep:
                os.close(fd)


def test_stack_dumps_are_listed_never_opened(tmp_path):
    """stacks/ (the ranks' dumps, NCCL flight-recorder files): the controller lists names and
    mtimes without following links; a FIFO or a link to a device there never blocks it."""
    paths = prepared_run(tmp_path)
    paths.stacks.mkdir()
    os.mkfifo(paths.stack_dump(0))
    paths.stack_dump(1).symlink_to("/dev/zero")
    recorder = Path(f"{paths.flight_recorder_prefix('7')}0")
    recorder.symlink_to(tmp_path / "fifo-elsewhere")
    os.mkfifo(tmp_path / "fifo-elsewhere")
    lister = Reader(
        "collect_stacks", lambda p: p.stacks,
        lambda p: collect_stacks(p, "7", expected=4, wait_seconds=0.2, now=0.0, monotonic=time.monotonic,
                                 sleep=time.sleep),
    )  # fmt: skip
    check(lister, paths)
    event = collect_stacks(paths, "7", expected=4, wait_seconds=0.1, now=0.0, monotonic=time.monotonic, sleep=time.sleep)
    assert event.flight_recorder == [recorder.name], event
