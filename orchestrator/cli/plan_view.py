"""Rich rendering of a Plan for people (the `--json` form is Plan.flat())."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from orchestrator.planner import Plan


def _si(value: float) -> str:
    for unit, scale in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.3g}"


def print_plan(name: str, plan: Plan, console: Console | None = None) -> None:
    console = console or Console()
    summary = Table(title=f"plan: {name}", show_header=False, box=None)
    summary.add_column(style="bold")
    summary.add_column()
    rows = [
        ("parameters", f"{plan.parameters:,} ({_si(plan.parameters)})"),
        ("layout", f"tp={plan.tp} x pp={plan.pp} x dp={plan.dp} = {plan.gpus} GPUs"),
        (
            "batch",
            f"micro {plan.micro_batch_size}, global {plan.global_batch_size}, "
            f"{plan.micro_batches} micro-batches per iteration",
        ),
        ("tokens per iteration", f"{plan.tokens_per_iteration:,}"),
        ("model FLOPs / iteration", f"{plan.model_flops_per_iteration:.3e}"),
        ("hardware FLOPs / iteration", f"{plan.hardware_flops_per_iteration:.3e} (with recompute)"),
        (
            "time per iteration",
            f"{plan.seconds_per_iteration:.1f} s at {plan.achieved_tflops_per_gpu:g} TFLOPs per GPU",
        ),
        ("pipeline bubble", f"{plan.bubble_fraction:.1%}  ((pp-1)/(m+pp-1))"),
        (
            "training",
            f"{plan.train_samples:,} samples = {_si(plan.train_tokens)} tokens, "
            f"{plan.iterations:,.0f} iterations, {plan.training_days:.1f} days",
        ),
        ("GPU-hours", f"{plan.gpu_hours:,.0f}"),
        (
            "memory per GPU (max)",
            f"{plan.max_memory_per_gpu_gib:.1f} GiB of {plan.gpu_memory_gib:g} GiB",
        ),
        ("checkpoint size", f"{plan.checkpoint_bytes / 1024**4:.2f} TiB"),
        (
            "host memory per node",
            f"{plan.host_memory_needed_gib_per_node:.1f} GiB of {plan.host_memory_gib:g} GiB for the "
            f"{'async' if plan.async_save else 'async (off: sync saves)'} checkpoint snapshot "
            f"({plan.snapshot_gib_per_rank:.1f} GiB per rank)",
        ),
        (
            "checkpoint interval",
            "steps-based only"
            if plan.checkpoint_interval_hours is None
            else f"{plan.checkpoint_interval_hours:.2f} h configured, expected goodput {plan.expected_goodput:.1%}",
        ),
        (
            "optimal interval (Young/Daly)",
            f"{plan.optimal_checkpoint_interval_hours:.2f} h, goodput {plan.optimal_goodput:.1%} "
            f"(job MTBF {plan.job_mtbf_hours:.0f} h)",
        ),
        ("work lost per failure", f"{plan.expected_work_lost_per_failure_hours:.2f} h on average"),
    ]
    for key, value in rows:
        summary.add_row(key, value)
    console.print(summary)

    stages = Table(title="memory per GPU by pipeline stage (GiB)")
    for column in (
        "stage",
        "layers",
        "emb",
        "params/GPU",
        "bf16 w",
        "bf16 g",
        "fp32 acc",
        "optim/dp",
        "act",
        "act no-recompute",
        "total",
    ):
        stages.add_column(column, justify="right")
    for s in plan.stages:
        over = s.total_gib > plan.gpu_memory_gib
        stages.add_row(
            str(s.stage),
            str(s.transformer_layers),
            "yes" if s.has_embedding else "",
            _si(s.parameters_per_gpu),
            f"{s.weights_bf16_gib:.1f}",
            f"{s.grads_bf16_gib:.1f}",
            f"{s.grad_accum_fp32_gib:.1f}",
            f"{s.optimizer_states_gib:.1f}",
            f"{s.activations_gib:.1f}",
            f"{s.activations_no_recompute_gib:.1f}",
            f"[red]{s.total_gib:.1f}[/red]" if over else f"{s.total_gib:.1f}",
        )
    console.print(stages)
    if plan.problems:
        for problem in plan.problems:
            console.print(f"[bold red]does not fit:[/bold red] {problem}")
    else:
        console.print("[bold green]fits[/bold green]")
