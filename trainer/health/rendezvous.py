"""The all-reduce across the allocation, and who to blame when a node cannot join it.

One task per node. Rank 0 of the step (SLURM_PROCID 0) hosts a torch TCPStore; every key lives
under a secret prefix that only the job's owner can read (trainer/health/secret.py: another user
on a node can reach the port, but cannot name, delete or forge a key). Every task registers in it
("reg/<rank>" = its node and whether its own checks passed). Rank 0 closes the registration when
every rank is in, or at the registration deadline; the ranks still missing then are asked once
more ("retry" = their ranks: a rank that sees itself there registers again) during a short second
window; then rank 0 publishes the roster:

    {"members": [ranks whose own checks passed], "joined": {rank: node}, "missing": [ranks],
     "attributed": true if more than half of the ranks joined}

in the store (key "roster") and, for the nodes that could not reach the store at all, in the job
directory (health/.rendezvous-<job>.<step>.roster, JSON written atomically by rank 0; not named
*.json, so that a glob of health/*.json sees the node files only). The members then all-reduce a 1 MiB tensor
(gloo on CPU, NCCL on GPU) and check the sum.

Who is blamed (the rule, and why):
- A node is never blamed only because its registration is missing from the roster. It is asked
  once more (the retry above); a node that registered (twice, if asked) and is still missing
  blames nobody: the store lost it, or someone did.
- A node whose own attempt failed (it could not reach the store, or registered only after the
  roster was out) while more than half of the allocation joined failed alone: it is the culprit
  (its own file says so when it can still write one; the launcher treats a missing file as
  unhealthy anyway). Rank 0's file names the missing nodes.
- When half or fewer joined, or rank 0 could not host the store, or published no roster, the
  fault may be rank 0's node or the network: nobody is blamed ("blames_node": false in every
  file that can say it, and "allocation_problem" set), because excluding the healthy majority on
  one incident would be worse than a job-level restart (DESIGN: one incident is one incident).
- When the collective itself fails, times out or sums wrong among the members, it cannot be
  attributed to one node: recorded in every member's file, nobody blamed, same as above.

Port: the trainer's rendezvous uses 10000 + job_id % 20000 (sbatch_templates/train.sbatch.j2);
this check uses HEALTH_PORT_BASE + (job_id + step_id) % HEALTH_PORT_SPAN = 61000-64999: never the
trainer's port, never a local test cluster's slurmctld/slurmd (30000-39999, tests/fixtures_slurm.py),
above Linux's default ephemeral range (32768-60999, net.ipv4.ip_local_port_range: a site that
widened it should set TRAINER_HEALTH_PORT or reserve the range), and a new port for every check
step of a job (a re-check of the spares does not wait for the previous store's socket to close).
TRAINER_HEALTH_PORT overrides it (tests). Address: MASTER_ADDR when the step spans the job's
nodes (the job script resolved it for the first node), else the first node of the step resolved
the same way the job script does (scontrol NodeAddr, then getaddrinfo).
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.contract import UntrustedFileError, atomic_write_json, loads_bounded, read_untrusted_json
from orchestrator.slurm.nodes import node_address, slurm_hostnames
from trainer.health.checks import Check, one_line
from trainer.health.secret import TokenError, create_token, prefixed, read_token, token_file

HEALTH_PORT_BASE = 61000
HEALTH_PORT_SPAN = 4000
TENSOR_FLOATS = 1 << 18  # 1 MiB of fp32: enough to cross the network, too small to cost time
POLL_SECONDS = 0.1


@dataclass(frozen=True)
class Layout:
    rank: int
    world: int
    node: str
    job_id: str
    step_id: str
    addr: str
    port: int


@dataclass(frozen=True)
class Deadlines:
    """Absolute time.monotonic() deadlines of one check run, as fractions of timeout_seconds T
    from the process start. Rank 0 closes the registration REGISTRATION_WINDOW x T after its own
    store is up (not after its start): every node pays the same slow start (importing torch,
    from a shared filesystem at scale, or on a loaded machine), so a healthy peer that started
    with rank 0 is ready about when rank 0 is, and still has that window; at the latest at
    `first_close` (0.65 T). The ranks still missing then are asked again for RETRY_WINDOW x T (at
    least RETRY_SECONDS_MIN), until `registration` (0.7 T) at the latest. In the normal case
    everyone registers at once and nobody waits."""

    timeout: float
    first_close: float  # latest close of the first registration window
    registration: float  # latest close of the retry; clients give up connecting
    roster: float  # a registered rank gives up waiting for the roster
    collective: float  # the all-reduce and its process group
    hard: float  # the watchdog writes what is known and exits

    @classmethod
    def from_timeout(cls, start: float, timeout: float) -> Deadlines:
        t = timeout
        return cls(t, start + 0.65 * t, start + 0.7 * t, start + 0.75 * t, start + 0.9 * t, start + 0.95 * t)

    def close_registration(self, store_up: float) -> float:
        return min(store_up + REGISTRATION_WINDOW * self.timeout, self.first_close)

    def close_retry(self, first_close: float) -> float:
        return min(first_close + max(RETRY_WINDOW * self.timeout, RETRY_SECONDS_MIN), self.registration)


REGISTRATION_WINDOW = 0.4
# The retry: RETRY_WINDOW x timeout_seconds (>= 30 s in a config: 1.5 s or more), and never less than
# RETRY_SECONDS_MIN, the time a live rank needs to see the request (it polls every POLL_SECONDS) and
# register again on a loaded node. A 0.4 s window (an 8 s timeout) was missed on a throttled machine.
RETRY_WINDOW = 0.05
RETRY_SECONDS_MIN = 1.5


def store_address(env: Mapping[str, str]) -> str:
    step_nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
    if not step_nodes or (env.get("MASTER_ADDR") and step_nodes == env.get("SLURM_JOB_NODELIST")):
        return env.get("MASTER_ADDR", "127.0.0.1")
    return node_address(slurm_hostnames(step_nodes)[0])


def health_port(env: Mapping[str, str]) -> int:
    if env.get("TRAINER_HEALTH_PORT"):
        return int(env["TRAINER_HEALTH_PORT"])
    job, step = env.get("SLURM_JOB_ID", "0"), env.get("SLURM_STEP_ID", "0")
    if not (job.isdigit() and step.isdigit()):
        raise RuntimeError(
            f"SLURM_JOB_ID={job!r} / SLURM_STEP_ID={step!r} are not numbers: set TRAINER_HEALTH_PORT"
        )
    return HEALTH_PORT_BASE + (int(job) + int(step)) % HEALTH_PORT_SPAN


def layout_from_env(env: Mapping[str, str], node: str) -> Layout:
    """This task's place in the check step (one task per node), from SLURM's variables."""
    rank, world = int(env.get("SLURM_PROCID", "0")), int(env.get("SLURM_NTASKS", "1"))
    tasks, nodes = env.get("SLURM_STEP_NUM_TASKS"), env.get("SLURM_STEP_NUM_NODES")
    if tasks and nodes and tasks != nodes:
        raise ValueError(f"the step has {tasks} tasks on {nodes} nodes: run it with --ntasks-per-node=1")
    return Layout(
        rank,
        world,
        node,
        env.get("SLURM_JOB_ID", "local"),
        env.get("SLURM_STEP_ID", "0"),
        store_address(env),
        health_port(env),
    )


def wait_for_port(addr: str, port: int, deadline: float, closed: Path) -> None:
    """Until `port` accepts a connection (rank 0's store is up), or TimeoutError at `deadline` or
    once rank 0 has published the roster file `closed` (too late to register then). Plain
    sockets: TCPStore's own connect retries back off and overshoot their timeout by seconds."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or closed.exists():
            raise TimeoutError(f"nothing accepted a connection on {addr}:{port} in time")
        try:
            socket.create_connection((addr, port), timeout=min(2.0, left)).close()
            return
        except OSError:
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))


