"""Does a TP x PP x DP layout fit, how fast will it go, what will it cost, and how often to checkpoint.

Pure arithmetic over a RunConfig (no torch), so it runs on a login node in milliseconds. The
formulas, and where they come from:
- parameters: BLOOM's architecture counted exactly (embedding, embedding LN, 12h^2 + 13h per
  layer, final LN; the output projection is tied to the embedding);
- FLOPs: Megatron-LM (Narayanan et al. 2021, eq. 3): 96 B s l h^2 (1 + s/6h + V/16lh) per
  iteration with full activation recompute (hardware FLOPs), 72 B s l h^2 (...) without (model FLOPs);
- activations: Korthikanti et al. 2022: s b h (10 + 24/t + 5 a s / (h t)) bytes per layer with TP
  and no sequence parallelism; with full recompute only each layer's bf16 input is kept;
- memory: bf16 weights (2 B), bf16 gradients (2 B), the fp32 gradient-accumulation buffer of the
  BF16 optimizer (4 B), and the ZeRO-1-partitioned fp32 master copy + Adam moments (12 B / dp);
- pipeline bubble: (pp - 1) / (m + pp - 1) for 1F1B with m micro-batches;
- async-save snapshot (checkpoint.async_save): each rank copies what it writes to host RAM, at most
  its bf16 weights (2 B) + its ZeRO-1 share of fp32 master and Adam (12 B / dp) per parameter; a
  node holds gpus_per_node ranks of the biggest stage, plus SNAPSHOT_MARGIN;
- save stall: a sync save stalls training for the whole checkpoint.save_seconds (a measured save
  time, which includes the probe below). An async save stalls it for the device-to-host copy of the
  biggest stage's snapshot per rank at checkpoint.snapshot_gb_per_second (every rank waits for the
  slowest at the next step's collectives), plus, with checkpoint.verify_probe, the probe batch's
  forward: one micro-batch through the pp stages in turn, each stage's share of one micro-batch
  being forward-seconds-per-iteration / m. Left out: the sha256 of the last stage's bf16 logits
  (0.5 GB a rank at BLOOM's size, ~0.35 s at 1.45 GB/s, 7% of BLOOM's stall). The background write
  is assumed to end within an interval;
- checkpoint interval: Young/Daly, tau = sqrt(2 delta M) for the save stall delta and job MTBF M
  (of the training GPUs); goodput ~ 1 - delta/P - (P/2 + U + R)/M with mean restart time R, where
  - P is the period from one save's snapshot to the next (goodput_model.save_period_hours): tau +
    delta, since the trainer's interval clock restarts when a save returns, + half a step for a
    time-based interval, since saves start at step ends (BLOOM: 52 s);
  - U is how long a save is incomplete after its snapshot begins: delta, + save_seconds for an
    async save's background write. A failure then loses that save too, so the work lost is
    P/2 + U on average (U < P). The write is 0.06 points for BLOOM at Llama 3's rate and 0.6 at ten
    times it, where tau is 0.25 h;
- spares and restarts (see goodput_model.spare_outlook): a job holds nodes + spare_nodes for its time limit T.
  Failures in it are Poisson with mean mu = T / M. A GPU or a host fault takes its node (the
  controller excludes it), 0.75 of them (pool_wait.NODE_TAKING_SHARE, Llama 3's Table 5); a
  software fault or a network hang relaunches on the same nodes. The first spare_nodes node-taking
  failures are restarted on a spare inside the job, the others in place (both
  watchdog.in_allocation_restart_minutes, else priced by orchestrator/plan/restart_paths.py:
  detection, the warm standby's start, the load from the nearest copy); the (S + 1)-th node-taking
  one ends the job: a job-level restart through the queue (watchdog.restart_minutes, else priced the
  same way: detection, queue, cold start, shared load) with a fresh set of spares. Idle spares' own
  failures are ignored. So with N ~ Poisson(0.75 mu) node-taking failures, a job uses E[min(N, S)]
  spares and runs out with probability P(N >= S + 1); R is the mean of the two restart times
  weighted by the counts of in-job and job-level restarts;
- jobs and time limits (see goodput_model.cycle_losses): goodput is useful / wall time over one job and the
  start of the next (a renewal cycle). A job lasts E[D] = (M / 0.75) E[min(N, S + 1)] on average
  (Wald: each node-taking failure comes M / 0.75 after the last, and the job ends at its limit or at
  its (S + 1)-th); the next one starts after the job-level restart time (queue, init, checkpoint
  load), whatever ended it, plus the wait for nodes (see `pool_wait`). Inside the job: the save
  stalls, P/2 + U of work per failure (E[D] / M failures), the restarts inside the job, evals, and,
  with probability 1 - P(N >= S + 1), the final save before the time limit (the
  whole checkpoint.save_seconds: the job waits for that write even when saves are async). So a
  spare that costs nearly as much as a job-level restart can lower goodput: a job-level restart
  gives the next job a whole time limit, a spare restart does not;
- the pool (orchestrator/plan/pool_wait.py): a new job waits while more than spare_nodes +
  cluster.partition_extra_nodes nodes are out of service (a GPU or host fault's node, on probation
  for exclusions.probation_hours): E[W] per job start, from m = 0.75 x probation / M nodes out on
  average (Poisson, seen from a job start) and the probations left (uniform);
- evals (see `eval_fraction`): every data.eval_interval iterations, eval_iters forward-only
  iterations (a third of the model FLOPs of a training iteration: forward 1, backward 2);
- goodput is useful training time / wall time, of the training GPUs (the planner's `*_goodput`);
  of the allocated GPUs it is that x nodes / (nodes + spare_nodes): idle spares are billed overhead.
  GPU-hours are computed at 100% goodput; `allocated_gpu_hours` (what is billed) counts the spares.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from orchestrator.plan.config import RunConfig
from orchestrator.plan.config.slurm_time import slurm_time_seconds
from orchestrator.plan.goodput_model import (
    CycleLosses,
    SpareOutlook,
    cycle_losses,
    save_period_hours,
    spare_outlook,
    young_daly_interval_hours,
)
from orchestrator.plan.pool_wait import NODE_TAKING_SHARE, nodes_out_mean, pool_wait_hours
from orchestrator.plan.restart_paths import RestartPaths
from orchestrator.plan.time_budget import checkpoint_interval_seconds, time_budget_problems

GIB = 1024**3
BYTES_BF16 = 2
BYTES_FP32 = 4
# Host RAM on top of the snapshot itself: pinned-allocation rounding, pickling buffers, the rest of
# the trainer's host memory (data loader, CUDA context).
SNAPSHOT_MARGIN = 0.25


@dataclass(frozen=True)
class StageMemory:
    """Memory of the GPUs of one pipeline stage (all TP ranks of a stage hold the same amount)."""

    stage: int
    transformer_layers: int
    has_embedding: bool
    parameters_per_gpu: int
    weights_bf16_gib: float
    grads_bf16_gib: float
    grad_accum_fp32_gib: float
    optimizer_states_gib: float  # fp32 master + Adam m, v, partitioned over dp (ZeRO-1)
    activations_gib: float  # with the configured recompute setting
    activations_no_recompute_gib: float
    activations_recompute_gib: float
    total_gib: float


@dataclass(frozen=True)
class Plan:
    parameters: int
    gpus: int
    tp: int
    pp: int
    dp: int
    micro_batch_size: int
    global_batch_size: int
    micro_batches: int
    tokens_per_iteration: int
    model_flops_per_iteration: float
    hardware_flops_per_iteration: float
    achieved_tflops_per_gpu: float
    seconds_per_iteration: float
    train_samples: int
    train_tokens: int
    iterations: float
    training_days: float
    gpu_hours: float  # on the training GPUs, at 100% goodput
    nodes: int
    spare_nodes: int
    allocated_nodes: int  # nodes + spare_nodes: what each job holds and is billed for
    allocated_gpu_hours: float  # gpu_hours x allocated / training nodes (spares idle but billed)
    spare_gpu_hours: float
    bubble_fraction: float
    stages: list[StageMemory]
    max_memory_per_gpu_gib: float
    gpu_memory_gib: float
    checkpoint_bytes: int
    async_save: bool
    snapshot_gib_per_rank: float  # the host copy of one rank's checkpoint files (biggest stage)
    host_memory_needed_gib_per_node: float  # snapshot x ranks per node x (1 + SNAPSHOT_MARGIN)
    host_memory_gib: float
    checkpoint_interval_hours: float | None
    optimal_checkpoint_interval_hours: float
    save_period_hours: float  # from one save's snapshot to the next, at the interval planned
    job_mtbf_hours: float  # of the training GPUs
    save_seconds: float  # one whole save (checkpoint.save_seconds)
    save_stall_seconds: float  # what one save stalls training (async: snapshot + probe, sync: the save)
    snapshot_gb_per_second: float  # checkpoint.snapshot_gb_per_second: one GPU's device-to-host copy
    snapshot_seconds: float  # snapshot_gib_per_rank / snapshot_gb_per_second (an async save's copy)
    probe_seconds: float  # the probe batch's forward at each save (0 without checkpoint.verify_probe)
    job_hours: float  # cluster.time_limit
    failures_per_job: float  # mu = job_hours / job_mtbf_hours
    spares_used_per_job: float  # E[min(N, spare_nodes)], N ~ Poisson(0.75 mu): the node-taking failures
    out_of_spares_probability: float  # P(N >= spare_nodes + 1)
    in_allocation_share: float  # of all failures, the share restarted inside the job (spare or in place)
    in_allocation_restart_hours: float
    job_restart_hours: float
    mean_restart_hours: float
    expected_work_lost_per_failure_hours: float
    eval_seconds: float  # one eval (eval_seconds)
    eval_fraction: float  # of wall time spent in evals
    turnover_fraction: float  # of wall time lost to time-limit turnovers (final save + next start)
    losses: CycleLosses  # where the wall time goes besides training, at the configured interval
    nodes_out_mean: float  # nodes out of service on average (probation after a GPU or host fault)
    pool_slack_nodes: int  # how many may be out before a new job waits: spare_nodes + partition_extra_nodes
    pool_wait_hours: float  # E[W]: what a job start waits for nodes, on average (pool_wait.py)
    pool_wait_goodput_cost: float  # what the wait costs expected_goodput (a share of wall time)
    expected_goodput: float  # of the training GPUs, at the configured interval
    optimal_goodput: float  # of the training GPUs, at the Young/Daly interval
    expected_goodput_allocated: float  # of all allocated GPUs: expected_goodput x nodes / allocated
    optimal_goodput_allocated: float
    expected_goodput_without_spares: float  # the same run with spare_nodes = 0, for comparison
    problems: list[str] = field(default_factory=list)
    adaptive_interval: str = "off"  # "apply": expected_goodput is at the re-fitted (Young/Daly) interval
    restart_times_from: str = "watchdog"  # "watchdog" (its *_restart_minutes) or "recovery" (restart_paths)

    @property
    def fits(self) -> bool:
        return not self.problems

    def flat(self) -> dict[str, object]:
        """The `--json` object: flat keys, no nested per-stage table (stages go under `stages`)."""
        data = asdict(self)
        data["stages"] = [asdict(s) for s in self.stages]
        data["fits"] = self.fits
        return data


# ----------------------------------------------------------------------------- parameters
def layer_parameters(h: int, ffn: int) -> int:
    """One BLOOM block: LN (2h), fused QKV (3h^2 + 3h), dense (h^2 + h), LN (2h), MLP (2 h ffn + ffn + h)."""
    return 2 * h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h + (h * ffn + ffn) + (ffn * h + h)


def embedding_parameters(cfg: RunConfig) -> int:
    m = cfg.model
    return cfg.padded_vocab_size * m.hidden_size + (2 * m.hidden_size if m.embedding_layernorm else 0)


def count_parameters(cfg: RunConfig) -> int:
    m = cfg.model
    final_ln = 2 * m.hidden_size
    return embedding_parameters(cfg) + m.num_layers * layer_parameters(m.hidden_size, m.ffn_size) + final_ln


def pipeline_partition(num_layers: int, pp: int) -> list[tuple[int, bool]]:
    """(transformer layers, holds an embedding) per stage, as DeepSpeed's
    `type:transformer|embedding` balances them: num_layers + 2 units (the tied embedding at both
    ends) spread evenly, the embeddings on the first and last stage."""
    if pp == 1:
        return [(num_layers, True)]
    units = num_layers + 2
    # Balanced split like DeepSpeed's partition_balanced: sizes differ by at most one.
    base, extra = divmod(units, pp)
    sizes = [base + (1 if i < extra else 0) for i in range(pp)]
    stages = []
    for i, size in enumerate(sizes):
        embeddings = int(i == 0) + int(i == pp - 1)
        stages.append((size - embeddings, embeddings > 0))
    return stages


# ----------------------------------------------------------------------------- FLOPs
def flops_per_iteration(cfg: RunConfig, global_batch: int | None = None, recompute: bool = True) -> float:
    """Megatron's formula: 72 (model) or 96 (with full recompute) B s l h^2 (1 + s/6h + V/16lh)."""
    m = cfg.model
    batch = global_batch if global_batch is not None else cfg.parallel.global_batch_size
    s, h, layers, vocab = m.seq_length, m.hidden_size, m.num_layers, cfg.padded_vocab_size
    factor = 96 if recompute else 72
    return factor * batch * s * layers * h * h * (1 + s / (6 * h) + vocab / (16 * layers * h))


