"""`runctl preprocess | convert | export-hf | eval RUN_DIR ...`: a run's auxiliary work as a SLURM
job (submitit), on the run's partition and account, or here with --local; the command waits for
the end and records it in events.jsonl (orchestrator/operate/auxjobs.py). Exit 0 when the job succeeded,
1 when it failed (its log is named), as for any other command otherwise.
"""

from __future__ import annotations

import argparse
import json
import os

from orchestrator.contract import RunPaths
from orchestrator.contract.events import read_events
from orchestrator.errors import EXIT_OK

HELP = {
    "preprocess": "tokenise JSONL/text files into an indexed dataset (.bin/.idx), as a job",
    "convert": "convert a checkpoint to a universal one (resume on another tp/pp/dp), as a job",
    "export-hf": "export a checkpoint to a transformers BloomForCausalLM directory, as a job",
    "eval": "loss and perplexity of a checkpoint on the run's validation samples, as a job",
}


def register(subparsers: argparse._SubParsersAction) -> None:
    for kind, text in HELP.items():
        cmd = subparsers.add_parser(
            kind,
            help=text,
            description=f"{text[0].upper()}{text[1:]}: a SLURM job on the run's partition and account "
            "(submitit), or on this host with --local. Waits for the end, records it in events.jsonl, and "
            "exits 1 (naming the job's log) when the job failed.",
        )
        cmd.add_argument("run_dir", help="run directory (its run.yaml gives partition, account, python, env)")
        if kind == "preprocess":
            cmd.add_argument(
                "--input", nargs="+", required=True, help="JSONL (.jsonl/.json[.gz]) or text files"
            )
            cmd.add_argument("--output-prefix", required=True, help="writes <prefix>.bin and <prefix>.idx")
            cmd.add_argument("--tokenizer", help="tokenizer.json (default: data.tokenizer of the run)")
            cmd.add_argument(
                "--workers", type=int, help="tokenising processes (default: cluster.cpus_per_task)"
            )
            cmd.add_argument("--json-key", default="text", help="field of each JSONL record holding the text")
        else:
            cmd.add_argument("--step", type=int, help="the checkpoint's step (default: the latest)")
        if kind == "convert":
            cmd.add_argument(
                "--overwrite", action="store_true", help="replace an existing universal checkpoint"
            )
        if kind == "export-hf":
            cmd.add_argument("--out", required=True, help="output directory (transformers save_pretrained)")
            cmd.add_argument("--vocab-size", type=int, help="trim the padded vocabulary to this many rows")
        cmd.add_argument(
            "--local",
            action="store_true",
            help="run on this host (submitit's LocalExecutor: a subprocess, same files and events)",
        )
        cmd.add_argument(
            "--time-min", type=int, default=60, help="the job's time limit in minutes (default 60)"
        )
        cmd.add_argument("--reason", default="", help="why (goes to the event and the audit trail)")
        cmd.add_argument("--json", action="store_true", help="print the outcome as JSON")
        cmd.set_defaults(func=run_aux_command, kind=kind)


def task_kwargs(args: argparse.Namespace) -> dict:
    """The task's arguments: plain values, paths absolute (the job may start in another folder)."""
    if args.kind == "preprocess":
        from orchestrator.operate.runs import load_run_config  # noqa: PLC0415 - lazy: +41 ms on every runctl start

        cfg = load_run_config(args.run_dir)
        return {
            "inputs": [os.path.abspath(p) for p in args.input],
            "output_prefix": os.path.abspath(args.output_prefix),
            "tokenizer": os.path.abspath(args.tokenizer or cfg.data.tokenizer),
            "workers": args.workers or cfg.cluster.cpus_per_task,
            "json_key": args.json_key,
        }
    kwargs = {"run_dir": os.path.abspath(args.run_dir), "step": args.step}
    if args.kind == "convert":
        kwargs["overwrite"] = args.overwrite
    if args.kind == "export-hf":
        kwargs.update(output=os.path.abspath(args.out), vocab_size=args.vocab_size)
    return kwargs


def run_aux_command(args: argparse.Namespace) -> int:
    from orchestrator.operate.auxjobs import AuxJobFailed, run_aux  # noqa: PLC0415 - lazy: +7 ms on every runctl start

    def submitted(aux) -> None:
        if not args.json:
            where = "here (--local)" if aux.where == "local" else "on SLURM"
            print(f"{args.kind}: job {aux.job_id} {where}; log {aux.log}", flush=True)

    try:
        outcome = run_aux(
            args.run_dir,
            args.kind,
            task_kwargs(args),
            local=args.local,
            time_minutes=args.time_min,
            reason=args.reason,
            on_submitted=submitted,
        )
    except AuxJobFailed:
        if args.json:
            print(json.dumps(read_events(RunPaths.of(args.run_dir).events, last=1)[0].to_dict(), default=str))
        raise
    if args.json:
        print(json.dumps(outcome.__dict__, default=str))
        return EXIT_OK
    result = outcome.result or {}
    print(
        f"{args.kind}: job {outcome.job_id} finished in {outcome.seconds:.1f} s: "
        + ", ".join(f"{k}={v}" for k, v in result.items())
    )
    return EXIT_OK
