"""Prometheus metrics of one run, read from its run directory at every scrape (prometheus-client).

    registry = run_registry(run_dir)      # a CollectorRegistry with one RunCollector
    start_http_server(port, addr, registry=registry) / write_to_textfile(path, registry)

Every metric carries `run`, the run's identity (its SLURM job name: the config's name and a short
hash of the run directory, render.run_job_name: two runs of one config never share a series), and
`run_dir`. `FolderCollector` exports every run under a folder (`runctl metrics ROOT --all`).
What a site alerts on, and why it is clock-safe:
- runctl_controller_passes_total and runctl_heartbeat_writes_total{rank}: counters that move
  while the controller / a rank is alive. `changes(...[5m]) == 0` needs no clock agreement
  between the exporter and the nodes; the *_age_seconds gauges beside them compare this machine's
  clock with a file's mtime or a node's beat time, for people.
- runctl_goodput_ratio{window} and runctl_time_seconds{window,category}: orchestrator.views.goodput
  (its files are parsed again only when they changed).
- runctl_disk_free_bytes / runctl_disk_next_checkpoint_bytes / runctl_disk_headroom_ratio
  (free / needed; below 1 the next save fails).
- runctl_jobs{state}: the run's jobs that have not ended, by state, from state.json (every state
  is exported, 0 included, so that `sum(runctl_jobs) == 0` says "no job" rather than nothing).
- runctl_stragglers and runctl_straggler_score{node}: the controller's last straggler scores
  (state.json, controller/stragglers.py).
- runctl_pool_usable_nodes / runctl_pool_needed_nodes / runctl_pool_short / runctl_pool_spares_next:
  the controller's last judgment of the node pool (controller/pool.py): short means the next job
  cannot start.
deploy/grafana/runctl.json has a panel for each, deploy/prometheus/runctl-alerts.yml the alerts
(tests/controller/test_oncall.py checks the dashboard's names against a scrape).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from orchestrator.contract import ContractError, JobState, RunPaths, read_heartbeats, tail_metrics
from orchestrator.contract.controller_beat import beat_file_age, read_beat
from orchestrator.contract.paths import find_runs
from orchestrator.contract.state import ControllerState, RunStatus, load_state


class RunCollector(Collector):
    def __init__(self, run_dir: str | os.PathLike[str]):
        self.paths = RunPaths.of(run_dir)
        self._cfg = None

    def _config(self):
        if self._cfg is None:
            from orchestrator.plan.config import load_config  # noqa: PLC0415

            self._cfg = load_config(self.paths.config)
        return self._cfg

    def collect(self) -> Iterator[Any]:
        from orchestrator.slurm.render import run_job_name  # noqa: PLC0415

        cfg = self._config()
        run = run_job_name(cfg.name, self.paths.root)  # the run's identity, as SLURM's job name
        now = time.time()
        for family in (
            *self._training(run),
            *self._heartbeats(run, now),
            *self._run_state(run),
            *self._goodput_metrics(run, now, cfg),
            *self._disk(run, cfg),
            *self._controller(run, now),
        ):
            yield _with_label(family, "run_dir", str(self.paths.root))

    def _training(self, run: str) -> Iterator[Any]:
        lines = tail_metrics(self.paths.metrics, 64 * 1024)
        if not lines:
            return
        last = lines[-1]
        for name, value, doc in (
            ("runctl_step", last.step, "last training step written to metrics.jsonl"),
            ("runctl_loss", last.loss, "training loss of the last step"),
            ("runctl_tokens_per_second", last.tokens_per_s, "tokens per second of the last step"),
            ("runctl_tflops_per_gpu", last.tflops_per_gpu, "model TFLOPs per GPU of the last step"),
        ):
            if value is not None:
                yield _gauge(name, doc, run, value)

    def _heartbeats(self, run: str, now: float) -> Iterator[Any]:
        age = GaugeMetricFamily(
            "runctl_heartbeat_age_seconds",
            "now (exporter clock) - the rank's beat_time (node clock): for people; alert on the writes counter",
            labels=["run", "rank", "host", "job"],
        )
        writes = CounterMetricFamily(
            "runctl_heartbeat_writes", "the rank's heartbeat sequence number (moves while it beats)",
            labels=["run", "rank", "host", "job"],
        )  # fmt: skip
        for beat in read_heartbeats(self.paths.heartbeats):
            labels = [run, str(beat.rank), beat.host, beat.job_id]
            age.add_metric(labels, max(0.0, now - beat.beat_time))
            writes.add_metric(labels, float(beat.seq))
        yield age
        yield writes

    def _run_state(self, run: str) -> Iterator[Any]:
        from orchestrator.contract.exclude import read_excluded  # noqa: PLC0415

        try:
            state = load_state(self.paths)
        except ContractError:
            state = ControllerState()
        restarts = CounterMetricFamily("runctl_restarts", "restarts the controller made", labels=["run"])
        restarts.add_metric([run], float(state.restarts))
        yield restarts
        status = GaugeMetricFamily("runctl_run_status", "1 for the run's status", labels=["run", "status"])
        for name in RunStatus:
            status.add_metric([run, name.value], 1.0 if state.status is name else 0.0)
        yield status
        excluded = read_excluded(self.paths)
        yield _gauge("runctl_excluded_nodes", "nodes on the run's exclude list", run, len(excluded))
        info = GaugeMetricFamily(
            "runctl_excluded_node", "1 per excluded node", labels=["run", "node", "reason"]
        )
        for node, why in sorted(excluded.items()):
            info.add_metric([run, node, str((why or {}).get("reason", ""))[:80]], 1.0)
        yield info
        yield _live_jobs(run, state)
        yield from _stragglers(run, state)
        yield from _pool(run, state)

    def _goodput_metrics(self, run: str, now: float, cfg: Any) -> Iterator[Any]:
        from orchestrator.views.goodput import run_breakdown  # noqa: PLC0415

        ckpt = RunPaths.of(self.paths.root, cfg.checkpoint.dir).checkpoints
        breakdown = run_breakdown(self.paths.root, now=now, checkpoints_dir=ckpt)  # files parsed once, cached
        ratio = GaugeMetricFamily(
            "runctl_goodput_ratio", "useful training / wall time", labels=["run", "window"]
        )
        seconds = GaugeMetricFamily(
            "runctl_time_seconds",
            "wall time per category (orchestrator.views.goodput)",
            labels=["run", "window", "category"],
        )
        for window, part in (("whole_run", breakdown["whole_run"]), ("24h", breakdown["last_24h"])):
            if part["goodput"] is not None:
                ratio.add_metric([run, window], part["goodput"])
            for category, value in part["seconds"].items():
                seconds.add_metric([run, window, category], value)
        yield ratio
        yield seconds

    def _disk(self, run: str, cfg: Any) -> Iterator[Any]:
        from orchestrator.contract.checkpoints import list_checkpoints  # noqa: PLC0415
        from orchestrator.contract.disk_space import check_disk  # noqa: PLC0415

        ckpt_dir = RunPaths.of(self.paths.root, cfg.checkpoint.dir).checkpoints
        complete = [c for c in list_checkpoints(ckpt_dir) if c.complete]
        # The planner's estimate is not asked for here (a scrape must stay cheap): before the first
        # checkpoint only the free space is known.
        check = check_disk(ckpt_dir, complete[-1].size_bytes if complete else None, None)
        yield _gauge("runctl_disk_free_bytes", "free bytes where the checkpoints go", run, check.free_bytes)
        if check.expected_bytes:
            yield _gauge(
                "runctl_disk_next_checkpoint_bytes", "size of the last checkpoint", run, check.expected_bytes
            )
            yield _gauge(
                "runctl_disk_headroom_ratio", "free / next checkpoint (< 1: the next save fails)", run,
                check.free_bytes / check.expected_bytes,
            )  # fmt: skip

    def _controller(self, run: str, now: float) -> Iterator[Any]:
        from orchestrator.contract.controller_lock import lock_holder  # noqa: PLC0415

        beat = read_beat(self.paths)
        passes = CounterMetricFamily(
            "runctl_controller_passes", "supervision passes (moves while alive)", labels=["run"]
        )
        passes.add_metric([run], float(beat.passes if beat else 0))
        yield passes
        age = beat_file_age(self.paths, now)
        if age is not None:
            yield _gauge(
                "runctl_controller_heartbeat_age_seconds",
                "now - mtime of controller.json (this clock)",
                run,
                age,
            )
        yield _gauge(
            "runctl_controller_failing_passes",
            "passes in a row that raised",
            run,
            beat.failing_passes if beat else 0,
        )
        yield _gauge(
            "runctl_controller_up",
            "1 when a controller holds the run's lock",
            run,
            1 if lock_holder(self.paths.root) else 0,
        )


class FolderCollector(Collector):
    """Every run under a folder (`runctl metrics ROOT --all`), found again at each scrape (a new
    run appears, a removed one goes): one family per metric, the runs' series side by side."""

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)
        self._runs: dict[Path, RunCollector] = {}

    def collect(self) -> Iterator[Any]:
        found, _capped = find_runs(self.root)
        self._runs = {run: self._runs.get(run) or RunCollector(run) for run in found}
        merged: dict[str, Any] = {}
        for collector in self._runs.values():
            try:
                families = list(collector.collect())
            except (OSError, ValueError):  # a run being written or removed: the others still count
                continue
            for family in families:
                if family.name in merged:
                    merged[family.name].samples += family.samples
                else:
                    merged[family.name] = family
        yield from merged.values()


