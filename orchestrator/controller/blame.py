"""Which nodes one incident may exclude: pure rules over what detection named and what the
controller knows besides, with the reason that decided (it goes into the failure's `suspects_why`
and the exclusion events).

- A hang whose suspects the marks are sure of (detection.behind: in their own work while the
  others wait in a collective): their nodes.
- A hang whose suspects wait like everyone else (the fault is below what marks can see: a
  collective that never completes, the network, the job): no node on the marks alone. The job is
  restarted. Independent evidence may name one node: the same single node suspected that way in
  another job's hang within REPEAT_WINDOW_SECONDS (`HangSuspicions`). A node SLURM itself downs or drains is
  left to SLURM before any of this (pool.leave_to_slurm).
- A hang (`affordable`): the exclusions must leave the job enough schedulable nodes. When
  they would not, only the strongest culprit (the first named) is excluded if the pool can spare
  it, else none, and the event says so: a pool emptied on a hunch stops the run for good.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from orchestrator.contract import Exclusion
from orchestrator.contract import failure_events as fev
from orchestrator.contract.causes import Cause
from orchestrator.slurm.base import NodeInfo

from .actions import Action, Record
from .detection import Assessment, Finding
from .recovery import Incident


@dataclass(frozen=True)
class HangBlame:
    nodes: tuple[str, ...]  # to exclude (before the per-incident cap and the pool check)
    why: str  # the evidence that decided, for suspects_why ("" when the marks decided)


# A bad node hangs its job again soon after the restart; two unrelated hangs that happen to
# suspect the same node of 48 are hours or days apart (the soak's network faults: ~1 a week).
REPEAT_WINDOW_SECONDS = 6 * 3600.0


@dataclass
class HangSuspicions:
    """Nodes suspected by a hang that the marks could not decide: node -> [the job it was
    suspected in, when (controller clock)]. `by_node` is state.json's `hang_suspects`, so a
    controller restarted between two hangs still sees the repeat."""

    by_node: dict[str, list] = field(default_factory=dict)

    def judge(self, suspect_nodes: list[str], sure: bool, job_id: str, now: float) -> HangBlame:
        nodes = sorted({n for n in suspect_nodes if n})
        if sure or not nodes:
            return HangBlame(tuple(nodes), "")
        for node in [n for n, (_, when) in self.by_node.items() if now - when > REPEAT_WINDOW_SECONDS]:
            del self.by_node[node]  # too old to count: kept out of state.json
        earlier = {n: self.by_node[n] for n in nodes if n in self.by_node and self.by_node[n][0] != job_id}
        for node in nodes:
            if self.by_node.get(node, ("", 0.0))[0] != job_id:
                self.by_node[node] = [job_id, now]
        if len(nodes) == 1 and earlier:
            node = nodes[0]
            return HangBlame(
                (node,),
                f"{node} was the suspect of job {earlier[node][0]}'s hang "
                f"{(now - earlier[node][1]) / 60:.0f} min before: excluded on the repeat",
            )
        return HangBlame((), "no node excluded on marks alone: the job restarts on the same nodes")


def culprit_nodes(
    assessment: Assessment, node_of: Callable[[Finding], str], suspicions: HangSuspicions, now: float
) -> list[str]:
    """The nodes to blame for one pass's findings: the culprits' (dead ranks, or the suspects the
    marks are sure of); for suspects the marks cannot decide, what `suspicions` says, with the
    evidence added to the assessment's `suspects_why`."""
    nodes = [node_of(f) for f in assessment.culprits()]
    if assessment.suspects and not assessment.dead and not assessment.suspects_sure:
        decided = suspicions.judge(
            [node_of(f) for f in assessment.suspects], False, str(assessment.job_id), now
        )
        assessment.suspects_why = f"{assessment.suspects_why}; {decided.why}"
        nodes = list(decided.nodes)
    return nodes


def affordable(
    culprits: tuple[str, ...],
    slurm_nodes: dict[str, NodeInfo] | None,
    exclusions: dict[str, Exclusion],
    *,
    needed: int,
    partition: str | None,
) -> tuple[tuple[str, ...], str | None]:
    """The culprits the pool can spare (in their order, strongest first), and why some were kept
    when it cannot spare them all. SLURM not asked: all of them (no guess from an empty answer)."""
    if not culprits or not slurm_nodes:
        return culprits, None
    pool = [n for n in slurm_nodes.values() if not partition or not n.partitions or partition in n.partitions]
    schedulable = {n.name for n in pool if n.schedulable}
    usable = len(schedulable - set(exclusions))
    new = [n for n in dict.fromkeys(culprits) if n in schedulable and n not in exclusions]
    if usable - len(new) >= needed:
        return culprits, None
    kept = culprits[:1] if new and new[0] == culprits[0] and usable - 1 >= needed else ()
    left = ", ".join(n for n in culprits if n not in kept)
    return kept, (
        f"excluding {', '.join(culprits)} would leave {usable - len(new)} usable node(s) of the {needed} "
        f"the job needs: {'only the strongest suspect ' + kept[0] + ' excluded' if kept else 'none excluded'}"
        f" ({left} kept in the pool)"
    )


def spare_the_pool(
    failure: Incident,
    slurm_nodes: dict[str, NodeInfo] | None,
    exclusions: dict[str, Exclusion],
    *,
    needed: int,
    partition: str | None,
) -> tuple[tuple[str, ...], list[Action]]:
    """`affordable` for a hang (blame from marks, however sure): the culprits kept, and the event
    when some were spared. A dead or failed node is evidence of its own: excluded as it is (a short
    pool then releases probations by `exclusions.on_pool_short`, pool.py)."""
    if failure.cause != Cause.HANG:
        return failure.culprits, []
    kept, why = affordable(failure.culprits, slurm_nodes, exclusions, needed=needed, partition=partition)
    if why is None:
        return kept, []
    event = fev.ExclusionCapped(
        job_id=failure.job_id, cause=failure.cause, nodes=list(failure.culprits)[:64], why=why
    )
    return kept, [Record(event)]
