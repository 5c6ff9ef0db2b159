"""The smallest training loop under the controller: one rank (plain_ddp.py is the DDP one)."""

import torch

from orchestrator.contract import client as runctl

run = runctl.start()  # rank, job, run dir from the environment; the beat starts now
point = run.resume_point()  # the checkpoint to load, the rollback's skips and LR scale
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
step, consumed = point.step, point.consumed_samples
if point.checkpoint is not None:
    state = torch.load(point.checkpoint / "state.pt", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
while step < 20:
    first = point.skips.kept_below(consumed)  # the next 8 samples, never a skipped one
    positions = [point.skips.position_of(first + i) for i in range(8)]
    x = torch.stack([torch.full((4,), p / 100.0) for p in positions])
    loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
    runctl.mark(runctl.Mark.FORWARD)  # fine progress: a hang is found below the step
    optimizer.zero_grad()
    loss.backward()
    runctl.mark(runctl.Mark.BACKWARD)
    for group in optimizer.param_groups:
        group["lr"] = 0.01 * point.lr_factor(step + 1)
    optimizer.step()
    step, consumed = step + 1, positions[-1] + 1
    run.step_done(step, consumed, loss.item())
    stop = run.should_stop()  # the kill switch or the time budget, agreed by every rank
    if stop or step % 5 == 0:
        with run.phase(runctl.Phase.CHECKPOINT, step):  # a long save is not a hang
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            torch.save(state, run.checkpoint_dir(step) / "state.pt")
            run.checkpoint_saved(step)  # manifest, then `latest`: now it is a checkpoint
    if stop:
        run.exit(run.stop_code())  # KILLED: never restarted; TIME_BUDGET: the next job goes on
run.exit(runctl.ExitCode.FINISHED)
