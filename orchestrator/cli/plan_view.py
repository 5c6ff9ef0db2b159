"""Rich rendering of a Plan for people (the `--json` form is Plan.flat())."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table

from orchestrator.plan.planner import GIB, Plan


def _si(value: float) -> str:
    for unit, scale in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.3g}"


def _allocation(plan: Plan) -> str:
    per_node = plan.gpus // plan.nodes
    if not plan.spare_nodes:
        return f"{plan.nodes} nodes, no spares (cluster.spare_nodes: 0), {plan.gpus} GPUs"
    return (
        f"{plan.nodes} nodes + {plan.spare_nodes} spares = {plan.allocated_nodes} allocated "
        f"({plan.allocated_nodes * per_node} GPUs, {plan.gpus} training)"
    )


def _gpu_hours(plan: Plan) -> str:
    text = f"{plan.allocated_gpu_hours:,.0f} allocated (billed)"
    if plan.spare_nodes:
        text += f" = {plan.gpu_hours:,.0f} training + {plan.spare_gpu_hours:,.0f} idle spares"
    return text + ", at 100% goodput"


def _save_stall(plan: Plan) -> str:
    if not plan.async_save:
        return f"{plan.save_stall_seconds:.0f} s per save (sync: training waits for the whole save)"
    probe = (
        f" + {plan.probe_seconds:.1f} s probe forward (checkpoint.verify_probe)" if plan.probe_seconds else ""
    )
    return (
        f"{plan.save_stall_seconds:.1f} s per save (async: the host snapshot, "
        f"{plan.snapshot_gib_per_rank * GIB / 1e9:.1f} GB per rank / {plan.snapshot_gb_per_second:g} GB/s "
        f"(checkpoint.snapshot_gb_per_second) = {plan.snapshot_seconds:.1f} s{probe})"
    )


def _refit(plan: Plan) -> str:
    if plan.adaptive_interval != "apply":
        return ""
    return ", re-fitted to Young/Daly during the run (checkpoint.adaptive_interval: apply)"


def _goodputs(plan: Plan, training: float, allocated: float) -> str:
    if not plan.spare_nodes:
        return f"{training:.1%}"
    return f"{training:.1%} of the training GPUs, {allocated:.1%} of the allocated GPUs"


def _failure_rows(plan: Plan) -> list[tuple[str, str]]:
    rows = [
        (
            "failures per job",
            f"{plan.failures_per_job:.2f} expected in a {plan.job_hours:g} h job "
            f"(job MTBF {plan.job_mtbf_hours:.0f} h on the {plan.gpus} training GPUs)",
        )
    ]
    priced = plan.restart_times_from == "recovery"
    job = f"{plan.job_restart_hours * 60:.0f} min ({'recovery: queue, cold start, shared load' if priced else 'watchdog.restart_minutes'})"
    if not plan.spare_nodes:
        return [
            *rows,
            (
                "restart",
                f"{1 - plan.in_allocation_share:.1%} of failures job-level through the queue, {job}: those "
                "that take a node (GPU, host), with no cluster.spare_nodes; the others in place",
            ),
        ]
    inside = f"{plan.in_allocation_restart_hours * 60:.1f} min ({'recovery: standby, nearest copy' if priced else 'watchdog.in_allocation_restart_minutes'})"
    return [
        *rows,
        (
            "spares per job",
            f"{plan.spares_used_per_job:.2f} of {plan.spare_nodes} used on average; a job runs out of spares "
            f"with probability {plan.out_of_spares_probability:.2%}",
        ),
        (
            "restart",
            f"{plan.in_allocation_share:.1%} of failures inside the job (on a spare, or in place when they "
            f"take no node), {inside}; "
            f"{1 - plan.in_allocation_share:.1%} job-level through the queue, {job}; "
            f"{plan.mean_restart_hours * 60:.1f} min on average",
        ),
    ]


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
        ("allocation", _allocation(plan)),
        ("GPU-hours", _gpu_hours(plan)),
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
        *_failure_rows(plan),
        ("save stall", _save_stall(plan)),
        (
            "checkpoint interval",
            "steps-based only"
            if plan.checkpoint_interval_hours is None
            else f"{plan.checkpoint_interval_hours:.2f} h configured{_refit(plan)}: goodput {_goodputs(plan, plan.expected_goodput, plan.expected_goodput_allocated)}",
        ),
        (
            "optimal interval (Young/Daly)",
            f"{plan.optimal_checkpoint_interval_hours:.2f} h: goodput {_goodputs(plan, plan.optimal_goodput, plan.optimal_goodput_allocated)}",
        ),
        (
            "evals and time limits",
            f"{plan.eval_fraction:.2%} of wall time in evals; {plan.turnover_fraction:.2%} in jobs that end at "
            f"their {plan.job_hours:g} h limit (final save + the next job's start)",
        ),
        (
            "wait for nodes",
            f"{plan.nodes_out_mean:.1f} nodes on probation on average (GPU and host faults); a new job waits "
            f"while over {plan.pool_slack_nodes} are (spares + cluster.partition_extra_nodes): "
            f"{plan.pool_wait_hours * 60:.1f} min a start, {plan.pool_wait_goodput_cost:.2%} of goodput",
        ),
        (
            "work lost per failure",
            f"{plan.expected_work_lost_per_failure_hours:.2f} h on average (half the "
            f"{plan.save_period_hours:.2f} h from one save to the next, + the save's stall"
            + (" and background write" if plan.async_save else "")
            + " + restart)",
        ),
    ]
    if plan.spare_nodes:
        gain = plan.expected_goodput - plan.expected_goodput_without_spares
        rows.append(
            (
                "without spares",
                f"goodput {plan.expected_goodput_without_spares:.1%} (every GPU or host failure job-level): the "
                f"{plan.spare_nodes} spares add {100 * gain:.2f} points on the training GPUs and cost "
                f"{plan.spare_nodes / plan.allocated_nodes:.1%} of the allocation",
            )
        )
    for key, value in rows:
        summary.add_row(key, value)
    console.print(summary)
    console.print(
        "goodput = useful training time / wall time. Of the training GPUs: what the model's own GPUs "
        "achieve; of the allocated GPUs: the same x nodes / (nodes + spares), idle spares are billed."
    )

    # Two-line headers and one space between columns: the eleven columns fit 80 (a one-line
    # header would be cut to "sta…" there).
    stages = Table(
        title="memory per GPU by pipeline stage (GiB)",
        box=box.SIMPLE_HEAD,
        padding=(0, 0),  # the box's space between columns is the only gap
        show_edge=False,
    )
    for header in (
        "stage",
        "layers",
        "emb",
        "params\nper GPU",
        "weights\nbf16",
        "grads\nbf16",
        "grad acc\nfp32",
        "optim\n/ dp",
        "act",
        "act, no\nrecompute",
        "total",
    ):
        stages.add_column(header, justify="right", no_wrap=True)
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
