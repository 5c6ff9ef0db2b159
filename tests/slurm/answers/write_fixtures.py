"""Writes the recorded answers of tests/slurm/answers/ for the releases we cannot run here.

    python -m tests.slurm.answers.write_fixtures

22.05's answers (squeue-json-22.05.json, squeue-text-22.05.txt, scontrol-node-22.05.txt) were
captured from slurm-wlm 22.05.8 on the local cluster and are not rewritten. The others are
written from SchedMD's sources at the release tags (slurm-23-02-8-1 ... slurm-25-11-7-1):
src/plugins/data_parser/v0.0.4x/parsers.c (JOB_STATE flag array, PROCESS_EXIT_CODE, TIMESTAMP_NO_VAL,
OPENAPI_META), src/interfaces/data_parser.c (23.02's meta), src/squeue/print.c (exit_code text).
The jobs are the ones captured on 22.05 plus the ends the local cluster cannot produce.
"""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.slurm.release_shapes import INFINITE, RELEASES, ModelJob, json_answer, text_line

HERE = Path(__file__).parent
T = 1796435777
CASES = [
    ModelJob(17001, "cap-ok", "root", "COMPLETED", nodes="node01", submit=T - 5, start=T - 4, end=T - 4),
    ModelJob(17002, "cap-timeout", "root", "TIMEOUT", reason="TimeLimit", raw_exit=15, nodes="node01",
             submit=T, start=T + 1, end=T + 82),
    ModelJob(17004, "cap-failed", "root", "FAILED", reason="NonZeroExitCode", raw_exit=3 << 8,
             nodes="node01", submit=T, start=T + 1, end=T + 1),
    ModelJob(17005, "cap-running", "root", "RUNNING", nodes="node01", submit=T, start=T + 1, end=INFINITE),
    ModelJob(17006, "cap-cancel-running", "root", "CANCELLED", raw_exit=15, nodes="node01", submit=T,
             start=T + 1, end=T + 4),
    ModelJob(17007, "cap-requeued", "root", "PENDING", flags=("REQUEUED",), reason="BeginTime", submit=T + 5),
    ModelJob(17008, "cap-requeue-hold", "root", "PENDING", reason="JobHeldUser", submit=T + 5),
    ModelJob(17009, "cap-pending", "root", "PENDING", reason="Dependency", submit=T),
    ModelJob(17010, "cap-held", "root", "PENDING", reason="JobHeldUser", submit=T),
    ModelJob(17011, "cap-cancel-pending", "root", "CANCELLED", reason="JobHeldUser", submit=T, start=T + 4,
             end=T + 4),
    ModelJob(17012, "completing", "root", "CANCELLED", flags=("COMPLETING",), raw_exit=15,
             nodes="node[01-02]", submit=T, start=T + 1, end=T + 9),
    ModelJob(17013, "node-fail", "root", "NODE_FAIL", reason="NodeDown", raw_exit=0, nodes="node03",
             submit=T, start=T + 1, end=T + 30),
    ModelJob(17014, "oom", "root", "OUT_OF_MEMORY", reason="OutOfMemory", raw_exit=9, nodes="node04",
             submit=T, start=T + 1, end=T + 20),
    ModelJob(17015, "preempted", "root", "PREEMPTED", reason="None", raw_exit=15, nodes="node02",
             submit=T, start=T + 1, end=T + 50),
    ModelJob(17016, "launch-failed", "root", "PENDING", flags=("REQUEUED", "LAUNCH_FAILED"),
             reason="launch failed requeued held", submit=T),
]  # fmt: skip


def main() -> None:
    for release in RELEASES:
        if release == "22.05":
            continue
        answer = json_answer(CASES, release, ["squeue", "--json", "--states=all", "--jobs=..."])
        answer["fixture"] = {
            "release": release,
            "source": "written from SchedMD's slurm sources at this release's tag (see write_fixtures.py)",
        }
        (HERE / f"squeue-json-{release}.json").write_text(json.dumps(answer, indent=1) + "\n")
    lines = [text_line(job, "25.11") for job in CASES]
    (HERE / "squeue-text-25.11.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
