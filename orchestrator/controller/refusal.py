"""The controller's own exclusions that it gives back when they leave SLURM too few nodes (pure).

SLURM does not queue a job whose --exclude list leaves the partition fewer nodes than it asks
for, as it queues one that waits for down or drained nodes: sbatch refuses it ("Requested node
configuration is not available", slurm.base.NodeConfigUnavailable), and the same sbatch would be
refused on every pass. A pool made short by the controller's own exclusions is its mistake to
undo, whatever `exclusions.on_pool_short` says (`wait` waits for nodes SLURM took out, never for
its own exclusions):
- before the sbatch (`before_sbatch`, from pool.judge): when the partition's nodes less the
  run's exclusions are fewer than the job's, as many of its own as that lacks;
- after a refusal anyway (`after_refusal`: SLURM counts what the node list does not show, or the
  list was not known): those the refused sbatch carried, as many as that count lacks, and at least
  one (the refusal is SLURM's word that the pool is short, whatever the count says).
Exclusions an operator made are never returned; a refusal with none of the controller's stays a
failed pass, as any scheduler error.

The order, weakest evidence first:
1. nodes excluded together with another node for one hang (`hunches`): all but one were the
   culprit's collective peers, waiting;
2. stragglers and repeated stalls: the node trains, slowly or with pauses;
3. a hang's single suspect: blamed from the marks' timing;
4. the rest (a dead or missing rank, a failed job or launch, a failed health check): the node
   stopped or failed a test.
Within one class the newest exclusion first: it is the one that left the pool short (the older
ones were made while the pool could spare them), the one the pool check would not have made.
Before all of them, nodes SLURM itself keeps out (down, drained, reserved): SLURM counts them
when it decides whether the job can ever run, but places no job on them, so their return costs
nothing (the job queues for them, as `on_pool_short: wait` means). Nodes SLURM does not list
come last (their return changes nothing SLURM counts).
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.contract import Exclusion
from orchestrator.contract.causes import Cause
from orchestrator.slurm.base import NodeInfo

BY_CONTROLLER = "controller"  # the applier's mark on the exclusions it makes

_WEAK = {Cause.STRAGGLER.value: 1, Cause.REPEATED_STALLS.value: 1, Cause.HANG.value: 2}
_OTHERS = 3


@dataclass(frozen=True)
class Return:
    """The probations a refusal ends, and why."""

    nodes: tuple[str, ...]  # weakest evidence first
    left: int | None  # the partition's nodes not excluded once they are back (None: SLURM's list not known)
    needed: int
    why: str


def hunches(exclusions: dict[str, Exclusion], excluded: list[str]) -> list[str]:
    """Of the `excluded` nodes, those excluded for a hang together with another node of the same
    job, oldest first."""
    by_job: dict[str, list[str]] = {}
    for node in excluded:
        entry = exclusions[node]
        if entry.cause == Cause.HANG and entry.job_id:
            by_job.setdefault(entry.job_id, []).append(node)
    shared = [n for nodes in by_job.values() if len(nodes) > 1 for n in nodes]
    return sorted(shared, key=lambda n: (exclusions[n].since or 0.0, n))


def weakest_first(
    exclusions: dict[str, Exclusion], candidates: list[str], slurm_nodes: dict[str, NodeInfo]
) -> list[str]:
    peers = set(hunches(exclusions, candidates))

    def key(node: str) -> tuple[int, int, float, str]:
        info = slurm_nodes.get(node)
        where = 2 if info is None else 1 if info.schedulable else 0
        entry = exclusions[node]
        strength = 0 if node in peers else _WEAK.get(entry.cause, _OTHERS)
        return (where, strength, -(entry.since or 0.0), node)

    return sorted(candidates, key=key)


def before_sbatch(
    exclusions: dict[str, Exclusion],
    slurm_nodes: dict[str, NodeInfo] | None,
    *,
    needed: int,
    partition: str | None,
) -> Return | None:
    """The controller's exclusions to give back before an sbatch SLURM would refuse: the
    partition's nodes, whatever their state, less the run's exclusions, are fewer than `needed`.
    None when SLURM would take it (or its node list is not known)."""
    if not slurm_nodes:
        return None
    names = {n.name for n in _partition(slurm_nodes, partition)}
    left = len(names - set(exclusions))
    if left >= needed:
        return None
    ours = [n for n in exclusions if n in names and exclusions[n].by == BY_CONTROLLER]
    returned = weakest_first(exclusions, ours, slurm_nodes)[: needed - left]
    if not returned:
        return None
    words = f"{left} node(s) of the partition not excluded, {needed} needed: SLURM would refuse the job"
    return Return(
        tuple(returned), left + len(returned), needed, f"{_evidence_of(exclusions, ours, returned)} ({words})"
    )


def after_refusal(
    exclusions: dict[str, Exclusion],
    refused_exclude: list[str],
    slurm_nodes: dict[str, NodeInfo] | None,
    *,
    needed: int,
    partition: str | None,
) -> Return | None:
    """None when the refused sbatch carried none of the controller's exclusions."""
    candidates = [n for n in refused_exclude if n in exclusions and exclusions[n].by == BY_CONTROLLER]
    if not candidates:
        return None
    known = slurm_nodes or {}
    names = {n.name for n in _partition(known, partition)}
    left = len(names - set(exclusions)) if known else None
    returned: list[str] = []
    for node in weakest_first(exclusions, candidates, known):
        if returned and (left is None or left >= needed):
            break
        returned.append(node)
        if left is not None and node in names:
            left += 1
    count = (
        f"{left} node(s) of the partition not excluded, {needed} needed"
        if left is not None
        else "SLURM's node list not known"
    )
    return Return(
        tuple(returned),
        left,
        needed,
        f"{_evidence_of(exclusions, candidates, returned)} ({count}; weakest evidence first)",
    )


def _partition(slurm_nodes: dict[str, NodeInfo], partition: str | None) -> list[NodeInfo]:
    return [n for n in slurm_nodes.values() if not partition or not n.partitions or partition in n.partitions]


def _evidence_of(exclusions: dict[str, Exclusion], candidates: list[str], returned: list[str]) -> str:
    peers = set(hunches(exclusions, candidates))
    return "; ".join(f"{n}: {_evidence(exclusions[n], n in peers)}" for n in returned)


def _evidence(entry: Exclusion, peer: bool) -> str:
    if peer:
        return "excluded with another node for one hang (a collective peer)"
    return f"{entry.cause or 'no cause recorded'}{' in job ' + entry.job_id if entry.job_id else ''}"