def rendezvous_file(health_dir: Path, layout: Layout) -> Path:
    return health_dir / f".rendezvous-{layout.job_id}.{layout.step_id}.roster"


class Stage:
    """Where this check run is, for the watchdog if it has to fire: stuck in a stage of its own
    (`on_this_node`: local checks, imports) blames this node; stuck in a stage that waits on other
    nodes (the store, the collective) blames nobody."""

    def __init__(self) -> None:
        self.name = "the local checks"
        self.on_this_node = True

    def __call__(self, name: str, on_this_node: bool = False) -> None:
        self.name, self.on_this_node = name, on_this_node


def _unattributed(detail: str) -> Check:
    return Check("allreduce", False, detail, node_fault=False)


def _seconds_left(deadline: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=max(1.0, deadline - time.monotonic()))


# -- rank 0 ---------------------------------------------------------------------------------------
def _gather(store: Any, world: int, joined: dict[int, dict[str, Any]], deadline: float) -> None:
    """Add to `joined` each rank whose registration is in the store, until all are or `deadline`."""
    while True:
        for rank in range(world):
            if rank not in joined and store.check([f"reg/{rank}"]):
                try:
                    joined[rank] = dict(loads_bounded(store.get(f"reg/{rank}")))
                except (ValueError, TypeError):
                    continue  # not a registration of ours: the rank stays missing
        if len(joined) == world or time.monotonic() >= deadline:
            return
        time.sleep(POLL_SECONDS)