# ----------------------------------------------------------------------------- memory
def activation_bytes_per_layer(cfg: RunConfig, recompute: bool) -> float:
    """Bytes of activations one transformer layer keeps for one micro-batch on one TP rank."""
    m, p = cfg.model, cfg.parallel
    s, b, h, a, t = m.seq_length, p.micro_batch_size, m.hidden_size, m.num_attention_heads, p.tp
    if recompute:
        return BYTES_BF16 * s * b * h  # only the layer's input is checkpointed
    return s * b * h * (10 + 24 / t + 5 * a * s / (h * t))


def stage_memory(cfg: RunConfig) -> list[StageMemory]:
    m, p = cfg.model, cfg.parallel
    tp, pp, dp = p.tp, p.pp, cfg.dp
    per_layer = layer_parameters(m.hidden_size, m.ffn_size)
    embedding = embedding_parameters(cfg)
    # 1F1B: stage i holds at most (pp - i) micro-batches in flight, never more than there are.
    micro_batches = max(1, cfg.micro_batches)
    logits_bytes = BYTES_FP32 * m.seq_length * p.micro_batch_size * cfg.padded_vocab_size / tp
    stages = []
    for index, (layers, has_embedding) in enumerate(pipeline_partition(m.num_layers, pp)):
        params = layers * per_layer
        if has_embedding:
            params += embedding
        if index == pp - 1:
            params += 2 * m.hidden_size  # final LayerNorm
        params_per_gpu = math.ceil(params / tp)
        in_flight = min(pp - index, micro_batches)
        full_layer = activation_bytes_per_layer(cfg, recompute=False)
        kept = activation_bytes_per_layer(cfg, recompute=True)
        extra = logits_bytes if index == pp - 1 else 0.0
        no_recompute = layers * full_layer * in_flight + extra
        # With recompute: every layer's input for every in-flight micro-batch, plus one layer's
        # full activations while it is being recomputed for its backward pass.
        with_recompute = layers * kept * in_flight + (full_layer if layers else 0.0) + extra
        activations = with_recompute if p.activation_checkpointing else no_recompute
        weights = BYTES_BF16 * params_per_gpu
        grads = BYTES_BF16 * params_per_gpu
        accum = BYTES_FP32 * params_per_gpu
        optim = 3 * BYTES_FP32 * params_per_gpu / dp
        total = weights + grads + accum + optim + activations
        stages.append(
            StageMemory(
                stage=index,
                transformer_layers=layers,
                has_embedding=has_embedding,
                parameters_per_gpu=params_per_gpu,
                weights_bf16_gib=weights / GIB,
                grads_bf16_gib=grads / GIB,
                grad_accum_fp32_gib=accum / GIB,
                optimizer_states_gib=optim / GIB,
                activations_gib=activations / GIB,
                activations_no_recompute_gib=no_recompute / GIB,
                activations_recompute_gib=with_recompute / GIB,
                total_gib=total / GIB,
            )
        )
    return stages


