"""On-call tooling on real processes (fake-trainer ranks, a real controller, real HTTP):
the controller's own heartbeat and `runctl doctor`; `runctl metrics` scraped over HTTP and parsed
with prometheus_client's parser; NCCL flight-recorder dumps collected next to the stacks."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from fakes import REPO, supervise
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.cli.main import main
from orchestrator.contract import RunPaths, atomic_write_text
from orchestrator.contract.state import RunStatus
from orchestrator.controller.stacks import collect_stacks
from orchestrator.slurm.render import render_sbatch
from tests.run_records import event_dicts


@pytest.fixture
def webhook():
    """A real HTTP server that records what the notifications POST (an apprise json:// URL)."""
    received: list[dict] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"json://127.0.0.1:{server.server_port}/hook", received
    server.shutdown()


def _doctor(capsys, run_dir, state_dir, *extra):
    code = main(["doctor", str(run_dir), "--state-dir", str(state_dir), "--json", *extra])
    return code, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_doctor_pages_when_the_controller_stops_beating(run_env, webhook, monkeypatch, capsys, tmp_path):
    url, received = webhook
    cfg, scheduler, ctl = run_env(
        trainer_env={"FAKE_STEPS": "400"}, notifications={"urls": [url], "events": ["failure", "doctor"]}
    )
    monkeypatch.setattr("orchestrator.cli.watch_cmd.scheduler_for_run", lambda _run: scheduler)
    ctl.start()
    supervise(ctl, until=lambda c: c.state.status == RunStatus.RUNNING)
    beat = json.loads(ctl.paths.controller_heartbeat.read_text())
    assert beat["pid"] == os.getpid() and beat["passes"] >= 1 and beat["status"] == "running"
    state_dir = tmp_path / "doctor"
    code, first = _doctor(capsys, ctl.paths.root, state_dir, "--stale-after", "1.0")
    print(first)
    assert code == 0 and all(f["ok"] for f in first["findings"])
    ctl.tick()  # alive: the counter moves between two looks
    time.sleep(1.2)
    assert _doctor(capsys, ctl.paths.root, state_dir, "--stale-after", "1.0")[0] == 0
    # The controller stops passing (as if killed): the next look past the threshold is stale.
    time.sleep(1.2)
    code, stale = _doctor(capsys, ctl.paths.root, state_dir, "--stale-after", "1.0")
    print(stale)
    controller = stale["findings"][0]
    assert code == 1 and not controller["ok"] and "has not moved" in controller["message"]
    assert len(received) == 1 and "stale" in received[0]["message"]  # apprise's JSON POST
    assert _doctor(capsys, ctl.paths.root, state_dir, "--stale-after", "1.0")[0] == 1
    assert len(received) == 1  # the same problem is not paged again from every cron run
    # The job disappears while the run should be training: a second problem, paged.
    scheduler.cancel([ctl.state.jobs[-1].job_id])
    time.sleep(0.5)
    code, jobless = _doctor(capsys, ctl.paths.root, state_dir, "--stale-after", "1.0", "--grace", "0")
    print(jobless)
    assert code == 1 and not jobless["findings"][1]["ok"] and "no job of it is queued or running" in jobless["findings"][1]["message"]
    assert len(received) == 2
    # A disk that cannot hold the next checkpoint is the third problem.
    free = type("Usage", (), {"free": 0})()  # nothing fits, whether the size comes from a save or the planner
    monkeypatch.setattr("orchestrator.contract.disk_space.shutil.disk_usage", lambda _path: free)
    code, full = _doctor(capsys, ctl.paths.root, state_dir, "--stale-after", "1.0", "--grace", "0")
    print(full)
    assert code == 1 and not full["findings"][2]["ok"] and "disk critical" in full["findings"][2]["message"]
    assert len(received) == 3


@pytest.mark.parametrize("status", ["crash_loop", "config_error", "paused_for_health", "killed"])
def test_doctor_fails_on_a_run_that_stopped_on_its_own(tmp_path, monkeypatch, capsys, status):
    """A crash-looped run looks quiet (no controller needed, no job expected): the doctor still
    says a person must look, and exits 1; a kill an operator asked for is fine."""
    run_dir = tmp_path / "run"
    monkeypatch.setenv("RUNCTL_SCHEDULER", "mock")
    monkeypatch.setenv("RUNCTL_MOCK_SLURM_DIR", str(tmp_path / "mock"))
    assert main(["submit", str(REPO / "configs" / "demo-cpu-4node.yaml"), "--run-dir", str(run_dir)]) == 0
    (run_dir / "state.json").write_text(json.dumps({"status": status, "jobs": []}))
    code, found = _doctor(capsys, run_dir, tmp_path / "d")
    stop = next(f for f in found["findings"] if f["check"] == "stop")
    print(found)
    if status == "killed":
        assert code == 0 and stop["ok"]
    else:
        assert code == 1 and not stop["ok"] and f"stopped on its own ({status})" in stop["message"]


def test_doctor_restarts_a_missing_controller_for_the_owner(tmp_path):
    env = {**os.environ, "RUNCTL_SCHEDULER": "mock", "RUNCTL_MOCK_SLURM_DIR": str(tmp_path / "mock"),
           "PYTHONPATH": str(REPO)}  # fmt: skip
    run_dir = tmp_path / "run"
    runctl = [sys.executable, "-m", "orchestrator.cli.main"]
    subprocess.run([*runctl, "submit", str(REPO / "configs" / "demo-cpu-4node.yaml"), "--run-dir", str(run_dir)],
                   env=env, check=True, capture_output=True, timeout=60)  # fmt: skip
    (run_dir / "state.json").write_text(json.dumps({"status": "running", "jobs": []}))  # a controller died
    proc = subprocess.run([*runctl, "doctor", str(run_dir), "--state-dir", str(tmp_path / "d"), "--restart-controller"],
                          env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    print(proc.stdout, proc.stderr)
    assert proc.returncode == 1 and "PROBLEM controller: no controller heartbeat" in proc.stdout
    assert "ok      restart: controller restarted" in proc.stdout
    deadline = time.monotonic() + 30
    while not (run_dir / "controller.json").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert json.loads((run_dir / "controller.json").read_text())["passes"] >= 1
    while (run_dir / "controller.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.2)  # the mock job finishes and the restarted controller exits by itself
    assert not (run_dir / "controller.pid").exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_metrics_are_scraped_over_http_and_parse(run_env, tmp_path):
    cfg, scheduler, ctl = run_env(trainer_env={"FAKE_STEPS": "12"})
    ctl.start()
    assert supervise(ctl) == RunStatus.FINISHED
    # What the controller keeps after it scored stragglers and excluded a node (written by its own
    # code: the scorer's summary into state.json, the exclude list), for the dashboard's panels.
    from orchestrator.contract.exclude import add_excluded
    from orchestrator.contract.state import PoolStatus, save_state
    from orchestrator.controller.stragglers import RankSample, StragglerScorer

    scorer = StragglerScorer(threshold=1.2, duration_seconds=60.0)
    for r in range(1, 10):  # node02 at 1.5x its peer's compute time for 8 rounds of 10 s
        scorer.observe("1", [RankSample(0, "node01", r, 10.0, "pp0"), RankSample(1, "node02", r, 15.0, "pp0"),
                             RankSample(2, "node03", r, 10.0, "pp0")], now=10.0 * r)  # fmt: skip
    ctl.state.stragglers = {"job_id": "1", **scorer.summary()}
    ctl.state.pool = PoolStatus(usable=5, needed=4, spares_next=1)  # the pool panel's series
    save_state(ctl.paths, ctl.state)
    add_excluded(ctl.paths, ["node03"], reason="dead_rank in job 1", by="controller")
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    server = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "metrics", str(ctl.paths.root),
                               "--listen", f"127.0.0.1:{port}"], env=env, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert "serving metrics" in server.stdout.readline()
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        server.terminate()
        server.wait(timeout=10)
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("run", "run_dir"))))] = s.value
    assert_dashboard_names_exported({name for name, _ in samples}, text)
    print({k: v for k, v in samples.items() if "time_seconds" not in k[0]})
    last = json.loads(ctl.paths.metrics.read_text().splitlines()[-1])
    assert samples[("runctl_step", ())] == 12 and samples[("runctl_loss", ())] == pytest.approx(last["loss"])
    assert samples[("runctl_tokens_per_second", ())] == pytest.approx(last["tokens_per_s"])
    assert samples[("runctl_controller_passes_total", ())] >= 3
    assert samples[("runctl_restarts_total", ())] == 0 and samples[("runctl_excluded_nodes", ())] == 1
    assert samples[("runctl_excluded_node", (("node", "node03"), ("reason", "dead_rank in job 1")))] == 1
    assert samples[("runctl_stragglers", ())] == 1 and samples[("runctl_straggler_score", (("node", "node02"),))] == 1.5
    assert samples[("runctl_jobs", (("state", "running"),))] == 0, "the run finished: no job left"
    assert 0 < samples[("runctl_goodput_ratio", (("window", "whole_run"),))] < 1
    assert samples[("runctl_disk_headroom_ratio", ())] > 1
    ranks = {dict(k[1])["rank"] for k in samples if k[0] == "runctl_heartbeat_age_seconds"}
    assert ranks == {str(r) for r in range(cfg.world_size)}
    assert samples[("runctl_run_status", (("status", "finished"),))] == 1
    assert samples[("runctl_pool_short", ())] == 0 and samples[("runctl_pool_spares_next", ())] == 1
    out = tmp_path / "run.prom"
    assert main(["metrics", str(ctl.paths.root), "--textfile", str(out)]) == 0
    assert re.search(r'^runctl_step\{run="demo-cpu-4node-[0-9a-f]{6}",run_dir="[^"]+"\} 12\.0$', out.read_text(), re.M)


