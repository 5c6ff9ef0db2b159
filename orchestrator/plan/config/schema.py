"""Typed sections of a run config. One YAML file describes one run.

Field-level checks live here (types, ranges, safe characters for anything that reaches an sbatch
script). Rules that relate several fields (tp*pp*dp == GPUs, ...) live in `rules.py`, once.
The larger sections have their own module (`checkpoint.py`, `recovery.py`, `site_options.py`), and
the value types every section uses (SafeWord, PositiveInt, ...) theirs (`value_types.py`).
Key names `cluster.nodes`, `cluster.gpus_per_node`, `parallel.tp`, `parallel.pp`, `parallel.dp`
are read by other tools: do not rename them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints, field_validator, model_validator

from orchestrator.contract.severity import NOTIFICATION_KINDS

from .checkpoint import CheckpointConfig
from .recovery import RecoveryConfig
from .section import Section
from .site_options import (
    ENV_NAME,
    SBATCH_OWNED,
    SRUN_OWNED,
    ContainerConfig,
    SbatchOptions,
    SrunOptions,
    refuse_owned,
)
from .slurm_time import SlurmTimeError, normalise_slurm_time
from .value_types import (
    ArgvItem,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    Probability,
    SafePath,
    SafeWord,
    Seconds,
    Seed,
    TimeoutSeconds,
    program_absolute_or_on_path,
)


class ClusterConfig(Section):
    nodes: PositiveInt
    gpus_per_node: PositiveInt
    gpu_memory_gib: PositiveFloat = 80.0
    # Host RAM per node (an A100 node of Jean Zay's gpu_p5: 512 GiB); bounds the async-save snapshot.
    host_memory_gib: PositiveFloat = 512.0
    gpu_peak_tflops: PositiveFloat = 312.0  # A100 bf16 dense
    # Achieved model+recompute TFLOPs per GPU that the planner assumes (BLOOM measured ~150).
    achieved_tflops_per_gpu: PositiveFloat = 150.0
    accelerator: Literal["cuda", "cpu"] = "cuda"
    partition: SafeWord | None = None
    account: SafeWord | None = None
    qos: SafeWord | None = None
    # Any SLURM form (90, 4-04:00, 100:00:00, ...), kept as HH:MM:SS (config/slurm_time.py).
    time_limit: str = "100:00:00"
    exclusive: bool = True
    cpus_per_task: PositiveInt = 8
    hint: Literal["nomultithread", "multithread", "compute_bound", "memory_bound"] | None = "nomultithread"
    # Sent by SLURM this many seconds before the time limit; the trainer saves and exits on it.
    pre_timeout_signal: Literal["USR1", "USR2", "TERM"] = "USR1"
    pre_timeout_seconds: Annotated[int, Field(ge=0, le=86400)] = 600
    # Extra `#SBATCH` options as key -> value, e.g. {constraint: "a100&ib", mail-type: "END,FAIL",
    # requeue: true}; and extra srun options on every step of the job (config/site_options.py).
    extra_sbatch: SbatchOptions = {}
    srun_args: SrunOptions = {}
    env: dict[Annotated[str, StringConstraints(pattern=ENV_NAME)], str] = {}
    # The interpreter that runs `-m trainer` on the compute nodes (a venv's python, usually; inside
    # the image with a `container:`). A venv's bin/python is used as written, never resolved.
    python: SafePath = "python3"
    # What every rank runs, as an argv list (no shell: each word is quoted into the job script).
    # Default: our trainer, `<python> -m trainer RUN_DIR`. Any other training loop that calls the
    # client (orchestrator.contract.client) finds the run directory in $RUNCTL_RUN_DIR; see
    # docs/own_training_loop.md. `python` stays the interpreter with this package on the nodes
    # (health check, probe job). Such a loop gets no warm standby: a relaunch on a spare inside
    # the job is a cold start of a new step.
    command: Annotated[list[ArgvItem], Field(min_length=1, max_length=64)] | None = None
    # Who starts the ranks: `rank` (srun starts one task per GPU, each task is one rank running
    # `command`), or `node` (srun starts one task per node and `command` starts the node's
    # gpus_per_node ranks itself, as `torchrun --nproc-per-node` does; torchrun's own variables
    # PET_NNODES, PET_NODE_RANK, PET_NPROC_PER_NODE, PET_MASTER_ADDR/PORT are set for it).
    command_per: Literal["rank", "node"] = "rank"
    # The interpreter that runs the job launcher on the batch node, outside any container (it needs
    # only the orchestrator). Default: `python`. Required with a `container:`.
    launcher_python: SafePath | None = None
    # Failures per GPU-hour drive the checkpoint-interval optimisation (BLOOM: 1-2 a week on 384 GPUs).
    gpu_mtbf_hours: PositiveFloat = 50000.0
    # Nodes allocated beside `nodes` and kept idle: a failed node is replaced by one inside the
    # same job (a new srun step, no queue wait) while spares last (BLOOM kept 4 beside its 48).
    # 0: every failure is a job-level restart through the queue.
    spare_nodes: Annotated[int, Field(ge=0, le=64)] = 0
    # Nodes of the partition the run's jobs may use beyond nodes + spare_nodes: they stand in for
    # nodes out of service (on probation after a fault, or DOWN) before a new job has to wait for
    # them (the planner's pool wait, orchestrator/plan/pool_wait.py). Default 8: an assumption, no
    # published figure; the simulated month's pool (simulation/soak.py) reads it from here. Set it
    # to your partition's size less nodes + spare_nodes.
    partition_extra_nodes: Annotated[int, Field(ge=0, le=4096)] = 8
    # The site's set-up, run by the job script before the launcher: one command per item, each an
    # argv list whose words are shell-quoted (e.g. [["module", "load", "cuda/12.4"],
    # ["source", "/opt/venvs/bloom/bin/activate"]]). Never a shell line: a config value is a word.
    setup: Annotated[
        list[Annotated[list[ArgvItem], Field(min_length=1, max_length=64)]], Field(max_length=32)
    ] = []

    @field_validator("time_limit")
    @classmethod
    def _slurm_time(cls, value: str) -> str:
        try:
            return normalise_slurm_time(value)
        except SlurmTimeError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("command")
    @classmethod
    def _command_program_absolute_or_on_path(cls, command: list[str] | None) -> list[str] | None:
        return program_absolute_or_on_path(command)

    @field_validator("extra_sbatch")
    @classmethod
    def _sbatch_options_not_owned(cls, options: dict) -> dict:
        return refuse_owned(options, SBATCH_OWNED, "cluster.extra_sbatch")

    @field_validator("srun_args")
    @classmethod
    def _srun_options_not_owned(cls, options: dict) -> dict:
        return refuse_owned(options, SRUN_OWNED, "cluster.srun_args")

    @field_validator("env")
    @classmethod
    def _env_values_printable(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            if name == "TRAINER_FAULT":  # test-only (trainer/faults.py): never from a run config
                raise ValueError(
                    "env.TRAINER_FAULT: fault injection is set by a test's environment, not a config"
                )
            if not isinstance(value, str):
                raise ValueError(f"env.{name}: value must be a string (quote it in YAML), got {value!r}")
            if any(ch in value for ch in "\n\r\x00"):
                raise ValueError(f"env.{name}: value must be one line without NUL or newline, got {value!r}")
        return env

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


class ModelConfig(Section):
    num_layers: PositiveInt
    hidden_size: PositiveInt
    num_attention_heads: PositiveInt
    seq_length: PositiveInt
    vocab_size: PositiveInt  # the tokenizer's vocabulary
    # Megatron pads the vocabulary to a multiple of make_vocab_size_divisible_by * tp so that the
    # vocab-parallel embedding splits evenly. Given explicitly (BLOOM: 250880) it is checked.
    padded_vocab_size: PositiveInt | None = None
    make_vocab_size_divisible_by: PositiveInt = 128
    ffn_hidden_size: PositiveInt | None = None  # default 4 * hidden_size
    alibi: bool = True
    embedding_layernorm: bool = True
    tied_embeddings: Literal[True] = True
    init_std: PositiveFloat = 0.02
    layernorm_epsilon: PositiveFloat = 1e-5
    dtype: Literal["bf16", "fp32"] = "bf16"
    hidden_dropout: Probability = 0.0
    attention_dropout: Probability = 0.0
    # Which fused-kernel path the model uses; env BLOOM_KERNELS overrides.
    kernels: Literal["auto", "reference", "triton"] = "auto"
    # Attention: materialized builds the s x s scores; chunked (CPU) and the flash Triton kernel
    # (GPU) never do, so memory grows linearly with the sequence. auto follows the kernel path.
    # env BLOOM_ATTENTION overrides.
    attention: Literal["auto", "materialized", "chunked"] = "auto"

    @property
    def ffn_size(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def padded_vocab(self, tp: int) -> int:
        if self.padded_vocab_size is not None:
            return self.padded_vocab_size
        multiple = self.make_vocab_size_divisible_by * tp
        return -(-self.vocab_size // multiple) * multiple


class RampupConfig(Section):
    """Megatron's --rampup-batch-size START INCREMENT SAMPLES."""

    start: PositiveInt
    increment: PositiveInt
    samples: PositiveInt