# The states a job that has not ended can be in.
LIVE_JOB_STATES = tuple(
    s.value
    for s in (JobState.PENDING, JobState.HELD, JobState.RUNNING, JobState.COMPLETING, JobState.UNKNOWN)
)


def _live_jobs(run: str, state: ControllerState) -> GaugeMetricFamily:
    jobs = GaugeMetricFamily(
        "runctl_jobs", "the run's jobs that have not ended (state.json), by state", labels=["run", "state"]
    )
    counts = dict.fromkeys(LIVE_JOB_STATES, 0)
    for job in state.live_jobs():
        name = job.state if job.state in counts else JobState.UNKNOWN.value
        counts[name] += 1
    for name, count in counts.items():
        jobs.add_metric([run, name], float(count))
    return jobs


def _stragglers(run: str, state: ControllerState) -> Iterator[Any]:
    scores = state.stragglers or {}
    nodes = scores.get("nodes") if isinstance(scores, dict) else None
    nodes = nodes if isinstance(nodes, dict) else {}
    flagged = [n for n, v in nodes.items() if isinstance(v, dict) and v.get("straggler")]
    yield _gauge("runctl_stragglers", "nodes the controller flags as stragglers now", run, len(flagged))
    score = GaugeMetricFamily(
        "runctl_straggler_score",
        "a node's compute time per step over its peers' median or its own history (1 = typical)",
        labels=["run", "node"],
    )
    for node, values in sorted(nodes.items()):
        value = values.get("score") if isinstance(values, dict) else None
        if isinstance(value, (int, float)):
            score.add_metric([run, str(node)], float(value))
    yield score


