"""The node pool, judged with SLURM's own word: pure rules from SLURM's node states and the
run's exclude list to actions.

- Before blaming a node (`leave_to_slurm`): a node SLURM already downs or drains is SLURM's
  problem (an admin or slurmctld took it out, and will return it): no exclusion, an event
  naming SLURM's state and reason.
- Probations (`expired`): an exclusion ends at its `until`, on the controller's clock.
- The pool (`judge`) answers whether the NEXT job can start (while a job trains on its spare,
  that is the question that matters): the nodes of the job's partition that SLURM would
  schedule (not down, drained or reserved) and the run has not excluded.
  - At least nodes + spare_nodes: fine.
  - At least `nodes`: the next job asks for the spares there are (`spares_next`, used by
    submission.default_submitter), said once in an event and a chat notification (`spares`): it
    starts, with less room to replace a node inside it. Not a page.
  - Fewer than `nodes`: critical (an event, a page `pool`), kept in state.json for `runctl
    status` and `runctl doctor` until it recovers (an event then too). The advice names the
    probation list and the admins' drain reasons, never the nodes of the last incident.
  `exclusions.on_pool_short: release_oldest` releases the oldest probations of nodes SLURM would
  schedule, as many as the job's nodes lack; `wait` keeps them, and says so. Whatever the policy,
  the probations of hunches end first (`refusal.hunches`), as many as the job's nodes and spares lack:
  nodes excluded together for one hang, which names one culprit, so all but one of them were its
  collective peers, waiting.
When SLURM cannot be asked nothing here is judged (no guess from an empty answer).
"""

from __future__ import annotations

from orchestrator.contract import Exclusion
from orchestrator.contract import pool_events as pev
from orchestrator.contract.severity import Notice
from orchestrator.contract.state import ControllerState, PoolStatus
from orchestrator.slurm.base import NodeInfo

from .actions import Action, ChangeState, Record, ReleaseExclusions, alert
from .recovery import Incident
from .refusal import before_sbatch, hunches


