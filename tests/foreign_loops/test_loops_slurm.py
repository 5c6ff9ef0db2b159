"""A plain PyTorch DDP loop (plain_ddp.py, not our trainer) under the controller on the real local
cluster, started two ways by `cluster.command`: one rank per srun task, and through torchrun
(`command: [python, -m, torch.distributed.run, plain_ddp.py]`, `command_per: node`), as teams
whose scripts expect torchrun's variables run it. Under srun the loop runs the five faults of
chain.py in one run; under torchrun the three a start mode changes (a lost node, a killed rank,
the kill switch). One test per check."""

from __future__ import annotations

import shutil

import pytest

from .chain import NODE_FAULTS, cleanup, operator_account, remove_account, run_chain
from .checks import (
    check_hang_in_backward_found_within_the_learned_limit,
    check_kill_by_another_operator_saves_then_stops,
    check_node_loss_relaunched_on_the_spare,
    check_rollback_skips_are_never_read_again,
    check_sigkill_restarts_from_the_loops_own_checkpoint,
)
from .config import plain_command, torchrun_command

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def one_chain(local_cluster, command: list[str], **options):
    if not shutil.which("useradd"):
        pytest.skip("needs useradd (the kill comes from another operator)")
    user, group = operator_account()
    try:
        made = run_chain(local_cluster, command, user, group, **options)
        yield made
        cleanup(made)
    finally:
        remove_account(user, group)


@pytest.fixture(scope="module")
def srun_chain(local_cluster):
    yield from one_chain(local_cluster, plain_command(), command_per="rank")


@pytest.fixture(scope="module")
def torchrun_chain(local_cluster):
    yield from one_chain(local_cluster, torchrun_command(), command_per="node", faults=NODE_FAULTS)


@pytest.fixture(params=["srun", "torchrun"])
def chain(request):
    """The checks both chains hold."""
    return request.getfixturevalue(f"{request.param}_chain")


def test_node_loss_is_relaunched_on_the_spare_inside_the_job(chain):
    check_node_loss_relaunched_on_the_spare(chain)


def test_sigkilled_rank_restarts_from_the_loops_own_checkpoint(chain):
    check_sigkill_restarts_from_the_loops_own_checkpoint(chain)


def test_kill_by_another_operator_saves_then_stops(chain):
    check_kill_by_another_operator_saves_then_stops(chain)


def test_rank_hung_in_its_backward_is_a_hang_within_the_learned_limit(srun_chain):
    check_hang_in_backward_found_within_the_learned_limit(srun_chain)


def test_rollback_directive_honoured_from_the_loops_own_sample_log(srun_chain):
    check_rollback_skips_are_never_read_again(srun_chain)
