"""`runctl metrics RUN_DIR --listen ADDR | --textfile PATH`: the run's Prometheus metrics;
`runctl metrics ROOT --all ...`: those of every run under ROOT (as `runctl ls` finds them) on one
port or in one file, each series labelled with its run's identity and run_dir.

--listen [HOST]:PORT serves /metrics until stopped (each scrape reads the run directory), on
127.0.0.1 unless HOST says otherwise: the endpoint has no authentication, and a run's metrics are
the team's business (docs/security.md). --textfile PATH writes them once, atomically, mode 0644,
for node-exporter's textfile collector (run it from cron or a systemd timer). What is exported:
orchestrator/views/prom.py.
"""

from __future__ import annotations

import argparse
import os
import time

from orchestrator.contract import RunPaths
from orchestrator.errors import EXIT_OK, UsageError


def register(subparsers: argparse._SubParsersAction) -> None:
    metrics = subparsers.add_parser(
        "metrics",
        help="Prometheus metrics of a run (HTTP endpoint or textfile)",
        description="Export the run's metrics for Prometheus, read from the run directory at every scrape: "
        "training (step, loss, tokens/s), heartbeats, the controller's passes and lock, jobs, restarts, "
        "excluded nodes, stragglers, goodput and disk. deploy/grafana/ has a dashboard and "
        "deploy/prometheus/ alert rules for them.",
    )
    metrics.add_argument("run_dir", help="run directory (with --all: a folder of runs)")
    metrics.add_argument(
        "--all",
        action="store_true",
        help="export every run under RUN_DIR (folders with a run.yaml, as `runctl ls` finds them), "
        "found again at every scrape",
    )
    where = metrics.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--listen",
        metavar="[HOST]:PORT",
        help="serve /metrics (no authentication) on PORT of 127.0.0.1: ':9464' or '9464'; give HOST to "
        "listen elsewhere, e.g. 0.0.0.0:9464 for every interface",
    )
    where.add_argument(
        "--textfile", metavar="PATH", help="write the metrics to PATH (ends in .prom) and exit"
    )
    metrics.set_defaults(func=run_metrics)


LOCALHOST = "127.0.0.1"


def parse_listen(text: str) -> tuple[str, int]:
    """(host, port) of [HOST]:PORT; no host means 127.0.0.1, never every interface."""
    host, _, port = text.rpartition(":")
    if not port.isdigit() or not 0 <= int(port) < 65536:
        raise UsageError(
            f"--listen {text!r}: give [HOST]:PORT, e.g. :9464 (127.0.0.1), or 0.0.0.0:9464 for every interface"
        )
    return host.strip("[]") or LOCALHOST, int(port)


def run_metrics(args: argparse.Namespace) -> int:
    from prometheus_client import start_http_server, write_to_textfile  # noqa: PLC0415 - lazy: +21 ms on every runctl start

    from orchestrator.views.prom import run_registry  # noqa: PLC0415 - lazy: +27 ms on every runctl start

    paths = RunPaths.of(args.run_dir)
    if args.all and not paths.root.is_dir():
        raise UsageError(f"{paths.root} is not a folder: --all exports the runs under one")
    if not args.all and not paths.config.exists():
        raise UsageError(
            f"{paths.root} is not a run directory (no run.yaml); `--all` exports every run under a folder"
        )
    registry = run_registry(paths.root, every_run=args.all)
    if args.textfile:
        if not args.textfile.endswith(".prom"):
            raise UsageError(f"--textfile {args.textfile}: node-exporter reads only files ending in .prom")
        write_to_textfile(args.textfile, registry)
        os.chmod(args.textfile, 0o644)  # node-exporter runs as its own user; the owner's umask is 027
        return EXIT_OK
    host, port = parse_listen(args.listen)
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise UsageError(f"cannot listen on {host}:{port}: {exc}; choose another port") from None
    what = f"every run under {paths.root}" if args.all else paths.root.name
    print(f"serving metrics of {what} on http://{host}:{server.server_port}/metrics", flush=True)
    while True:
        time.sleep(3600)