# ----------------------------------------------------------------------------- checkpoints
def checkpoint_bytes(parameters: int) -> int:
    """A DeepSpeed checkpoint of this run: bf16 weights + fp32 master + Adam m and v."""
    return parameters * (BYTES_BF16 + 3 * BYTES_FP32)


def snapshot_bytes_per_rank(stage: StageMemory) -> float:
    """What one rank of `stage` writes (hence copies to host RAM in an async save): its bf16
    weights (only data-parallel rank 0 writes them, counted for every rank: the bound is for the
    node whose ranks all write them) and its ZeRO-1 share of the fp32 master and Adam moments."""
    return (stage.weights_bf16_gib + stage.optimizer_states_gib) * GIB


def probe_forward_seconds(cfg: RunConfig, forward_seconds_per_iteration: float) -> float:
    """The probe batch's forward at each save (checkpoint.verify_probe): one micro-batch through the
    pp stages one after the other; a stage's forward of one micro-batch is its forward of the
    iteration's m micro-batches / m. Every DP replica runs it at the same time."""
    if not cfg.checkpoint.verify_probe or cfg.micro_batches <= 0:
        return 0.0
    return forward_seconds_per_iteration * cfg.parallel.pp / cfg.micro_batches


def eval_seconds(cfg: RunConfig, forward_seconds_per_iteration: float) -> float:
    """One eval: eval_iters forward-only iterations (no backward, no activation recompute)."""
    return cfg.data.eval_iters * forward_seconds_per_iteration