def _collect_roster(store: Any, layout: Layout, local_ok: bool, deadlines: Deadlines) -> dict[str, Any]:
    joined = {0: {"node": layout.node, "ok": local_ok}}  # rank 0 knows it is in
    first_close = deadlines.close_registration(time.monotonic())
    _gather(store, layout.world, joined, first_close)
    missing = [r for r in range(layout.world) if r not in joined]
    if missing:  # asked once more: a live rank whose registration the store lost registers again
        store.set("retry", json.dumps(missing))
        _gather(store, layout.world, joined, deadlines.close_retry(first_close))
    return {
        "members": [r for r, info in sorted(joined.items()) if info.get("ok")],
        "joined": {str(r): str(info.get("node", "?")) for r, info in joined.items()},
        "missing": [r for r in range(layout.world) if r not in joined],
        "attributed": 2 * len(joined) > layout.world,
        "job_id": layout.job_id,
        "step_id": layout.step_id,
    }


def _missing_detail(roster: dict[str, Any], world: int) -> str:
    missing = roster["missing"]
    if not missing or not roster["attributed"]:
        return ""  # not attributed: check_allreduce says so for every rank
    names = _step_nodes(world)
    shown = ", ".join(names[r] if names else f"rank {r}" for r in missing[:8]) + (
        " ..." if len(missing) > 8 else ""
    )
    return f"; {shown} did not register, even when asked again ({world - len(missing)} of {world} did)"


def _step_nodes(world: int) -> list[str] | None:
    """The step's nodes in rank order (one task per node, block distribution), or None."""
    nodelist = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST")
    if not nodelist:
        return None
    try:
        names = slurm_hostnames(nodelist)
    except (OSError, subprocess.SubprocessError):
        return None
    return names if len(names) == world else None


# -- every rank -----------------------------------------------------------------------------------
def _all_reduce(store: Any, members: list[int], rank: int, backend: str, deadline: float) -> str:
    """All-reduce among the members; returns a detail. Raises when it fails or sums wrong."""
    import torch
    import torch.distributed as dist

    index, size = members.index(rank), len(members)
    device = "cpu"
    if backend == "nccl":
        torch.cuda.set_device(0)  # one task per node: the first GPU it sees
        device = "cuda"
    prefix = dist.PrefixStore("allreduce", store)
    dist.init_process_group(
        backend, store=prefix, rank=index, world_size=size, timeout=_seconds_left(deadline)
    )
    try:
        tensor = torch.full((TENSOR_FLOATS,), float(index + 1), device=device)
        started = time.monotonic()
        dist.all_reduce(tensor)
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.monotonic() - started
        expected = size * (size + 1) / 2  # 1 + 2 + ... + size
        wrong = int((tensor != expected).sum())
        if wrong:
            raise RuntimeError(f"{wrong} of {TENSOR_FLOATS} values differ from the expected sum {expected:g}")
    finally:
        dist.destroy_process_group()
    return f"{backend} all-reduce of {TENSOR_FLOATS * 4 >> 20} MiB over {size} node(s) in {seconds * 1000:.1f} ms"