def leave_to_slurm(
    failure: Incident, slurm_nodes: dict[str, NodeInfo] | None
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


def expired(exclusions: dict[str, Exclusion], now: float) -> list[Action]:
    ended = sorted(node for node, entry in exclusions.items() if entry.expired(now))
    return [ReleaseExclusions(tuple(ended), "probation expired")] if ended else []


def judge(
    state: ControllerState,
    slurm_nodes: dict[str, NodeInfo] | None,
    exclusions: dict[str, Exclusion],
    *,
    nodes: int,
    spares: int,
    partition: str | None,
    policy: str,
    now: float,
    run_dir: str,
) -> list[Action]:
    """The pool against the NEXT job: `nodes` it cannot start without, `spares` it asks for
    when the pool has them (fewer when it has not: a warning, the job still trains)."""
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
    early = hunches(exclusions, excluded)[: max(0, nodes + spares - usable)]
    if early:
        actions.append(
            ReleaseExclusions(
                tuple(early),
                f"pool short ({usable} usable of {nodes} + {spares} spare(s) wanted): excluded with another "
                "node for one hang (its collective peer, not the culprit): probation ended early",
            )
        )
        excluded = sorted(set(excluded) - set(early))
        usable += len(early)
    # SLURM refuses, rather than queues, a job its exclude list leaves too few nodes: whatever the
    # policy, the controller's own exclusions do not stay to make it so (refusal.py).
    kept = {n: e for n, e in exclusions.items() if n not in early}
    refused = before_sbatch(kept, slurm_nodes, needed=nodes, partition=partition)
    if refused is not None:
        actions.append(ReleaseExclusions(refused.nodes, f"probation ended early: {refused.why}"))
        usable += len(set(excluded) & set(refused.nodes))
        excluded = sorted(set(excluded) - set(refused.nodes))
    if usable < nodes and policy == "release_oldest" and excluded:
        oldest = sorted(excluded, key=lambda n: (exclusions[n].since or 0.0, n))[: nodes - usable]
        actions.append(
            ReleaseExclusions(
                tuple(oldest),
                f"pool short ({usable} usable of {nodes} needed): exclusions.on_pool_short=release_oldest",
            )
        )
        excluded = sorted(set(excluded) - set(oldest))
        usable += len(oldest)
    was = state.pool or PoolStatus()
    spares_next = max(0, min(spares, usable - nodes))
    spares_before = was.spares_next if was.spares_next is not None else spares
    if spares_next != spares_before and usable >= nodes:
        actions += _spares_changed(usable, nodes, spares, spares_next)
    if usable >= nodes:
        if was.short:
            since = was.since
            actions.append(
                Record(
                    pev.PoolRecovered(
                        usable=usable,
                        needed=nodes,
                        short_for_seconds=round(now - since, 1) if since is not None else None,
                    )
                )
            )
        fewer = _spares_sentence(usable, nodes, spares, spares_next) if spares_next < spares else ""
        summary = PoolStatus(short=False, usable=usable, needed=nodes, spares_next=spares_next, message=fewer)
        return actions + ([ChangeState(pool=summary)] if summary != state.pool else [])
    newest = last_incident(exclusions)
    message = _message(usable, nodes, len(pool), excluded, down, drained, reserved, policy, run_dir, newest)
    summary = PoolStatus(
        short=True, usable=usable, needed=nodes, since=was.since if was.short else now, message=message,
        spares_next=0,
    )  # fmt: skip
    if not was.short:
        details = dict(usable=usable, needed=nodes, pool=len(pool), excluded=excluded, down=down,
                       drained=drained, reserved=reserved, policy=policy)  # fmt: skip
        actions += alert(pev.PoolShort(**details, message=message), Notice.POOL)
    return actions + ([ChangeState(pool=summary)] if summary != state.pool else [])


def spares_for_next_job(state: ControllerState, configured: int) -> int:
    """The spares the next submission asks for: the pool's last word, never more than configured."""
    judged = state.pool.spares_next if state.pool is not None else None
    return configured if judged is None else min(configured, judged)


def last_incident(exclusions: dict[str, Exclusion]) -> set[str]:
    """The nodes excluded in the newest incident (same job, or the newest time): the least
    likely to be healthy, never the ones to return first."""
    if not exclusions:
        return set()
    newest = max(exclusions.values(), key=lambda e: (e.since or 0.0, e.node))
    return {
        e.node
        for e in exclusions.values()
        if (newest.job_id and e.job_id == newest.job_id) or (e.since or 0.0) == (newest.since or 0.0)
    }


def _spares_changed(usable: int, nodes: int, spares: int, spares_next: int) -> list[Action]:
    return alert(
        pev.SparesForNextJob(usable=usable, nodes=nodes, spares=spares, spares_next=spares_next),
        Notice.SPARES,
    )


def _spares_sentence(usable: int, nodes: int, spares: int, spares_next: int) -> str:
    from orchestrator.views.event_text import sentence  # noqa: PLC0415 - the words live with the events

    return sentence(pev.SparesForNextJob(usable=usable, nodes=nodes, spares=spares, spares_next=spares_next))


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
    newest: set[str],
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
    older = [n for n in excluded if n not in newest]
    fixes = []
    if excluded:
        recent = sorted(set(excluded) & newest)
        keep = f" ({some(recent)} failed in the last incident: keep them out)" if recent else ""
        fixes.append(
            f"`runctl nodes {run_dir}` lists the probations{keep}"
            + (
                f"; older ones ({some(older)}) may be healthy again: `--clear NODE` after checking"
                if older
                else ""
            )
        )
    fixes.append("the admins' drain and down reasons: sinfo -R; reservations: scontrol show reservation")
    wait = (
        "the next job cannot start until nodes return" if policy == "wait" else "no probation left to release"
    )
    return (
        f"only {usable} of the {pool} nodes can run the job, which needs {needed}: "
        f"{'; '.join(parts) or 'none usable'}. {wait.capitalize()}; {'; '.join(fixes)}"
    )
