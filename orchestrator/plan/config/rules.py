"""Every rule that relates several fields of a run config, in one place.

Each rule returns messages that name every factor, e.g.
`tp*pp*dp = 4*12*8 = 384, but the job has 48 nodes x 4 GPUs = 192`.
`check_layout` is the ParallelDims of this project: the trainer calls it too, with the world
size it actually got from SLURM.
"""

from __future__ import annotations

from .schema import RunConfig


def check_layout(tp: int, pp: int, dp: int, world_size: int, where: str = "") -> list[str]:
    product = tp * pp * dp
    if product != world_size:
        # `where` names the world size with its own factors ("the job has 48 nodes x 8 GPUs = 384").
        return [f"tp*pp*dp = {tp}*{pp}*{dp} = {product}, but {where or f'the world size is {world_size}'}"]
    return []


def cross_field_problems(cfg: RunConfig) -> list[str]:
    """All problems at once, so that an operator fixes a config in one round."""
    problems: list[str] = []
    c, m, p = cfg.cluster, cfg.model, cfg.parallel
    tp, pp, dp = p.tp, p.pp, cfg.dp

    gpus_desc = f"the job has {c.nodes} nodes x {c.gpus_per_node} GPUs = {c.gpus}"
    if cfg.container is not None and c.launcher_python is None:
        problems.append(
            "container.image is set, so cluster.python runs inside the image; set cluster.launcher_python "
            "to an interpreter on the nodes themselves with bloomctl installed (the job launcher runs "
            "outside the container), e.g. the login node's venv on the shared filesystem"
        )
    if p.dp is None and c.gpus % (tp * pp) != 0:
        problems.append(
            f"parallel.dp is derived as GPUs/(tp*pp) = {c.gpus}/({tp}*{pp}), which is not whole: "
            f"choose tp*pp dividing {c.gpus} or set cluster.nodes/gpus_per_node"
        )
    else:
        problems += check_layout(tp, pp, dp, c.gpus, gpus_desc)

    if m.num_attention_heads % tp != 0:
        problems.append(
            f"model.num_attention_heads = {m.num_attention_heads} is not divisible by parallel.tp = {tp}: "
            "each tensor-parallel rank must hold whole heads"
        )
    if m.hidden_size % m.num_attention_heads != 0:
        problems.append(
            f"model.hidden_size = {m.hidden_size} is not divisible by model.num_attention_heads = "
            f"{m.num_attention_heads}"
        )
    if m.ffn_size % tp != 0:
        problems.append(f"the MLP width {m.ffn_size} is not divisible by parallel.tp = {tp}")
    # BLOOM's pipeline has num_layers transformer units plus the two (tied) embedding units.
    if m.num_layers + 2 < pp:
        problems.append(
            f"parallel.pp = {pp} stages but only {m.num_layers} layers + 2 embedding units: "
            "every pipeline stage needs at least one unit"
        )
    if pp > 1 and m.num_layers < pp - 2 + 1:
        problems.append(f"model.num_layers = {m.num_layers} is too few for pp = {pp}")

    padded = cfg.padded_vocab_size
    multiple = m.make_vocab_size_divisible_by * tp
    if padded < m.vocab_size:
        problems.append(
            f"model.padded_vocab_size = {padded} is smaller than model.vocab_size = {m.vocab_size}"
        )
    if padded % multiple != 0:
        problems.append(
            f"model.padded_vocab_size = {padded} is not divisible by make_vocab_size_divisible_by*tp = "
            f"{m.make_vocab_size_divisible_by}*{tp} = {multiple}; the next valid size is "
            f"{-(-max(padded, m.vocab_size) // multiple) * multiple}"
        )

    per_step = p.micro_batch_size * dp
    if p.global_batch_size % per_step != 0:
        problems.append(
            f"parallel.global_batch_size = {p.global_batch_size} is not divisible by micro_batch_size*dp = "
            f"{p.micro_batch_size}*{dp} = {per_step}"
        )
    if p.rampup is not None:
        r = p.rampup
        if r.start > p.global_batch_size:
            problems.append(
                f"parallel.rampup.start = {r.start} exceeds parallel.global_batch_size = {p.global_batch_size}"
            )
        if (p.global_batch_size - r.start) % r.increment != 0:
            problems.append(
                f"parallel.global_batch_size - rampup.start = {p.global_batch_size} - {r.start} is not a "
                f"multiple of rampup.increment = {r.increment}"
            )
        for name, value in (("start", r.start), ("increment", r.increment)):
            if value % per_step != 0:
                problems.append(
                    f"parallel.rampup.{name} = {value} is not divisible by micro_batch_size*dp = "
                    f"{p.micro_batch_size}*{dp} = {per_step}"
                )
        if r.samples > cfg.train_samples:
            problems.append(
                f"parallel.rampup.samples = {r.samples} exceeds the training samples ({cfg.train_samples})"
            )

    o = cfg.optimizer
    if o.warmup_samples > cfg.decay_samples:
        problems.append(
            f"optimizer.warmup_samples = {o.warmup_samples} exceeds the decay samples ({cfg.decay_samples})"
        )

    if c.accelerator == "cpu" and m.dtype == "bf16" and m.kernels == "triton":
        problems.append(
            "model.kernels = triton needs cluster.accelerator = cuda (or use auto/reference on CPU)"
        )

    problems += signal_problems(c.pre_timeout_signal)
    return problems


# Signals something else in the job already means, and what. The pre-timeout signal must mean
# only "save now, time is nearly up". USR1 (the default) is free: SLURM sends it only when asked
# (--signal), NCCL installs no signal handlers (its watchdog and the flight recorder run on
# timeouts and environment variables), torchrun forwards TERM/INT/HUP/QUIT, not USR1, and
# Megatron and Lightning use USR1 for the same purpose.
RESERVED_SIGNALS = {
    "USR2": "the trainer's stack dumps (faulthandler on SIGUSR2: the controller's hang forensics and "
    "`runctl dump-stacks`)",
    "TERM": "SLURM itself (scancel, preemption and the time limit send SIGTERM, then SIGKILL after "
    "KillWait), forwarded by srun and torchrun as 'stop now'",
}


def signal_problems(pre_timeout_signal: str) -> list[str]:
    used_by = RESERVED_SIGNALS.get(pre_timeout_signal)
    if used_by is None:
        return []
    return [
        f"cluster.pre_timeout_signal = {pre_timeout_signal} is already used by {used_by}; the trainer "
        "could not tell 'save, the time limit is near' from it: use USR1 (the default)"
    ]
