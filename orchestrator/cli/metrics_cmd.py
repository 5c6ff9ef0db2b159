"""`runctl metrics RUN_DIR --listen ADDR | --textfile PATH`: the run's Prometheus metrics.

--listen HOST:PORT serves /metrics until stopped (each scrape reads the run directory);
--textfile PATH writes them once, atomically, for node-exporter's textfile collector (run it from
cron or a systemd timer). What is exported: orchestrator/prom.py.
"""

from __future__ import annotations

import argparse
import time

from orchestrator.errors import EXIT_OK, UsageError


def register(subparsers: argparse._SubParsersAction) -> None:
    metrics = subparsers.add_parser("metrics", help="Prometheus metrics of a run (HTTP endpoint or textfile)")
    metrics.add_argument("run_dir", help="run directory")
    where = metrics.add_mutually_exclusive_group(required=True)
    where.add_argument("--listen", metavar="HOST:PORT", help="serve /metrics here, e.g. 127.0.0.1:9464")
    where.add_argument(
        "--textfile", metavar="PATH", help="write the metrics to PATH (ends in .prom) and exit"
    )
    metrics.set_defaults(func=run_metrics)


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise UsageError(
            f"--listen {text!r}: give HOST:PORT, e.g. 127.0.0.1:9464 (0.0.0.0:9464 for every interface)"
        )
    return host.strip("[]") or "0.0.0.0", int(port)  # noqa: S104 - the operator chose to listen everywhere


def run_metrics(args: argparse.Namespace) -> int:
    from prometheus_client import start_http_server, write_to_textfile  # noqa: PLC0415

    from orchestrator.prom import run_registry  # noqa: PLC0415
    from orchestrator.protocol import RunPaths  # noqa: PLC0415

    paths = RunPaths.of(args.run_dir)
    if not paths.config.exists():
        raise UsageError(f"{paths.root} is not a run directory (no run.yaml)")
    registry = run_registry(paths.root)
    if args.textfile:
        if not args.textfile.endswith(".prom"):
            raise UsageError(f"--textfile {args.textfile}: node-exporter reads only files ending in .prom")
        write_to_textfile(args.textfile, registry)
        return EXIT_OK
    host, port = parse_listen(args.listen)
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise UsageError(f"cannot listen on {host}:{port}: {exc}; choose another port") from None
    print(f"serving metrics of {paths.root.name} on http://{host}:{server.server_port}/metrics", flush=True)
    while True:
        time.sleep(3600)