def _wait_for_done(store: Any, ranks: list[int], deadline: float) -> None:
    """Rank 0 keeps the store up until the ranks that joined are done with it."""
    keys = [f"done/{r}" for r in ranks]
    while keys and time.monotonic() < deadline and not store.check(keys):
        time.sleep(POLL_SECONDS)


def _read_roster_file(path: Path, layout: Layout, deadline: float) -> dict[str, Any] | None:
    """Rank 0's roster from the shared filesystem, for a rank that could not reach the store. Only
    a small regular file of our own user, never a symlink, for this job and step."""
    while time.monotonic() < deadline:
        try:
            roster, _ = read_untrusted_json(path, max_bytes=1 << 20, owner_uid=os.getuid())
            if (
                isinstance(roster, dict)
                and roster.get("job_id") == layout.job_id
                and roster.get("step_id") == layout.step_id
            ):
                return roster
        except FileNotFoundError:
            pass
        except UntrustedFileError:
            return None
        time.sleep(0.5)
    return None


def _unreachable(layout: Layout, health_dir: Path, deadlines: Deadlines, why: str) -> Check:
    """This rank could not reach the store (or registered too late): blame itself only when a
    majority of the allocation made it (rank 0's roster on the shared filesystem says so)."""
    roster = _read_roster_file(rendezvous_file(health_dir, layout), layout, deadlines.collective)
    where = f"{layout.addr}:{layout.port}"
    if roster is None:
        return _unattributed(
            f"{why} ({where}), and rank 0 published no roster: rank 0's node or the network "
            "is at fault, not attributable to this node"
        )
    if roster.get("store_failed"):
        return _unattributed(
            f"rank 0 could not host the rendezvous store: {one_line(str(roster['store_failed']), 200)}"
        )
    if str(layout.rank) not in roster.get("joined", {}) and roster.get("attributed"):
        return Check(
            "allreduce",
            False,
            f"{why} ({where}) while {len(roster['joined'])} of {layout.world} nodes "
            "did: check this node's network (interfaces, routes, firewall)",
        )
    return _unattributed(
        f"{why} ({where}); only {len(roster.get('joined', {}))} of {layout.world} nodes registered: "
        "not attributable to one node"
    )


