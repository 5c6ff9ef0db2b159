"""The srun command lines a job runs, built in one place: the launcher runs them, and
`runctl submit --dry-run` prints them (with placeholders for the nodes SLURM will allocate), so
what an admin reviews is what runs.

    launch K   srun --kill-on-bad-exit=1 --wait=W --job-name=launch-K --nodes=N --ntasks=N*G
                    --ntasks-per-node=G --cpus-per-task=C --nodelist=<N nodes> [--label] <trainer>
    standby K  the same layout over every usable node, --overlap --wait=0, running trainer.standby
    health     one task per allocated node running trainer.health
MASTER_PORT is one rule for every launch of every job (master_port).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# 10000-29999: below Linux's ephemeral range (32768+). 16 ports per job, one per launch, so that a
# relaunch never waits for the last launch's port to leave TIME_WAIT, and two jobs that share a
# first host do not collide.
MASTER_PORT_BASE = 10000
MASTER_PORT_SPAN = 20000
PORTS_PER_JOB = 16


def master_port(job_id: str | int, launch: int) -> int:
    return MASTER_PORT_BASE + (int(job_id) * PORTS_PER_JOB + launch) % MASTER_PORT_SPAN


@dataclass(frozen=True)
class Layout:
    """What every launch of a job looks like (from the config; the same for all launches)."""

    nodes: int  # nodes a launch trains on
    tasks_per_node: int  # one rank per GPU
    cpus_per_task: int
    srun_wait: int  # once one rank exited, the others get this long to follow
    label: bool = True  # srun --label: every output line starts with its task (rank) number
    # The site's options on every step (container, cluster.srun_args): argv words, never shell text.
    site_options: tuple[str, ...] = ()


def launch_argv(layout: Layout, launch: int, nodes: Sequence[str], command: Sequence[str]) -> list[str]:
    """Launch `launch` of the trainer on `nodes` (--kill-on-bad-exit: one rank dying ends the step)."""
    argv = [
        "srun", "--kill-on-bad-exit=1", f"--wait={layout.srun_wait}", f"--job-name=launch-{launch}",
        f"--nodes={len(nodes)}", f"--ntasks={len(nodes) * layout.tasks_per_node}",
        f"--ntasks-per-node={layout.tasks_per_node}", f"--cpus-per-task={layout.cpus_per_task}",
        f"--nodelist={','.join(nodes)}",
    ]  # fmt: skip
    if layout.label:
        argv.append("--label")
    return [*argv, *layout.site_options, *command]


def standby_argv(
    layout: Layout, launch: int, nodes: Sequence[str], python: str, go_file: str, command: Sequence[str]
) -> list[str]:
    """The warm standby of launch `launch` on every usable node (--overlap: it only waits; --wait=0:
    a task that is not needed exits at once without ending the others)."""
    argv = [
        "srun", "--overlap", "--kill-on-bad-exit=1", "--wait=0", f"--job-name=standby-{launch}",
        f"--nodes={len(nodes)}", f"--ntasks={len(nodes) * layout.tasks_per_node}",
        f"--ntasks-per-node={layout.tasks_per_node}", f"--cpus-per-task={layout.cpus_per_task}",
        f"--nodelist={','.join(nodes)}",
    ]  # fmt: skip
    if layout.label:
        argv.append("--label")
    return [*argv, *layout.site_options, python, "-m", "trainer.standby", "--go", go_file, "--", *command]


def health_argv(layout: Layout, nodes: Sequence[str], python: str, run_dir: str, job_dir: str) -> list[str]:
    """trainer.health on every allocated node at once, one task each; a failing node does not end
    the step (--kill-on-bad-exit=0): each writes its own result."""
    return [
        "srun", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}", "--ntasks-per-node=1",
        f"--nodelist={','.join(nodes)}", "--kill-on-bad-exit=0", "--job-name=health-check",
        *layout.site_options, python, "-m", "trainer.health", "--run-dir", run_dir, "--job-dir", job_dir,
    ]  # fmt: skip


def keeps_warm(command: Sequence[str]) -> bool:
    """Only our trainer (`<python> -m trainer RUN_DIR`) has a warm standby (trainer/standby.py
    imports it and waits for the go); any other command is relaunched cold, as a new step."""
    return list(command[1:3]) == ["-m", "trainer"] and len(command) == 4


def node_ranks_argv(python: str, ranks_per_node: int, command: Sequence[str]) -> list[str]:
    """One task per node running `command` (e.g. torchrun), behind the shim that sets torchrun's
    variables of this node (orchestrator/slurm/launcher/node_ranks.py)."""
    return [
        python,
        "-m",
        "orchestrator.slurm.launcher.node_ranks",
        "--ranks-per-node",
        str(ranks_per_node),
        "--",
        *command,
    ]
