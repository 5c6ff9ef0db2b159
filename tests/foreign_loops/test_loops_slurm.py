"""A plain PyTorch DDP loop (plain_ddp.py, not our trainer) under the controller on the real local
cluster, started two ways by `cluster.command`: one rank per srun task, and through torchrun
(`command: [python, -m, torch.distributed.run, plain_ddp.py]`, `command_per: node`), as teams
whose scripts expect torchrun's variables run it. Each runs the five faults of chain.py in one
run; one test per check."""

from __future__ import annotations

import shutil

import pytest

from .chain import cleanup, operator_account, remove_account, run_chain
from .checks import (
    check_hang_in_backward_found_within_the_learned_limit,
    check_kill_by_another_operator_saves_then_stops,
    check_node_loss_relaunched_on_the_spare,
    check_rollback_skips_are_never_read_again,
    check_sigkill_restarts_from_the_loops_own_checkpoint,
)
from .config import plain_command, torchrun_command

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
STARTS = {"srun": (plain_command, "rank"), "torchrun": (torchrun_command, "node")}


@pytest.fixture(scope="module", params=sorted(STARTS))
def chain(request, local_cluster):
    if not shutil.which("useradd"):
        pytest.skip("needs useradd (the kill comes from another operator)")
    command, per = STARTS[request.param]
    user, group = operator_account()
    try:
        made = run_chain(local_cluster, command(), user, group, command_per=per)
        yield made
        cleanup(made)
    finally:
        remove_account(user, group)


def test_node_loss_is_relaunched_on_the_spare_inside_the_job(chain):
    check_node_loss_relaunched_on_the_spare(chain)


def test_sigkilled_rank_restarts_from_the_loops_own_checkpoint(chain):
    check_sigkill_restarts_from_the_loops_own_checkpoint(chain)


def test_rank_hung_in_its_backward_is_a_hang_within_the_learned_limit(chain):
    check_hang_in_backward_found_within_the_learned_limit(chain)


def test_rollback_directive_honoured_from_the_loops_own_sample_log(chain):
    check_rollback_skips_are_never_read_again(chain)


def test_kill_by_another_operator_saves_then_stops(chain):
    check_kill_by_another_operator_saves_then_stops(chain)