def check_allreduce(
    layout: Layout,
    local_ok: bool,
    backend: str,
    deadlines: Deadlines,
    health_dir: Path,
    stage: Stage,
    unreachable_fault: bool = False,
) -> Check:
    """The all-reduce check of this rank (see the module docstring for who is blamed)."""
    from torch.distributed import TCPStore

    stage("rendezvous store")
    is_master = layout.rank == 0
    secret = token_file(health_dir, layout.job_id, layout.step_id)
    try:
        # health_unreachable (TEST FAULT): this rank dials a port where nothing listens, so the
        # real connect-timeout path runs.
        port = layout.port + 1 if unreachable_fault and not is_master else layout.port
        if is_master:
            token = create_token(secret)  # before the port opens: whoever reaches it finds the file
        else:
            wait_for_port(layout.addr, port, deadlines.registration, rendezvous_file(health_dir, layout))
            token = read_token(secret, deadlines.registration)
        store = TCPStore(
            layout.addr,
            port,
            None,
            is_master,
            timeout=_seconds_left(deadlines.registration),
            wait_for_workers=False,
        )
    except TokenError as exc:
        if is_master:
            _publish_store_failure(health_dir, layout, str(exc))
        return _unattributed(f"no rendezvous token: {one_line(str(exc), 200)}: not attributable to one node")
    except Exception as exc:  # noqa: BLE001 - torch raises RuntimeError/DistNetworkError/TimeoutError
        if is_master:
            _publish_store_failure(health_dir, layout, str(exc))
            return _unattributed(
                f"cannot host the rendezvous store on port {layout.port}: {one_line(str(exc), 200)}"
            )
        stage("waiting for rank 0's roster file")
        return _unreachable(layout, health_dir, deadlines, "could not reach the rendezvous store")
    store = prefixed(store, token)
    if is_master:
        stage("registration")
        roster = _collect_roster(store, layout, local_ok, deadlines)
        store.set("roster", json.dumps(roster))
        atomic_write_json(rendezvous_file(health_dir, layout), roster)
    else:
        registration = json.dumps({"node": layout.node, "ok": local_ok})
        late = store.check(["roster"])  # rank 0 gave up on us before we could register
        store.set(f"reg/{layout.rank}", registration)
        stage("waiting for the roster")
        try:
            roster = _await_roster(store, layout.rank, registration, deadlines.roster)
        except Exception:  # noqa: BLE001
            return _unattributed(
                "registered, but rank 0 published no roster in time: rank 0's node or the network"
            )
        if layout.rank in roster["missing"]:
            if late:
                return _unreachable(layout, health_dir, deadlines, "registered after the window closed")
            return _unattributed(
                "registered in time (and again when asked), yet missing from rank 0's roster: the store "
                "lost the registration, or someone removed it; not attributable to this node"
            )
    members: list[int] = roster["members"]
    extra = _missing_detail(roster, layout.world) if is_master else ""
    try:
        if layout.rank not in members:
            check = Check("allreduce", True, f"skipped: this node failed its own checks{extra}")
        else:
            stage(f"{backend} all-reduce over {len(members)} node(s)")
            check = Check(
                "allreduce",
                True,
                _all_reduce(store, members, layout.rank, backend, deadlines.collective) + extra,
            )
    except Exception as exc:  # noqa: BLE001
        check = _unattributed(
            f"the {backend} all-reduce over {len(members)} node(s) failed: {one_line(str(exc), 200)}: "
            "not attributable to one node"
        )
    finally:
        # Every rank that got the roster says so, the skipped ones too: a node that failed its own
        # checks may read the roster after the members are done, and rank 0 must not take the store
        # down before it has (seen in CI: node02 "published no roster" while rank 0 had published it).
        _set_quietly(store, f"done/{layout.rank}")
    if is_master:
        stage("waiting for the nodes that joined to finish")
        _wait_for_done(store, sorted(int(r) for r in roster["joined"]), deadlines.hard - 1.0)
    if not roster["attributed"]:
        check = _unattributed(
            f"{check.detail}; only {len(roster['joined'])} of {layout.world} nodes reached rank 0's "
            "store: suspect rank 0's node or the network, not one node"
        )
    return check


def _await_roster(store: Any, rank: int, registration: str, deadline: float) -> dict[str, Any]:
    """The roster, once rank 0 publishes it; on the way, register again once if rank 0 asks this
    rank to (its first registration is not in the store). TimeoutError at `deadline`."""
    asked = False
    while time.monotonic() < deadline:
        if store.check(["roster"]):
            return loads_bounded(store.get("roster"))
        if not asked and store.check(["retry"]) and rank in loads_bounded(store.get("retry")):
            store.set(f"reg/{rank}", registration)
            asked = True
        time.sleep(POLL_SECONDS)
    raise TimeoutError("no roster")


def _publish_store_failure(health_dir: Path, layout: Layout, why: str) -> None:
    """Rank 0 could not host the check: the ranks that wait for its roster file learn it at once."""
    atomic_write_json(
        rendezvous_file(health_dir, layout),
        {"store_failed": one_line(why, 200), "job_id": layout.job_id, "step_id": layout.step_id},
    )


def _set_quietly(store: Any, key: str) -> None:
    try:
        store.set(key, "1")
    except Exception:  # noqa: BLE001 - rank 0 may be gone: nothing to tell it then
        pass