class ParallelConfig(Section):
    tp: PositiveInt = 1
    pp: PositiveInt = 1
    dp: PositiveInt | None = None  # derived from the GPU count when omitted
    micro_batch_size: PositiveInt = 1
    global_batch_size: PositiveInt
    rampup: RampupConfig | None = None
    activation_checkpointing: bool = True
    partition_method: Annotated[
        str, StringConstraints(pattern=r"^(parameters|uniform|type:[A-Za-z_|]+)$")
    ] = "type:transformer|embedding"
    zero_stage: Literal[1] = 1


class OptimizerConfig(Section):
    lr: PositiveFloat
    min_lr: NonNegativeFloat = 0.0
    adam_beta1: Probability = 0.9
    adam_beta2: Probability = 0.999
    adam_eps: PositiveFloat = 1e-8
    weight_decay: NonNegativeFloat = 0.0
    clip_grad: NonNegativeFloat = 1.0
    warmup_samples: Annotated[int, Field(ge=0)] = 0
    decay_samples: PositiveInt | None = None  # default: the training samples
    decay_style: Literal["cosine", "linear", "constant"] = "cosine"
    # BLOOM had to split optimizer groups: no flat fp32 buffer bigger than this many parameters.
    max_group_params: PositiveInt = 1_000_000_000

    @model_validator(mode="after")
    def _min_lr_below_lr(self) -> OptimizerConfig:
        if self.min_lr > self.lr:
            raise ValueError(f"min_lr ({self.min_lr}) must not exceed lr ({self.lr})")
        return self