def _pool(run: str, state: ControllerState) -> Iterator[Any]:
    """The controller's last judgment of the node pool (controller/pool.py); nothing before one."""
    pool = state.pool
    if pool is None:
        return
    yield _gauge(
        "runctl_pool_usable_nodes",
        "nodes SLURM would schedule and the run has not excluded",
        run,
        pool.usable,
    )
    yield _gauge("runctl_pool_needed_nodes", "the job's nodes (spares not counted)", run, pool.needed)
    yield _gauge(
        "runctl_pool_short", "1 when the next job cannot start: usable < needed", run, 1 if pool.short else 0
    )
    if pool.spares_next is not None:
        yield _gauge("runctl_pool_spares_next", "spare nodes the next job asks for", run, pool.spares_next)


def _with_label(family: Any, name: str, value: str) -> Any:
    family.samples = [sample._replace(labels={**sample.labels, name: value}) for sample in family.samples]
    return family


def _gauge(name: str, doc: str, run: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=["run"])
    family.add_metric([run], float(value))
    return family


def run_registry(run_dir: str | os.PathLike[str], *, every_run: bool = False) -> CollectorRegistry:
    """One run's metrics, or (`every_run`) those of every run under the folder `run_dir`."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FolderCollector(run_dir) if every_run else RunCollector(run_dir))
    return registry
