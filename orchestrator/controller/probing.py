"""When a whole node goes quiet while the job runs, ask it (probe.py) and remember the verdict
until the node beats again: detection.assess takes the verdicts (`verdicts`) and decides with
them between "lost", "frozen" and "storage stall" instead of waiting out the tolerance.

A node is asked as soon as it is quiet (`Assessment.quiet_hosts`: a beat missed by more than a
pass, timeouts.probe_after), so that a lost or frozen node is known within seconds. "Lost" (no
answer) is final. Any other early answer stands only until the node, silent for `silent_after`
(`Assessment.silent_hosts`), is asked once more, and that answer replaces it: a node that missed
one beat may be in a hiccup that ends, or one that turns into a storage stall. An early answer
still counts meanwhile: the second probe may take longer than what is left to `dead_after`
(a stall found early is not declared dead while it is asked again). So a node is asked at most
twice per incident, never once a pass.

The step runs inside the job's allocation (`srun --overlap`), bounded by PROBE_TIMEOUT_SECONDS, at
most MAX_ASKED_PER_PASS nodes a pass: a controller pass waits for them at most that long. A probe that could not be made because slurmctld does not answer
(SchedulerError) says nothing of the node: no verdict, the node is asked again on a later pass.
A node none of whose ranks has beaten in a launch whose other ranks have beaten for `ask_after`
(`Assessment.unseen_ranks`) is asked too, once per launch: a storage stall that began at the launch
keeps its ranks from writing a first beat, and without an answer they would be missing at the
init limit and the node excluded for a stall. There are no pids to look at: the stat of the run
directory answers. Found in a stall, its ranks are not missing while the tolerance lasts, and the
stall watch counts it from when the others began to beat (`stalled_before_beating`).
Nobody is asked when every node is silent: that is the filesystem (a full or stalled one answers
a stat and leaves the ranks running), not N frozen nodes. A scheduler without `probe_node` (the
mocked SLURM) is never asked: today's rule decides.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from orchestrator.contract import failure_events as fev
from orchestrator.errors import SchedulerError
from orchestrator.plan.restart_paths import PROBE_TIMEOUT_SECONDS

from . import probe
from .actions import Action, Record
from .pass_view import JobView

MAX_ASKED_PER_PASS = 2
FS_SECONDS = 3.0  # the stat of the run directory must answer within this (inside the timeout)


@dataclass(frozen=True)
class Answer:
    verdict: probe.Verdict
    settled: bool  # lost, or given when the node had been silent for silent_after: not asked again


@dataclass
class NodeProber:
    asked: dict[tuple[str, str], Answer] = field(default_factory=dict)  # (job, node) -> its answer
    # (job, SLURM node) found in a storage stall, until one of its ranks beats again: kept across a
    # relaunch inside the job, whose ranks on that node cannot write their first beat while it lasts.
    stalled: set[tuple[str, str]] = field(default_factory=set)
    # (job, SLURM node) asked because none of its ranks had beaten in the launch -> the monotonic
    # time the launch's others began to beat; kept while none of them has.
    asked_unseen: dict[tuple[str, str], float] = field(default_factory=dict)

    def verdicts(self, job_id: str) -> dict[str, probe.Verdict]:
        return {node: a.verdict for (job, node), a in self.asked.items() if job == job_id}

    def stalled_nodes(self, job_id: str) -> set[str]:
        """The job's nodes found in a storage stall that have not beaten since: a relaunch's ranks
        there are not missing while the stall may last (detection.assess, `stalled_ranks`)."""
        return {node for job, node in self.stalled if job == job_id}

    def stalled_before_beating(self, job_id: str) -> dict[str, float]:
        """The job's nodes found in a storage stall before any of their ranks beat in this launch,
        with when the launch's other ranks began to beat (stalls.StallWatch counts the stall from
        then, and records it when the node beats)."""
        return {
            node: since
            for (job, node), since in self.asked_unseen.items()
            if job == job_id and (job, node) in self.stalled
        }

    def on_pass(
        self, view: JobView, ask: Callable[[str, str, str, float], str | None] | None
    ) -> list[Action]:
        """Forget the nodes that beat again; ask each newly quiet one, and each whose early answer
        is to be confirmed now that it is silent. `ask(job, node, script, timeout)` runs the probe
        step (None: no way to ask). Every node of the job quiet: nobody is asked, and the verdicts
        already given are dropped."""
        job_id, beats, node_of, run_dir = view.job.job_id, view.beats, view.node_of, view.run_dir
        silent = set(view.assessment.silent_hosts)
        quiet, hosts = set(view.assessment.quiet_hosts) | silent, len(view.assessment.host_beat_age)
        for key in [k for k in self.asked if k[0] != job_id or k[1] not in quiet or len(quiet) >= hosts]:
            del self.asked[key]
        # Beating: a rank of the launch being judged (the assessment's hosts, not an earlier
        # launch's beat files still on disk) on a node that is not quiet.
        # Only while a stall is known: the pass otherwise skips a walk over every rank's beat.
        if self.stalled:
            judged = view.assessment.host_beat_age
            beating = {
                node_of(b) for b in beats if b.job_id == job_id and b.host in judged and b.host not in quiet
            }
            self.stalled = {
                (job, node) for job, node in self.stalled if job == job_id and node not in beating
            }
        unseen = self._unseen_nodes(view) if view.assessment.unseen_ranks else set()
        for key in [k for k in self.asked_unseen if k[0] != job_id or k[1] not in unseen]:
            del self.asked_unseen[key]
        if ask is None or len(quiet) >= hosts:
            return []
        actions: list[Action] = []
        for host in sorted(quiet):
            answer = self.asked.get((job_id, host))
            if answer is not None and (answer.settled or host not in silent):
                continue
            if len(actions) >= MAX_ASKED_PER_PASS:
                break
            mine = [b for b in beats if b.job_id == job_id and b.host == host]
            if not mine:
                continue
            node = node_of(mine[0])
            pids = {b.rank: b.pid for b in mine}
            asked = self._ask(ask, job_id, node, pids, run_dir, early=host not in silent)
            if asked is None:
                break  # slurmctld does not answer: nothing learned of any node; asked on a later pass
            verdict, record = asked
            self.asked[(job_id, host)] = Answer(verdict, verdict is probe.Verdict.LOST or host in silent)
            actions.append(record)
        for node in sorted(unseen):
            if (job_id, node) in self.asked_unseen:
                continue
            if len(actions) >= MAX_ASKED_PER_PASS:
                break
            asked = self._ask(ask, job_id, node, {}, run_dir, before_first_beat=True)
            if asked is None:
                break
            self.asked_unseen[(job_id, node)] = view.assessment.unseen_since or view.mono
            actions.append(asked[1])
        return actions

    def _ask(
        self,
        ask: Callable[[str, str, str, float], str | None],
        job_id: str,
        node: str,
        pids: dict[int, int],
        run_dir: str,
        **how: bool,
    ) -> tuple[probe.Verdict, Record] | None:
        """One probe step on `node` (`pids`: its ranks' processes, none when they never beat): the
        verdict, kept in `stalled` (a later answer that is not a stall replaces one), and its event
        (`how`: early, before_first_beat). None when slurmctld could not make the step."""
        try:
            output = ask(job_id, node, probe.script(pids, run_dir, FS_SECONDS), PROBE_TIMEOUT_SECONDS)
        except SchedulerError:
            return None
        report = probe.parse(node, output)
        verdict, why = probe.verdict(report)
        if verdict is probe.Verdict.STALL:
            self.stalled.add((job_id, node))
        else:
            self.stalled.discard((job_id, node))
        ranks = {str(r): s.value for r, s in sorted(report.ranks.items())}
        event = fev.NodeProbed(
            job_id=job_id,
            node=node,
            verdict=verdict.value,
            why=why,
            fs_answers=report.fs_answers,
            ranks=ranks,
            **how,
        )
        return verdict, Record(event)

    def _unseen_nodes(self, view: JobView) -> set[str]:
        """The job's nodes none of whose ranks has beaten in the launch being judged, while its
        other ranks have (for ask_after: Assessment.unseen_ranks)."""
        reference, job_id = view.assessment.reference, view.job.job_id
        if reference is None:
            return set()
        launch = (reference.restart_count, reference.launch)
        beating = {
            view.node_of(b)
            for b in view.beats
            if b.job_id == job_id and (b.restart_count, b.launch) == launch
        }
        return {view.node_of_rank(rank, "") for rank in view.assessment.unseen_ranks} - beating