class DatasetEntry(Section):
    path: SafePath  # prefix of <path>.bin / <path>.idx, relative to the config file or absolute
    weight: PositiveFloat = 1.0


class DataConfig(Section):
    datasets: list[DatasetEntry] = Field(min_length=1)
    tokenizer: SafePath
    split: Annotated[str, StringConstraints(pattern=r"^\d+(\.\d+)?(,\d+(\.\d+)?){0,2}$")] = "949,50,1"
    train_samples: PositiveInt | None = None
    train_tokens: PositiveInt | None = None
    seed: Seed = 1234
    eval_interval: PositiveInt = 1000
    eval_iters: Annotated[int, Field(ge=0)] = 5
    log_interval: PositiveInt = 1

    @model_validator(mode="after")
    def _exactly_one_length(self) -> DataConfig:
        if (self.train_samples is None) == (self.train_tokens is None):
            raise ValueError("give exactly one of train_samples or train_tokens")
        return self


class ProgressFloors(Section):
    """Per phase, the least time without a progress mark (contract.Mark) that counts as a hang,
    whatever the learned gaps (controller/timeouts.py). Exiting saves a final checkpoint: it uses
    `checkpoint`."""

    init: TimeoutSeconds = 120.0
    step: TimeoutSeconds = 120.0
    checkpoint: TimeoutSeconds = 120.0
    eval: TimeoutSeconds = 120.0


