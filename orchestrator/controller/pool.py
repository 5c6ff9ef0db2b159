"""The node pool, judged with SLURM's own word: pure rules from SLURM's node states and the
run's exclude list to actions.

- Before blaming a node (`leave_to_slurm`): a node SLURM already downs or drains is SLURM's
  problem (an admin or slurmctld took it out, and will return it): no exclusion, an event
  naming SLURM's state and reason.
- Probations (`expired`): an exclusion ends at its `until`, on the controller's clock.
- The pool (`judge`): the nodes of the job's partition that SLURM would schedule (not down,
  drained or reserved) and the run has not excluded. Fewer than the job needs (nodes +
  spare_nodes) is a critical event and a notification on the pass that finds it, kept in
  state.json for `runctl status` and `runctl doctor` until it recovers (an event then too).
  `exclusions.on_pool_short: release_oldest` releases the oldest probations of nodes SLURM would
  schedule, as many as the job lacks; `wait` keeps them, and says so. Whatever the policy, the
  probations of hunches end first (`hunches`): nodes excluded together for one hang, which names
  one culprit, so all but one of them were its collective peers, waiting.
When SLURM cannot be asked nothing here is judged (no guess from an empty answer).
"""

from __future__ import annotations

from orchestrator.contract import Exclusion
from orchestrator.contract import pool_events as pev
from orchestrator.contract.state import ControllerState, PoolStatus
from orchestrator.slurm.base import NodeInfo

from .actions import Action, Notify, Record, ReleaseExclusions, SetPool
from .recovery import Failure


def leave_to_slurm(
    failure: Failure, slurm_nodes: dict[str, NodeInfo] | None
) -> tuple[tuple[str, ...], list[Action]]:
    """(the culprits still to blame, events for those SLURM already took out)."""
    if not slurm_nodes:
        return failure.culprits, []
    kept: list[str] = []
    actions: list[Action] = []
    for node in failure.culprits:
        info = slurm_nodes.get(node)
        if info is None or not info.slurm_took_it:
            kept.append(node)
            continue
        actions.append(
            Record(
                pev.NodeLeftToSlurm(
                    node=node,
                    job_id=failure.job_id,
                    cause=failure.cause,
                    slurm_state=info.state,
                    slurm_reason=info.reason,
                )
            )
        )
    return tuple(kept), actions


def hunches(exclusions: dict[str, Exclusion], excluded: list[str]) -> list[str]:
    """Of the `excluded` nodes, those excluded for a hang together with another node of the same
    job, oldest first."""
    by_job: dict[str, list[str]] = {}
    for node in excluded:
        entry = exclusions[node]
        if entry.cause == "hang" and entry.job_id:
            by_job.setdefault(entry.job_id, []).append(node)
    shared = [n for nodes in by_job.values() if len(nodes) > 1 for n in nodes]
    return sorted(shared, key=lambda n: (exclusions[n].since or 0.0, n))


def expired(exclusions: dict[str, Exclusion], now: float) -> list[Action]:
    ended = sorted(node for node, entry in exclusions.items() if entry.expired(now))
    return [ReleaseExclusions(tuple(ended), "probation expired")] if ended else []


def judge(
    state: ControllerState,
    slurm_nodes: dict[str, NodeInfo] | None,
    exclusions: dict[str, Exclusion],
    *,
    needed: int,
    partition: str | None,
    policy: str,
    now: float,
    run_dir: str,
) -> list[Action]:
    if not slurm_nodes:
        return []
    pool = [n for n in slurm_nodes.values() if not partition or not n.partitions or partition in n.partitions]
    down = sorted(n.name for n in pool if n.down)
    drained = sorted(n.name for n in pool if n.drained and not n.down)
    reserved = sorted(n.name for n in pool if n.reserved and not (n.down or n.drained))
    schedulable = {n.name for n in pool if n.schedulable}
    excluded = sorted(n for n in exclusions if n in schedulable)
    usable = len(schedulable) - len(excluded)
    actions: list[Action] = []
    early = hunches(exclusions, excluded)[: max(0, needed - usable)]
    if early:
        actions.append(
            ReleaseExclusions(
                tuple(early),
                f"pool short ({usable} usable of {needed} needed): excluded with another node for one hang "
                "(its collective peer, not the culprit): probation ended early",
            )
        )
        excluded = sorted(set(excluded) - set(early))
        usable += len(early)
    if usable < needed and policy == "release_oldest" and excluded:
        oldest = sorted(excluded, key=lambda n: (exclusions[n].since or 0.0, n))[: needed - usable]
        actions.append(
            ReleaseExclusions(
                tuple(oldest),
                f"pool short ({usable} usable of {needed} needed): exclusions.on_pool_short=release_oldest",
            )
        )
        excluded = sorted(set(excluded) - set(oldest))
        usable += len(oldest)
    was = state.pool or PoolStatus()
    if usable >= needed:
        if was.short:
            since = was.since
            actions.append(
                Record(
                    pev.PoolRecovered(
                        usable=usable,
                        needed=needed,
                        short_for_seconds=round(now - since, 1) if since is not None else None,
                    )
                )
            )
        summary = PoolStatus(short=False, usable=usable, needed=needed)
        return actions + ([SetPool(summary)] if summary != state.pool else [])
    message = _message(usable, needed, len(pool), excluded, down, drained, reserved, policy, run_dir)
    summary = PoolStatus(
        short=True, usable=usable, needed=needed, since=was.since if was.short else now, message=message
    )
    if not was.short:
        details = dict(usable=usable, needed=needed, pool=len(pool), excluded=excluded, down=down,
                       drained=drained, reserved=reserved, policy=policy)  # fmt: skip
        actions += [
            Record(pev.PoolShort(**details, message=message)),
            Notify("pool", f"CRITICAL: {message}", details),
        ]
    return actions + ([SetPool(summary)] if summary != state.pool else [])


def _message(
    usable: int,
    needed: int,
    pool: int,
    excluded: list[str],
    down: list[str],
    drained: list[str],
    reserved: list[str],
    policy: str,
    run_dir: str,
) -> str:
    def some(nodes: list[str]) -> str:
        return ", ".join(nodes[:6]) + (f" and {len(nodes) - 6} more" if len(nodes) > 6 else "")

    parts = [
        f"{len(nodes)} {what} ({some(nodes)})"
        for what, nodes in (
            ("excluded", excluded),
            ("down", down),
            ("drained", drained),
            ("reserved", reserved),
        )
        if nodes
    ]
    fix = (
        f"`runctl nodes {run_dir}` lists the probations; `runctl nodes {run_dir} --clear NODE` returns one"
        if excluded
        else "ask the admins when nodes return (sinfo -R, scontrol show reservation)"
    )
    wait = "the job cannot start until nodes return" if policy == "wait" else "no probation left to release"
    return (
        f"only {usable} of the {pool} nodes can run the job, which needs {needed}: "
        f"{'; '.join(parts) or 'none usable'}. {wait.capitalize()}; {fix}"
    )
