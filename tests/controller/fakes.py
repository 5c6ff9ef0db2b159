"""Test doubles for the controller: an in-process scheduler that really runs fake trainer ranks,
a config builder, a local HTTP server and a local SMTP server."""

from __future__ import annotations

import os
import signal
import socketserver
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from orchestrator.contract.state import RunStatus
from orchestrator.plan.config import parse_config
from orchestrator.slurm.base import JobInfo, JobState, SubmitRequest

REPO = Path(__file__).resolve().parents[2]
FAKE_TRAINER = Path(__file__).with_name("fake_trainer.py")


def make_config(**overrides: Any):
    """The demo config (4 ranks) with fast watchdog settings; overrides are section dicts."""
    data = yaml.safe_load((REPO / "configs" / "demo-cpu-4node.yaml").read_text())
    data["watchdog"].update(
        heartbeat_seconds=0.1, poll_seconds=0.1, dead_after_seconds=1.5, init_timeout_seconds=20,
        step_timeout_seconds=3.0, checkpoint_timeout_seconds=6.0, eval_timeout_seconds=6.0,
        max_restarts_without_progress=3,
    )
    data["operators"] = {"group": None, "users": []}
    data["notifications"] = {}
    for section, values in overrides.items():
        if isinstance(values, dict) and isinstance(data.get(section), dict):
            data[section].update(values)
        else:
            data[section] = values
    return parse_config(data, source="test")


@dataclass
class FakeJob:
    job_id: str
    name: str
    exclude: list[str]
    held: bool
    singleton: bool
    submitted: float
    state: JobState = JobState.PENDING
    nodes: list[str] = field(default_factory=list)
    procs: list[subprocess.Popen] = field(default_factory=list)
    exit_code: int | None = None
    start_time: float | None = None
    end_time: float | None = None