def eval_fraction(
    cfg: RunConfig, seconds_per_iteration: float, forward_seconds_per_iteration: float
) -> float:
    """Wall time in evals: one eval every eval_interval iterations."""
    evaluation = eval_seconds(cfg, forward_seconds_per_iteration)
    return evaluation / (cfg.data.eval_interval * seconds_per_iteration + evaluation)


def _minutes_or(configured: float | None, priced_seconds: float) -> float:
    """A restart time the config sets, else the restart-path table's price of it."""
    return configured if configured is not None else priced_seconds / 60


# ----------------------------------------------------------------------------- failures and spares
def time_limit_hours(time_limit: str) -> float:
    return slurm_time_seconds(time_limit) / 3600


# ----------------------------------------------------------------------------- the plan
def plan_run(
    cfg: RunConfig,
    achieved_tflops_per_gpu: float | None = None,
    train_tokens: float | None = None,
    gpu_mtbf_hours: float | None = None,
    checkpoint_save_seconds: float | None = None,
    spare_nodes: int | None = None,
    in_allocation_restart_minutes: float | None = None,
    snapshot_gb_per_second: float | None = None,
) -> Plan:
    """The plan of `cfg`; every keyword that is not None replaces the config's value of the same
    meaning (the CLI checks them like config values: positive and finite)."""
    m, p, c = cfg.model, cfg.parallel, cfg.cluster
    tflops = c.achieved_tflops_per_gpu if achieved_tflops_per_gpu is None else achieved_tflops_per_gpu
    parameters = count_parameters(cfg)
    tokens_per_iteration = p.global_batch_size * m.seq_length
    hardware = flops_per_iteration(cfg, recompute=p.activation_checkpointing)
    model = flops_per_iteration(cfg, recompute=False)
    seconds = hardware / (c.gpus * tflops * 1e12)

    if train_tokens is not None:
        tokens = int(train_tokens)
        samples = math.ceil(tokens / m.seq_length)
    else:
        samples = cfg.train_samples
        tokens = samples * m.seq_length
    # FLOPs are per sample, so the batch-size rampup does not change the total compute.
    iterations = samples / p.global_batch_size
    total_seconds = iterations * seconds
    gpu_hours = total_seconds * c.gpus / 3600
    spares = c.spare_nodes if spare_nodes is None else spare_nodes
    allocated_nodes = c.nodes + spares

    stages = stage_memory(cfg)
    max_memory = max(s.total_gib for s in stages)
    m_batches = cfg.micro_batches
    bubble = (p.pp - 1) / (m_batches + p.pp - 1) if m_batches > 0 else 1.0

    mtbf_gpu = c.gpu_mtbf_hours if gpu_mtbf_hours is None else gpu_mtbf_hours
    job_mtbf = mtbf_gpu / c.gpus
    save_seconds = cfg.checkpoint.save_seconds if checkpoint_save_seconds is None else checkpoint_save_seconds
    forward_seconds = model / 3 / (c.gpus * tflops * 1e12)  # forward only: 72 = 3 x 24 (fwd 1, bwd 2)
    snapshot_bytes = max(snapshot_bytes_per_rank(s) for s in stages)
    bandwidth = (
        cfg.checkpoint.snapshot_gb_per_second if snapshot_gb_per_second is None else snapshot_gb_per_second
    )
    snapshot_seconds = snapshot_bytes / (bandwidth * 1e9)
    probe_seconds = probe_forward_seconds(cfg, forward_seconds)
    stall_seconds = snapshot_seconds + probe_seconds if cfg.checkpoint.async_save else save_seconds
    paths = RestartPaths.of(cfg, checkpoint_bytes(parameters), spares)
    job_restart_hours = _minutes_or(cfg.watchdog.restart_minutes, paths.job_level_seconds()) / 60
    in_minutes = in_allocation_restart_minutes
    if in_minutes is None:
        in_minutes = _minutes_or(cfg.watchdog.in_allocation_restart_minutes, paths.in_allocation_seconds())
    in_allocation_hours = in_minutes / 60
    job_hours = time_limit_hours(c.time_limit)
    taking = NODE_TAKING_SHARE
    outlook = spare_outlook(job_hours, job_mtbf, spares, in_allocation_hours, job_restart_hours, taking)
    restart_hours = outlook.mean_restart_hours
    optimal = young_daly_interval_hours(stall_seconds, job_mtbf)
    # The earlier of hours and steps.
    interval_seconds, interval_key = checkpoint_interval_seconds(cfg, seconds)
    interval = None if interval_seconds is None else interval_seconds / 3600
    configured = interval if interval is not None else optimal
    by_steps = interval_key.startswith("checkpoint.interval_steps")
    if cfg.checkpoint.adaptive_interval == "apply":  # the controller re-fits it to Young/Daly
        configured = min(max(optimal, cfg.checkpoint.min_interval_hours), cfg.checkpoint.max_interval_hours)
        by_steps = False
    overshoot_seconds = 0.0 if by_steps else seconds / 2
    evals = eval_fraction(cfg, seconds, forward_seconds)
    no_spares = spare_outlook(job_hours, job_mtbf, 0, in_allocation_hours, job_restart_hours, taking)
    out_hours = cfg.exclusions.probation_hours if cfg.exclusions.on_pool_short == "wait" else 0.0
    nodes_out = nodes_out_mean(job_mtbf, out_hours)

    def period(interval_hours: float) -> float:
        return save_period_hours(interval_hours, stall_seconds, overshoot_seconds)

    unsealed_hours = (stall_seconds + (save_seconds if cfg.checkpoint.async_save else 0.0)) / 3600

    def wait_for_nodes(spare_outlook_: SpareOutlook, spares_: int) -> float:
        slack = spares_ + c.partition_extra_nodes
        return pool_wait_hours(nodes_out, slack, out_hours, spare_outlook_.out_of_spares_probability)

    def cycle(
        interval_hours: float, spare_outlook_: SpareOutlook, spares_: int, pool: bool = True
    ) -> CycleLosses:
        return cycle_losses(
            period(interval_hours), stall_seconds, job_mtbf, spare_outlook_, in_allocation_hours, job_restart_hours,
            save_seconds, evals, wait_for_nodes(spare_outlook_, spares_) if pool else 0.0,
            unsealed_hours,
        )  # fmt: skip

    losses = cycle(configured, outlook, spares)
    expected = losses.goodput
    # Jobs that end at their time limit: the final save and the next start.
    turnover = losses.final_save + (1 - outlook.out_of_spares_probability) * losses.job_start
    optimal_goodput = cycle(optimal, outlook, spares).goodput
    pool_wait = wait_for_nodes(outlook, spares)
    training_share = c.nodes / allocated_nodes  # idle spares: allocated, billed, not training

    problems: list[str] = []
    for stage in stages:
        if stage.total_gib > c.gpu_memory_gib:
            problems.append(
                f"pipeline stage {stage.stage} needs {stage.total_gib:.1f} GiB per GPU "
                f"(weights {stage.weights_bf16_gib:.1f} + grads {stage.grads_bf16_gib:.1f} + fp32 accum "
                f"{stage.grad_accum_fp32_gib:.1f} + optimizer {stage.optimizer_states_gib:.1f} + activations "
                f"{stage.activations_gib:.1f}) but a GPU has {c.gpu_memory_gib:g} GiB: raise tp or pp, "
                "lower micro_batch_size, or enable activation_checkpointing"
            )
    snapshot = snapshot_bytes / GIB
    host_needed = snapshot * c.gpus_per_node * (1 + SNAPSHOT_MARGIN)
    if cfg.checkpoint.async_save and host_needed > c.host_memory_gib:
        problems.append(
            f"checkpoint.async_save: the host snapshot needs {host_needed:.1f} GiB per node ({snapshot:.1f} GiB "
            f"per rank x {c.gpus_per_node} ranks + {SNAPSHOT_MARGIN:.0%} margin) but a node has "
            f"cluster.host_memory_gib = {c.host_memory_gib:g}: use nodes with more host memory, set "
            "checkpoint.async_save: false (synchronous saves), or raise pp or tp (less state per rank)"
        )
    if m_batches < p.pp:
        problems.append(
            f"only {m_batches} micro-batches per iteration for pp = {p.pp} stages: the pipeline never fills; "
            "raise global_batch_size or lower micro_batch_size"
        )
    problems += time_budget_problems(
        cfg,
        job_seconds=job_hours * 3600,
        save_seconds=save_seconds,
        save_source="checkpoint.save_seconds" if checkpoint_save_seconds is None else "--save-seconds",
        seconds_per_iteration=seconds,
        forward_seconds_per_iteration=forward_seconds,
        speed_source=(
            f"cluster.achieved_tflops_per_gpu = {tflops:g}"
            if achieved_tflops_per_gpu is None
            else f"--tflops {tflops:g}"
        ),
    )

    return Plan(
        parameters=parameters,
        gpus=c.gpus,
        tp=p.tp,
        pp=p.pp,
        dp=cfg.dp,
        micro_batch_size=p.micro_batch_size,
        global_batch_size=p.global_batch_size,
        micro_batches=m_batches,
        tokens_per_iteration=tokens_per_iteration,
        model_flops_per_iteration=model,
        hardware_flops_per_iteration=hardware,
        achieved_tflops_per_gpu=tflops,
        seconds_per_iteration=seconds,
        train_samples=samples,
        train_tokens=tokens,
        iterations=iterations,
        training_days=total_seconds / 86400,
        gpu_hours=gpu_hours,
        nodes=c.nodes,
        spare_nodes=spares,
        allocated_nodes=allocated_nodes,
        allocated_gpu_hours=gpu_hours / training_share,
        spare_gpu_hours=total_seconds * spares * c.gpus_per_node / 3600,
        bubble_fraction=bubble,
        stages=stages,
        max_memory_per_gpu_gib=max_memory,
        gpu_memory_gib=c.gpu_memory_gib,
        checkpoint_bytes=checkpoint_bytes(parameters),
        async_save=cfg.checkpoint.async_save,
        snapshot_gib_per_rank=snapshot,
        host_memory_needed_gib_per_node=host_needed,
        host_memory_gib=c.host_memory_gib,
        checkpoint_interval_hours=interval,
        optimal_checkpoint_interval_hours=optimal,
        job_mtbf_hours=job_mtbf,
        save_seconds=save_seconds,
        save_stall_seconds=stall_seconds,
        snapshot_gb_per_second=bandwidth,
        snapshot_seconds=snapshot_seconds,
        probe_seconds=probe_seconds,
        job_hours=job_hours,
        failures_per_job=outlook.failures_per_job,
        spares_used_per_job=outlook.spares_used_per_job,
        out_of_spares_probability=outlook.out_of_spares_probability,
        in_allocation_share=outlook.in_allocation_share,
        in_allocation_restart_hours=in_allocation_hours,
        job_restart_hours=job_restart_hours,
        mean_restart_hours=restart_hours,
        save_period_hours=period(configured),
        expected_work_lost_per_failure_hours=(
            period(configured) / 2 + min(unsealed_hours, period(configured)) + restart_hours
        ),
        eval_seconds=eval_seconds(cfg, forward_seconds),
        eval_fraction=evals,
        turnover_fraction=turnover,
        losses=losses,
        nodes_out_mean=nodes_out,
        pool_slack_nodes=spares + c.partition_extra_nodes,
        pool_wait_hours=pool_wait,
        pool_wait_goodput_cost=cycle(configured, outlook, spares, pool=False).goodput - expected,
        expected_goodput=expected,
        optimal_goodput=optimal_goodput,
        expected_goodput_allocated=expected * training_share,
        optimal_goodput_allocated=optimal_goodput * training_share,
        expected_goodput_without_spares=cycle(configured, no_spares, 0).goodput,
        problems=problems,
        adaptive_interval=cfg.checkpoint.adaptive_interval,
        restart_times_from="watchdog" if cfg.watchdog.restart_minutes is not None else "recovery",
    )


def planned_checkpoint_bytes(cfg: RunConfig) -> int | None:
    """The planner's estimate of one checkpoint's bytes, for the disk check before the first save
    (None when the layout cannot be planned: a planner problem must not stop supervision)."""
    try:
        return int(plan_run(cfg).checkpoint_bytes) or None
    except Exception:
        return None
