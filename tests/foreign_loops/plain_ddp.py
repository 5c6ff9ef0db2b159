"""A plain PyTorch training loop under the controller: DDP on gloo, a tiny model, its own
checkpoint (one torch.save file) and its own sample log. Written for the tests; not our trainer,
and it imports nothing of it: only the client (orchestrator.contract.client).

    srun ... python plain_ddp.py            (cluster.command, one task per rank)
    torchrun --nproc-per-node=G plain_ddp.py   (cluster.command_per: node)

The data: sample p (its position in the global order) is a fixed function of p, so the samples
a run read are exactly the positions in its log, LOOP_LOG_DIR/samples-rank<r>.jsonl.
TEST-ONLY faults, LOOP_FAULTS=kind@step:rank,...: sigkill (the rank dies), stop (SIGSTOP: its node
goes silent), hang (it blocks for ever inside its backward). Each fires once per run
(a marker file in LOOP_LOG_DIR).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from orchestrator.contract import client as runctl

run = runctl.start()  # before torch: a rank that dies or hangs while importing is seen too

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

STEPS = int(os.environ.get("LOOP_STEPS", "12"))
SAVE_EVERY = int(os.environ.get("LOOP_SAVE_EVERY", "2"))
STEP_SECONDS = float(os.environ.get("LOOP_STEP_SECONDS", "0"))  # an honest pause before each step
PER_RANK = 4  # samples a rank reads per step
LOG_DIR = Path(os.environ.get("LOOP_LOG_DIR") or run.paths.root / "loop")


def sample(position: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(16, generator=torch.Generator().manual_seed(position))
    return x, (x[:8].sum() - x[8:].sum()).reshape(1)


def fault_now(kind: str, step: int) -> bool:
    """TEST-ONLY: LOOP_FAULTS asks for `kind` at this step on this rank, and it has not fired yet."""
    wanted = f"{kind}@{step}:{run.rank}"
    if wanted not in os.environ.get("LOOP_FAULTS", "").split(","):
        return False
    try:
        fd = os.open(LOG_DIR / f"fired-{kind}-{step}-{run.rank}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    return True


def waiting_allreduce(state, bucket):
    """DDP's gradient all-reduce, marked as a wait for the peers: a rank inside it is not the one
    holding the others up."""
    runctl.mark(runctl.Mark.WAIT)
    return default_hooks.allreduce_hook(state, bucket)


def all_reduce_max(flags: list[int]) -> list[int]:
    tensor = torch.tensor(flags)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()


def save(step: int, consumed: int, model, optimizer) -> None:
    with run.phase(runctl.Phase.CHECKPOINT, step):
        if run.rank == 0:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                     "consumed": consumed}
            torch.save(state, run.checkpoint_dir(step) / "loop_state.pt")
        dist.barrier()
        run.checkpoint_saved(step)


def main() -> None:
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    if "TORCHELASTIC_RUN_ID" in os.environ:  # torchrun's workers join its agent's store
        dist.init_process_group("gloo")
    else:
        address, port = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
        dist.init_process_group("gloo", init_method=f"tcp://{address}:{port}", rank=run.rank,
                                world_size=run.world_size)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                                                        torch.nn.Linear(32, 1)))
    model.register_comm_hook(None, waiting_allreduce)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    hang = {"now": False}
    model.module[0].weight.register_hook(lambda grad: time.sleep(10**6) if hang["now"] else grad)

    point = run.resume_point()  # which checkpoint, the rollback's skips and LR scale
    step, consumed = 0, 0
    if point.checkpoint is not None:
        state = torch.load(point.checkpoint / "loop_state.pt", weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, consumed = state["step"], state["consumed"]
        assert consumed == point.consumed_samples, (consumed, point.consumed_samples)
    print(f"rank {run.rank}: start at step {step} from {point.checkpoint}", flush=True)
    skips = point.skips
    global_batch = PER_RANK * run.world_size
    while step < STEPS:
        if fault_now("sigkill", step + 1):
            os.kill(os.getpid(), signal.SIGKILL)
        if fault_now("stop", step + 1):  # right after the last step's marks: silent, not slow
            os.kill(os.getpid(), signal.SIGSTOP)
        hang["now"] = fault_now("hang", step + 1)
        time.sleep(STEP_SECONDS)
        first = skips.kept_below(consumed)  # the next global batch: kept positions, in order
        batch = [skips.position_of(first + i) for i in range(global_batch)]
        positions = batch[run.rank * PER_RANK:(run.rank + 1) * PER_RANK]
        with open(LOG_DIR / f"samples-rank{run.rank}.jsonl", "a") as log:
            log.write(json.dumps({"step": step + 1, "positions": positions, "job": run.job_id}) + "\n")
        inputs, targets = (torch.stack(t) for t in zip(*(sample(p) for p in positions), strict=True))
        for group in optimizer.param_groups:
            group["lr"] = 0.05 * point.lr_factor(step + 1)
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        runctl.mark(runctl.Mark.FORWARD)
        optimizer.zero_grad()
        loss.backward()
        runctl.mark(runctl.Mark.BACKWARD)
        optimizer.step()
        runctl.mark(runctl.Mark.OPTIMIZER)
        step, consumed = step + 1, batch[-1] + 1
        run.step_done(step, consumed, loss=loss.item(), global_batch=global_batch)
        stop = run.should_stop(all_reduce_max)  # the kill switch, the time budget: every rank agrees
        if stop or step % SAVE_EVERY == 0 or step == STEPS:
            save(step, consumed, model, optimizer)
        if stop:
            print(f"rank {run.rank}: stopping at step {step}: {run.stop_reason()}", flush=True)
            run.exit(run.stop_code())
    run.exit(runctl.ExitCode.FINISHED)


if __name__ == "__main__":
    main()