def assert_dashboard_names_exported(sampled: set[str], text: str) -> None:
    """Every metric the Grafana dashboard queries is one the exporter really exported (a sample of
    it in the scrape), and every metric the exporter has appears on the dashboard."""
    dashboard = json.loads((REPO / "deploy" / "grafana" / "runctl.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    queried = {name for e in exprs for name in re.findall(r"\brunctl_[a-z_]+", e)}
    exported = set(re.findall(r"^# TYPE (runctl_[a-z_]+) ", text, re.M))
    exported |= {f"{n}_total" for n in exported}  # a counter family is queried as <name>_total
    print(f"dashboard queries {len(queried)} metrics; the scrape has samples of {len(sampled)}")
    assert queried - sampled == set(), f"the dashboard queries metrics with no sample in a scrape: {queried - sampled}"
    families = set(re.findall(r"^# TYPE (runctl_[a-z_]+) ", text, re.M))
    missing = {f for f in families if f not in queried and f"{f}_total" not in queried}
    assert missing == set(), f"exported metrics with no panel: {missing}"


def test_flight_recorder_dumps_are_collected_beside_the_stacks(run_env, capsys):
    cfg, scheduler, ctl = run_env()
    scheduler.env_for_job = [{"FAKE_HANG_AT": "8:0"}]
    ctl.start()
    supervise(ctl, until=lambda c: c.state.status == RunStatus.RUNNING)
    job = ctl.state.jobs[-1].job_id
    # Where a GPU job script points PyTorch's flight recorder, for this run and this job:
    gpu = cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update={"accelerator": "cuda"})})
    script = render_sbatch(gpu, str(ctl.paths.root))
    prefix = re.search(r'^export TORCH_NCCL_DEBUG_INFO_TEMP_FILE="(.+)"$', script, re.M).group(1)
    prefix = prefix.replace("$RUN_DIR", str(ctl.paths.root)).replace("$SLURM_JOB_ID", job)
    assert 'mkdir -p "$RUN_DIR/stacks"' in script
    os.makedirs(os.path.dirname(prefix), exist_ok=True)  # what that line of the script does
    for rank in range(cfg.world_size):  # what torch writes on an NCCL watchdog timeout: <prefix><rank>
        with open(f"{prefix}{rank}", "wb") as dump:
            dump.write(b"\x80\x04pickled flight recorder entries")
    assert supervise(ctl, seconds=60) == RunStatus.FINISHED
    dumped = next(e for e in event_dicts(ctl.paths) if e["event"] == "stacks_dumped")
    print(dumped)
    assert dumped["flight_recorder"] == [f"nccl-trace-{job}-rank-{r}" for r in range(cfg.world_size)]
    assert dumped["ranks_answered"] == cfg.world_size  # the Python stacks, counted apart
    assert main(["events", str(ctl.paths.root), "--last", "0"]) == 0
    text = capsys.readouterr().out
    assert f"NCCL flight recorder ({cfg.world_size} rank dump(s)): {ctl.paths.stacks}/nccl-trace-{job}-rank-0" in text
    assert "TORCH_NCCL" not in render_sbatch(cfg, str(ctl.paths.root))  # CPU/gloo: Python stacks only