class WatchdogConfig(Section):
    heartbeat_seconds: Seconds = 10.0
    poll_seconds: Seconds = 5.0
    # A rank whose beat is older than this is dead (crash, lost node).
    dead_after_seconds: TimeoutSeconds = 60.0
    # A storage stall freezes a node's writes (its heartbeat file too) for minutes while the node is
    # fine: up to this long, silence is not death when it cannot be a lost node: every node of the
    # job silent at once (the filesystem; were the nodes lost, SLURM would end the job NODE_FAIL),
    # or one node silent while its peers still progress (ranks of a lost node hold up the next
    # collective within seconds). 0: no such tolerance (dead_after_seconds always decides).
    stall_tolerance_seconds: Annotated[float, Field(ge=0.0, le=86400.0)] = 900.0
    # Per phase, the hang limit while no rank of the job has reported a gap between two progress
    # marks for that phase (the start of a launch; a trainer that does not mark progress).
    init_timeout_seconds: TimeoutSeconds = 1800.0
    step_timeout_seconds: TimeoutSeconds = 600.0
    checkpoint_timeout_seconds: TimeoutSeconds = 3600.0
    eval_timeout_seconds: TimeoutSeconds = 1800.0
    # Once marks are reported: a rank hangs when it has made no mark for
    # min(progress_cap_seconds, max(progress_floor_seconds[phase], progress_factor x the longest
    # gap between two marks any rank of the launch reported for that phase)). The cap must be above
    # the longest honest stretch without a mark (the rendezvous before a load): ranks still in it
    # when the first ones report it would otherwise look hung.
    progress_floor_seconds: ProgressFloors = ProgressFloors()
    progress_factor: Annotated[float, Field(ge=1.0, le=100.0)] = 3.0
    progress_cap_seconds: TimeoutSeconds = 900.0
    max_restarts_without_progress: PositiveInt = 3
    # A restart counts towards that crash loop only when the job it replaces failed before training
    # this long after its resume (or at the very step of the failure before): a failure later than
    # that, at another step, is a fault like any other (at 10x the published rate, a third of the
    # simulated months stopped on 3 honest faults between two saves), while a bug fails early or at
    # one step every time.
    crash_loop_training_minutes: Annotated[float, Field(ge=0.0, le=10080.0)] = 30.0
    # One incident (one failure detection) excludes at most this many nodes: when more look bad at
    # once, the job, the filesystem or the network is suspected, not N nodes.
    max_excluded_per_incident: PositiveInt = 2
    # Expected minutes from a failure to training again through the queue (detect + queue + start +
    # load), for the planner. None: priced from `recovery:` (orchestrator/plan/restart_paths.py).
    restart_minutes: PositiveFloat | None = None
    # Straggler detection (controller/stragglers.py): a node whose compute time per step is at
    # least this many times its peers' median (or its own history) for straggler_seconds is a
    # straggler: an event and a notification; straggler_exclude also excludes it from the next job.
    straggler_threshold: Annotated[float, Field(gt=1.0, le=10.0)] = 1.2
    straggler_seconds: TimeoutSeconds = 600.0
    straggler_exclude: bool = False
    # Expected minutes from a failure to training again when a spare node takes over inside the
    # same job (cluster.spare_nodes; no queue wait, a warm standby), for the planner. None: priced
    # from `recovery:` (the standby's start, the load from the nearest copy).
    in_allocation_restart_minutes: PositiveFloat | None = None
    # With spares: how long the job's launcher waits for the controller's decision after a failed
    # launch before it ends the job (a job-level restart then follows). Covers a few slow passes
    # (poll_seconds each, squeue timing out) but not a dead controller: idle GPUs cost more.
    relaunch_decision_seconds: TimeoutSeconds = 120.0

    @model_validator(mode="after")
    def _cap_over_floors(self) -> WatchdogConfig:
        floors = self.progress_floor_seconds
        low = {name: getattr(floors, name) for name in ProgressFloors.model_fields}
        over = {name: value for name, value in low.items() if value > self.progress_cap_seconds}
        if over:
            name, value = next(iter(over.items()))
            raise ValueError(
                f"watchdog.progress_floor_seconds.{name} = {value:g} is above progress_cap_seconds = "
                f"{self.progress_cap_seconds:g}: a learned hang limit would be both at least the floor and at "
                f"most the cap. Raise progress_cap_seconds to at least {max(over.values()):g} or lower the floor"
            )
        # A rank's marks reach the controller once a beat, seen at the next pass: a limit under
        # two of those would call a working rank hung.
        least = 2 * (self.heartbeat_seconds + self.poll_seconds)
        name, value = min(low.items(), key=lambda item: item[1])
        if value < least:
            raise ValueError(
                f"watchdog.progress_floor_seconds.{name} = {value:g} is under 2 x (heartbeat_seconds + poll_seconds) = "
                f"{least:g}: progress is seen once a beat, so a working rank would look hung. Set it to at "
                f"least {least:g}"
            )
        return self


