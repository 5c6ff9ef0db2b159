"""Ask a silent node instead of waiting: what one bounded probe step says about a node whose every
rank stopped beating while the job runs, and the verdict drawn from it. Pure: the supervisor runs
the step (`srun --overlap --jobid JOB -w NODE`, timeout-bounded, at most twice per silent node per
incident) and hands its output here.

The probe (`script`) prints one line per rank process of the node, `rank RANK PID STATE [WCHAN]`,
STATE being /proc/PID/stat's letter or `gone`, or D when any of its threads is in D (a rank whose
main thread sleeps in a collective while its checkpoint writer or beat thread waits on storage is
in a storage stall too), WCHAN the kernel function that thread waits in (/proc/PID/task/TID/wchan,
`?` when unreadable: for the on-call, e.g. request_wait_answer for FUSE); then `fs ok` or
`fs stuck`: whether a stat of the run directory answered within its bound (run in the background
and waited for, so that a hung filesystem cannot hang the probe itself). Verdicts (`verdict`):
- the step did not run or did not answer in time: the node is unreachable, LOST now;
- a rank in D (uninterruptible, almost always I/O) or the filesystem not answering: a STALL of
  storage, waited up to `stall_tolerance` with a warning;
- a rank stopped (T, t: SIGSTOP, a debugger) or running while its beats are gone: DEAD at
  `dead_after` (a stall is ruled out: the node answered and its storage did);
- anything else (processes gone, no line parsed): UNDECIDED, the silence rule of detection.py.
"""

from __future__ import annotations

import enum
import shlex
from dataclasses import dataclass, field

MAX_PROBE_BYTES = 64 << 10  # what is read of the probe's output: a line per rank of one node


class ProcState(str, enum.Enum):
    RUNNING = "running"  # R or S: scheduled or sleeping (a wait in a collective sleeps)
    STOPPED = "stopped"  # T or t
    DISK = "disk"  # D: uninterruptible sleep, almost always storage
    GONE = "gone"  # no such process
    OTHER = "other"  # Z, X, I, ...


class Verdict(str, enum.Enum):
    LOST = "lost"
    DEAD = "dead"
    STALL = "stall"
    UNDECIDED = "undecided"


_LETTERS = {"R": ProcState.RUNNING, "S": ProcState.RUNNING, "T": ProcState.STOPPED, "t": ProcState.STOPPED,
            "D": ProcState.DISK, "gone": ProcState.GONE}  # fmt: skip


@dataclass(frozen=True)
class ProbeReport:
    node: str
    answered: bool  # the step ran and printed its last line within its timeout
    ranks: dict[int, ProcState] = field(default_factory=dict)
    fs_answers: bool | None = None  # None: not said
    waits: dict[int, str] = field(default_factory=dict)  # rank -> wchan of its thread in D

    def as_dict(self) -> dict[str, object]:
        return {"node": self.node, "answered": self.answered, "fs_answers": self.fs_answers,
                "ranks": {str(r): s.value for r, s in sorted(self.ranks.items())}}  # fmt: skip


def script(pids: dict[int, int], run_dir: str, fs_seconds: float) -> str:
    """The probe's shell script: each rank's process state, then whether the run directory's
    filesystem answers a stat within `fs_seconds` (pids and the path are quoted, never trusted)."""
    # /proc/PID/stat: "PID (COMM) STATE ...", COMM may hold spaces and parentheses: the letter
    # after the last ") ".
    # A thread in D makes the rank D, with its wait channel (a kernel symbol; anything else is
    # printed as "?"). The threads are read with the shell's own `read`: a rank has hundreds.
    lines = [
        f"s=$(sed -n 's/.*) \\(.\\).*/\\1/p' /proc/{int(pid)}/stat 2>/dev/null); w=; "
        f'for t in /proc/{int(pid)}/task/*; do {{ read -r l < "$t/stat"; }} 2>/dev/null || continue; '
        f'r=${{l##*") "}}; if [ "${{r%% *}}" = D ]; then s=D; w=\'?\'; '
        f'{{ read -r w < "$t/wchan"; }} 2>/dev/null; break; fi; done; '
        f"case $w in *[!A-Za-z0-9_.]*) w='?';; esac; "
        f"echo rank {int(rank)} {int(pid)} ${{s:-gone}} $w"
        for rank, pid in sorted(pids.items())
    ]
    path = shlex.quote(run_dir)
    ticks = max(1, int(fs_seconds * 10))
    lines.append(
        f"(stat -- {path} >/dev/null 2>&1; echo done) > /dev/shm/.runctl-probe-$$ 2>/dev/null & "
        f"i=0; while [ $i -lt {ticks} ] && ! grep -q done /dev/shm/.runctl-probe-$$ 2>/dev/null; do sleep 0.1; i=$((i+1)); done; "
        f"if grep -q done /dev/shm/.runctl-probe-$$ 2>/dev/null; then echo fs ok; else echo fs stuck; fi; "
        f"rm -f /dev/shm/.runctl-probe-$$"
    )
    return "\n".join(lines) + "\n"


def parse(node: str, output: str | None) -> ProbeReport:
    """The probe's output (None: it did not run or timed out) as a report; lines that do not
    parse are skipped, never guessed."""
    if output is None:
        return ProbeReport(node, answered=False)
    ranks: dict[int, ProcState] = {}
    waits: dict[int, str] = {}
    fs: bool | None = None
    for line in output[:MAX_PROBE_BYTES].splitlines():
        words = line.split()
        if len(words) in (4, 5) and words[0] == "rank" and words[1].isdigit():
            ranks[int(words[1])] = state = _LETTERS.get(words[3], ProcState.OTHER)
            if state is ProcState.DISK and len(words) == 5:
                waits[int(words[1])] = words[4][:64]
        elif len(words) == 2 and words[0] == "fs" and words[1] in ("ok", "stuck"):
            fs = words[1] == "ok"
    return ProbeReport(node, answered=fs is not None, ranks=ranks, fs_answers=fs, waits=waits)


def verdict(report: ProbeReport) -> tuple[Verdict, str]:
    """The verdict and the sentence that says why (for the event and `runctl status`)."""
    if not report.answered:
        return Verdict.LOST, f"{report.node} did not answer a probe step: lost"
    states = set(report.ranks.values())
    if report.fs_answers is False or ProcState.DISK in states:
        waits = ", ".join(f"rank {r} in {w}" for r, w in sorted(report.waits.items()))
        what = (
            "its filesystem did not answer a stat"
            if report.fs_answers is False
            else "a rank waits on I/O (D)"
        ) + (f" ({waits})" if waits else "")
        return Verdict.STALL, f"{report.node} answered, {what}: a storage stall"
    if ProcState.STOPPED in states:
        return Verdict.DEAD, f"{report.node} answered, a rank is stopped (T): frozen, not a stall"
    if states == {ProcState.RUNNING}:
        return (
            Verdict.DEAD,
            f"{report.node} answered, its ranks run but do not beat, its storage answers: not a stall",
        )
    if not report.ranks:  # none asked about (no rank of it had beaten): the filesystem answered
        return Verdict.UNDECIDED, f"{report.node} answered, its filesystem answers a stat: undecided"
    return (
        Verdict.UNDECIDED,
        f"{report.node} answered, its ranks {sorted(s.value for s in states)}: undecided",
    )