def test_stacks_being_written_are_not_counted_as_answers(tmp_path):
    """CI once saw 5 answers from 4 ranks: the poll listed a rank's dump while atomic_write_text
    still had it in its hidden temp file. Only finished rank-NNNNN.txt files are answers."""
    paths = RunPaths.of(tmp_path)
    paths.stacks.mkdir(parents=True)
    paths.signal_stack_dump(3).write_text("old SIGUSR2 stacks\n")  # a file a rank keeps open
    polls = 0

    def sleep(_seconds: float) -> None:  # the ranks answer between polls, one of them mid-write
        nonlocal polls
        polls += 1
        if polls == 1:
            for rank in (0, 1):
                atomic_write_text(paths.stack_dump(rank), f"stacks of rank {rank}\n")
            (paths.stacks / ".rank-00002.txt.szhuk90i.tmp").write_text("half of rank 2")
            paths.signal_stack_dump(3).write_text("new SIGUSR2 stacks\n")
        elif polls == 2:
            os.replace(paths.stacks / ".rank-00002.txt.szhuk90i.tmp", paths.stack_dump(2))
            atomic_write_text(paths.stack_dump(3), "stacks of rank 3\n")

    clock = iter(range(100))
    event = collect_stacks(paths, "7", expected=4, wait_seconds=50, now=0.0, monotonic=lambda: next(clock), sleep=sleep)
    print(event)
    assert event.files == [f"rank-0000{rank}.txt" for rank in range(4)]
    assert event.ranks_answered == 4 and polls == 2  # it waited for rank 2 to finish its file


@pytest.mark.parametrize("signal", ["USR2", "TERM"])
def test_a_pre_timeout_signal_that_collides_is_refused(signal, tmp_path, capsys):
    import yaml

    data = yaml.safe_load((REPO / "configs" / "demo-cpu-4node.yaml").read_text())
    data["cluster"]["pre_timeout_signal"] = signal
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(data))
    assert main(["plan", str(config)]) != 0
    err = capsys.readouterr().err
    print(err)
    assert f"cluster.pre_timeout_signal = {signal} is already used by" in err and "use USR1" in err