class ExclusionsConfig(Section):
    """How excluded nodes heal and what a pool too small for the job does (docs/oncall.md)."""

    # An exclusion is a probation: the node comes back by itself after this many hours (or at
    # `runctl nodes --clear`): long enough for an admin to look at it over a weekend, short enough
    # that a wrong exclusion heals by itself.
    probation_hours: Annotated[float, Field(gt=0, le=24 * 365)] = 72.0
    # A node whose beats stopped for at least stall_seconds and came back while its job lived
    # stalled (storage, swap): recorded, and excluded only at the stall_limit-th stall within
    # stall_window_hours. stall_seconds None: 3 x watchdog.heartbeat_seconds.
    stall_seconds: TimeoutSeconds | None = None
    stall_limit: PositiveInt = 3
    stall_window_hours: PositiveFloat = 24.0
    # When exclusions, down, drained and reserved nodes leave fewer than the job needs (nodes +
    # spare_nodes): always a critical event and notification; `wait` keeps every probation (the
    # job pends until nodes return), `release_oldest` releases the oldest probations until it fits.
    # Either way the controller's own probations never leave the partition fewer nodes than the
    # job: SLURM refuses such a job instead of queueing it (controller/refusal.py).
    on_pool_short: Literal["wait", "release_oldest"] = "wait"


# One argv item of health_check.command: printable, one line (it is never given to a shell).


class HealthCheckConfig(Section):
    """`python -m trainer.health`, run on every allocated node before the trainer starts
    (docs/oncall.md, "Node health checks"): a node that fails is excluded and replaced by a spare."""

    enabled: bool = True
    min_free_memory_gib: NonNegativeFloat = 4.0  # MemAvailable of /proc/meminfo
    # The whole check, all-reduce included; a node that cannot join within it is named. At least
    # 30 s: importing torch alone takes seconds (more from a shared filesystem or a loaded node).
    timeout_seconds: Annotated[float, Field(ge=30.0, le=3600.0)] = 180.0
    # With more than one GPU per node, every NVLink link must be up (false for PCIe-only nodes).
    require_nvlink: bool = True
    # A site's own check as an argv list (no shell), replacing the built-in node checks (the
    # all-reduce still runs): exit 0 = healthy, else the tail of its stderr is the reason.
    command: Annotated[list[ArgvItem], Field(min_length=1, max_length=64)] | None = None

    @field_validator("command")
    @classmethod
    def _program_absolute_or_on_path(cls, command: list[str] | None) -> list[str] | None:
        return program_absolute_or_on_path(command)


HealthPolicy = Literal["notify", "pause", "rollback"]


class HealthPolicies(Section):
    """What the controller does on each finding (orchestrator/contract/training_health.py): notify (an event
    and a notification), pause (a graceful stop, like the kill switch) or rollback (a graceful stop,
    then a resume from the checkpoint before the onset with an exact data skip)."""

    loss_spike: HealthPolicy = "notify"
    grad_norm_explosion: HealthPolicy = "notify"
    skip_storm: HealthPolicy = "notify"
    divergence: HealthPolicy = "notify"


class HealthConfig(Section):
    """Training health: the rules of orchestrator/contract/training_health.py over metrics.jsonl. The
    defaults find what large runs lost time to without flagging a healthy curve (its tests)."""

    enabled: bool = True
    # Loss spike: loss above its trend (a robust local line from the `spike_window` steps before it,
    # orchestrator/contract/robust_trend.py) by more than spike_mad_k spreads of the step-to-step noise (1.4826
    # x the MAD of the window's first differences / sqrt(2)) and by at least spike_min_rise (a
    # noiseless curve must not alarm on rounding), for spike_consecutive steps.
    spike_window: Annotated[int, Field(ge=10, le=100_000)] = 100
    spike_mad_k: Annotated[float, Field(ge=1.0, le=100.0)] = 5.0
    spike_min_rise: NonNegativeFloat = 0.1
    spike_consecutive: Annotated[int, Field(ge=1, le=1000)] = 3
    # Grad-norm explosion: log grad norm above its trend (the resistant line of the window before it)
    # by more than log(grad_norm_factor) and grad_norm_mad_k residual spreads, for grad_norm_consecutive steps.
    grad_norm_window: Annotated[int, Field(ge=10, le=100_000)] = 100
    grad_norm_factor: Annotated[float, Field(gt=1.0, le=1e6)] = 10.0
    grad_norm_mad_k: Annotated[float, Field(ge=1.0, le=100.0)] = 6.0
    grad_norm_consecutive: Annotated[int, Field(ge=1, le=1000)] = 2
    # NaN/Inf storm: more than skip_storm_max steps skipped (non-finite gradients) in skip_storm_window steps.
    skip_storm_window: Annotated[int, Field(ge=1, le=100_000)] = 100
    skip_storm_max: Annotated[int, Field(ge=0, le=100_000)] = 5
    # Slow divergence: the resistant line of the last divergence_window steps (through the medians of
    # their older and newer halves) rises by more than divergence_min_rise over the window.
    divergence_window: Annotated[int, Field(ge=20, le=1_000_000)] = 1000
    divergence_min_rise: PositiveFloat = 0.05
    policy: HealthPolicies = HealthPolicies()
    # A rollback resumes from the newest verified checkpoint at least rollback_margin_steps before
    # the onset, and skips the samples from that checkpoint to the onset plus rollback_skip_margin_batches
    # global batches after it (PaLM: ~100 steps back, 200-500 batches skipped).
    rollback_margin_steps: Annotated[int, Field(ge=0, le=1_000_000)] = 100
    rollback_skip_margin_batches: Annotated[int, Field(ge=0, le=1_000_000)] = 100
    # The LR after a rollback: scaled by lr_scale for lr_scale_steps steps (1.0: unchanged).
    lr_scale: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    lr_scale_steps: Annotated[int, Field(ge=0, le=10_000_000)] = 0
    # At most rollback_budget automatic rollbacks in rollback_budget_hours; beyond, the run is paused
    # and a person is called (a spike that comes back after every rollback must not loop).
    rollback_budget: Annotated[int, Field(ge=0, le=1000)] = 3
    rollback_budget_hours: PositiveFloat = 24.0

    @model_validator(mode="after")
    def _lr_scale_has_steps(self) -> HealthConfig:
        if self.lr_scale != 1.0 and self.lr_scale_steps == 0:
            raise ValueError(
                f"lr_scale = {self.lr_scale} needs lr_scale_steps > 0 (how many steps the cut lasts)"
            )
        return self