class FakeScheduler:
    """Runs each job as `world_size` fake-trainer processes, one per node, like srun would.

    kill_on_bad_exit mimics `srun --kill-on-bad-exit=1`: one rank failing ends the others.
    Every call is recorded in `calls` so tests can count submissions.
    """

    name = "fake"

    def __init__(self, run_dir: Path, world_size: int, env: dict[str, str] | None = None,
                 pool: list[str] | None = None, kill_on_bad_exit: bool = True):
        self.run_dir = Path(run_dir)
        self.world_size = world_size
        self.env = dict(env or {})
        self.pool = pool or [f"node{i:02d}" for i in range(1, 9)]
        self.kill_on_bad_exit = kill_on_bad_exit
        self.jobs_by_id: dict[str, FakeJob] = {}
        self.calls: list[tuple[str, Any]] = []
        self.env_for_job: list[dict[str, str]] = []  # per submission, popped in order (faults)
        self._next = 1000

    # Scheduler protocol -----------------------------------------------------------------------
    def submit(self, request: SubmitRequest) -> str:
        self._next += 1
        job = FakeJob(str(self._next), request.job_name, list(request.exclude), request.hold,
                      request.dependency == "singleton", time.time())
        self.jobs_by_id[job.job_id] = job
        self.calls.append(("submit", job.job_id))
        self._advance()
        return job.job_id

    def jobs(self, job_ids: list[str]) -> dict[str, JobInfo]:
        self._advance()
        out = {}
        for job_id in job_ids:
            job = self.jobs_by_id.get(str(job_id))
            if job is None:
                out[job_id] = JobInfo(job_id, "", JobState.UNKNOWN)
                continue
            state = JobState.HELD if job.held and job.state is JobState.PENDING else job.state
            out[job_id] = JobInfo(job.job_id, job.name, state, list(job.nodes), job.exit_code,
                                  start_time=job.start_time, end_time=job.end_time, held=job.held)
        return out

    def jobs_by_name(self, name: str) -> list[JobInfo]:
        return [info for info in self.jobs(list(self.jobs_by_id)).values() if info.name == name]

    def cancel(self, job_ids: list[str], signal: str | None = None) -> None:
        self.calls.append(("cancel", list(job_ids)))
        for job_id in job_ids:
            job = self.jobs_by_id.get(str(job_id))
            if job is None or job.state.is_terminal:
                continue
            self._kill(job)
            job.state, job.end_time = JobState.CANCELLED, time.time()

    def hold(self, job_ids: list[str]) -> None:
        for job_id in job_ids:
            self.jobs_by_id[job_id].held = True

    def release(self, job_ids: list[str]) -> None:
        self.calls.append(("release", list(job_ids)))
        for job_id in job_ids:
            self.jobs_by_id[job_id].held = False
        self._advance()

    def update_exclude(self, job_ids: list[str], exclude: list[str]) -> None:
        self.calls.append(("update_exclude", list(job_ids), list(exclude)))
        for job_id in job_ids:
            self.jobs_by_id[job_id].exclude = list(exclude)

    # the fake cluster -------------------------------------------------------------------------
    def submissions(self) -> int:
        return sum(1 for c in self.calls if c[0] == "submit")

    def running(self) -> FakeJob | None:
        return next((j for j in self.jobs_by_id.values() if j.state is JobState.RUNNING), None)

    def _advance(self) -> None:
        for job in self.jobs_by_id.values():
            if job.state is JobState.RUNNING:
                self._reap(job)
        if self.running() is not None:
            return
        for job in sorted(self.jobs_by_id.values(), key=lambda j: int(j.job_id)):
            if job.state is JobState.PENDING and not job.held:
                self._start(job)
                return

    def _start(self, job: FakeJob) -> None:
        nodes = [n for n in self.pool if n not in job.exclude][: self.world_size]
        if len(nodes) < self.world_size:
            return  # not enough nodes: stays pending, as in SLURM
        extra = self.env_for_job.pop(0) if self.env_for_job else {}
        job.nodes, job.state, job.start_time = nodes, JobState.RUNNING, time.time()
        for rank, node in enumerate(nodes):
            env = {**os.environ, **self.env, **extra, "RANK": str(rank), "WORLD_SIZE": str(self.world_size),
                   "JOB_ID": job.job_id, "HOST_NAME": node, "PYTHONPATH": str(REPO)}
            job.procs.append(subprocess.Popen([sys.executable, str(FAKE_TRAINER), str(self.run_dir)], env=env,
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def _reap(self, job: FakeJob) -> None:
        codes = [p.poll() for p in job.procs]
        bad = [c for c in codes if c not in (None, 0, 17, 18)]
        if bad and self.kill_on_bad_exit and any(c is None for c in codes):
            self._kill(job)
            codes = [p.poll() for p in job.procs]
        if all(c is not None for c in codes):
            failures = [c for c in codes if c not in (0, 17, 18, 19)]
            job.exit_code = failures[0] if failures else max(codes)
            job.exit_code = 128 - job.exit_code if job.exit_code < 0 else job.exit_code
            job.state = JobState.COMPLETED if job.exit_code == 0 else JobState.FAILED
            job.end_time = time.time()

    def _kill(self, job: FakeJob) -> None:
        for proc in job.procs:
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGCONT)
                    proc.kill()
                except ProcessLookupError:
                    pass
        for proc in job.procs:
            proc.wait(timeout=10)

    def shutdown(self) -> None:
        for job in self.jobs_by_id.values():
            self._kill(job)


def fake_submitter(scheduler: FakeScheduler, job_name: str):
    """Submits under `job_name`: the run's (orchestrator.slurm.render.run_job_name), as runctl does."""
    def submit(exclude: list[str], reason: str) -> str:
        return scheduler.submit(SubmitRequest(script=Path("/dev/null"), job_name=job_name,
                                              dependency="singleton", exclude=exclude))

    return submit


def supervise(controller: Any, seconds: float = 30.0, until=None) -> str:
    """Run passes until the run stops (or `until(controller)` holds); fail after `seconds`."""

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        result = controller.tick()
        if until is not None and until(controller):
            return result.status
        if until is None and result.status in RunStatus.STOPPED:
            return result.status
        time.sleep(controller.cfg.watchdog.poll_seconds)
    raise AssertionError(f"run did not settle within {seconds} s; status {controller.state.status}")


# Local servers for notifications --------------------------------------------------------------
class WebhookServer:
    """A local receiver of apprise's JSON POSTs: `url` is the apprise URL (json://) for the
    config's `page`, `chat` or `urls`; each POST is {"title": "[run] kind: ...", "message": the
    text and the details' lines, "type": apprise's notify type, "version", "attachments"}."""

    def __init__(self):
        self.received: list[dict] = []
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                import json

                length = int(self.headers.get("Content-Length", 0))
                received.append(json.loads(self.rfile.read(length)))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"json://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def kinds(self) -> list[str]:
        return [kind_of(r) for r in self.received]


def kind_of(post: dict) -> str:
    """The notification kind of a received POST, from its title `[run] kind: message`."""
    return post["title"].split("] ", 1)[1].split(":", 1)[0]


class SMTPServer:
    """Just enough SMTP (RFC 5321) for smtplib.send_message: EHLO/HELO, MAIL, RCPT, DATA, QUIT."""

    def __init__(self):
        self.messages: list[dict] = []
        messages = self.messages

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                def send(line: str):
                    self.wfile.write((line + "\r\n").encode())
                    self.wfile.flush()

                send("220 localhost test SMTP")
                sender, rcpts = None, []
                while True:
                    raw = self.rfile.readline()
                    if not raw:
                        return
                    cmd = raw.decode().strip()
                    verb = cmd.split(" ", 1)[0].upper()
                    if verb in ("EHLO", "HELO"):
                        send("250 localhost")
                    elif verb == "MAIL":
                        sender = cmd.split(":", 1)[1].strip(" <>")
                        send("250 OK")
                    elif verb == "RCPT":
                        rcpts.append(cmd.split(":", 1)[1].strip(" <>"))
                        send("250 OK")
                    elif verb == "DATA":
                        send("354 end with .")
                        lines = []
                        while True:
                            line = self.rfile.readline().decode()
                            if line.rstrip("\r\n") == ".":
                                break
                            lines.append(line)
                        messages.append({"from": sender, "to": rcpts, "data": "".join(lines)})
                        send("250 queued")
                    elif verb == "QUIT":
                        send("221 bye")
                        return
                    else:
                        send("250 OK")

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
