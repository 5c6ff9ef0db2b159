"""When a whole node goes silent while the job runs, ask it once (probe.py) and remember the
verdict until the node beats again: detection.assess takes the verdicts (`verdicts`) and
decides with them between "frozen" and "storage stall" instead of waiting out the tolerance.

The step runs inside the job's allocation (`srun --overlap`), bounded by PROBE_TIMEOUT_SECONDS,
once per silent node per incident, at most MAX_ASKED_PER_PASS nodes a pass: a controller pass waits
for them at most that long. A probe that could not be made because slurmctld does not answer
(SchedulerError) says nothing of the node: no verdict, the node is asked again on a later pass.
Nobody is asked when every node is silent: that is the filesystem (a full or stalled one answers
a stat and leaves the ranks running), not N frozen nodes. A scheduler without `probe_node` (the
mocked SLURM) is never asked: today's rule decides.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from orchestrator.contract import failure_events as fev
from orchestrator.errors import SchedulerError

from . import probe
from .actions import Action, Record
from .pass_view import JobView

PROBE_TIMEOUT_SECONDS = 10.0
MAX_ASKED_PER_PASS = 2
FS_SECONDS = 3.0  # the stat of the run directory must answer within this (inside the timeout)


@dataclass
class NodeProber:
    asked: dict[tuple[str, str], probe.Verdict] = field(default_factory=dict)  # (job, node) -> verdict

    def verdicts(self, job_id: str) -> dict[str, probe.Verdict]:
        return {node: v for (job, node), v in self.asked.items() if job == job_id}

    def on_pass(
        self, view: JobView, ask: Callable[[str, str, str, float], str | None] | None
    ) -> list[Action]:
        """Forget the nodes that beat again; ask each newly silent one. `ask(job, node, script,
        timeout)` runs the probe step (None: no way to ask). Every node of the job silent: nobody
        is asked, and the verdicts already given are dropped."""
        job_id, beats, node_of, run_dir = view.job.job_id, view.beats, view.node_of, view.run_dir
        silent, hosts = set(view.assessment.silent_hosts), len(view.assessment.host_beat_age)
        for key in [k for k in self.asked if k[0] != job_id or k[1] not in silent or len(silent) >= hosts]:
            del self.asked[key]
        if ask is None or len(silent) >= hosts:
            return []
        actions: list[Action] = []
        for host in sorted(silent):
            if (job_id, host) in self.asked:
                continue
            if len(actions) >= MAX_ASKED_PER_PASS:
                break
            mine = [b for b in beats if b.job_id == job_id and b.host == host]
            if not mine:
                continue
            node = node_of(mine[0])
            script = probe.script({b.rank: b.pid for b in mine}, run_dir, FS_SECONDS)
            try:
                output = ask(job_id, node, script, PROBE_TIMEOUT_SECONDS)
            except SchedulerError:
                break  # slurmctld does not answer: nothing learned of any node; asked on a later pass
            report = probe.parse(node, output)
            verdict, why = probe.verdict(report)
            self.asked[(job_id, host)] = verdict
            ranks = {str(r): s.value for r, s in sorted(report.ranks.items())}
            event = fev.NodeProbed(
                job_id=job_id,
                node=node,
                verdict=verdict.value,
                why=why,
                fs_answers=report.fs_answers,
                ranks=ranks,
            )
            actions.append(Record(event))
        return actions