class OperatorsConfig(Section):
    group: SafeWord | None = None
    users: list[SafeWord] = []


AppriseUrl = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9+.\-]*://\S+$", max_length=2048)]


class NotificationsConfig(Section):
    # Routing by severity (orchestrator/contract/severity.py: page, chat or info per kind).
    # apprise URLs (orchestrator/controller/notify.py): slack://..., msteams://..., pagerduty://..., mailtos://...
    # `urls` get every notification; `runctl submit` checks that apprise knows each one.
    urls: list[AppriseUrl] = []
    # Pages only: the run stopped on its own or cannot go on (crash loop, config error, paused for
    # health, pool short, disk full, doctor's problems). E.g. pagerduty://...
    page: list[AppriseUrl] = []
    # Chat and pages: what the controller handled (failures restarted, hangs, stragglers) too.
    chat: list[AppriseUrl] = []
    # The kinds sent at all; each kind's severity decides where it goes.
    events: list[Literal[NOTIFICATION_KINDS]] = list(NOTIFICATION_KINDS)  # type: ignore[valid-type]
    timeout_seconds: Seconds = 10.0


class RunConfig(Section):
    name: SafeWord
    seed: Seed = 42
    cluster: ClusterConfig
    model: ModelConfig
    parallel: ParallelConfig
    optimizer: OptimizerConfig
    data: DataConfig
    checkpoint: CheckpointConfig = CheckpointConfig()
    watchdog: WatchdogConfig = WatchdogConfig()
    exclusions: ExclusionsConfig = ExclusionsConfig()
    operators: OperatorsConfig = OperatorsConfig()
    notifications: NotificationsConfig = NotificationsConfig()
    health_check: HealthCheckConfig = HealthCheckConfig()
    health: HealthConfig = HealthConfig()
    recovery: RecoveryConfig = RecoveryConfig()
    # pyxis/enroot: every srun step of the job runs in this image (config/site_options.py).
    container: ContainerConfig | None = None

    # Derived quantities: computed here once so that no caller re-derives them differently.
    @property
    def world_size(self) -> int:
        return self.cluster.gpus

    @property
    def dp(self) -> int:
        if self.parallel.dp is not None:
            return self.parallel.dp
        return max(1, self.world_size // (self.parallel.tp * self.parallel.pp))

    @property
    def padded_vocab_size(self) -> int:
        return self.model.padded_vocab(self.parallel.tp)

    @property
    def micro_batches(self) -> int:
        """Gradient-accumulation steps = pipeline micro-batches at the full global batch."""
        return self.parallel.global_batch_size // (self.parallel.micro_batch_size * self.dp)

    @property
    def train_samples(self) -> int:
        if self.data.train_samples is not None:
            return self.data.train_samples
        assert self.data.train_tokens is not None
        return -(-self.data.train_tokens // self.model.seq_length)

    @property
    def decay_samples(self) -> int:
        return self.optimizer.decay_samples or self.train_samples
