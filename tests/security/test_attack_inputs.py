"""Terminals, the notification URLs and smaller holes, through the real entry
points: `runctl events --audit`, `runctl nodes`, the live view, notify, render_sbatch,
verify_manifest, load_config, the exclude list and `runctl cluster up`."""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import shutil
import socket
import time
from contextlib import redirect_stdout
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from attack_env import as_user, uid
from fakes import make_config
from rich.console import Console

from orchestrator.cli.main import main
from orchestrator.contract import RunPaths, append_jsonl, atomic_write_json, exclude, verify_manifest
from orchestrator.contract.events import Event
from orchestrator.controller.notify import notify
from orchestrator.plan.config import ConfigError, dump_config, load_config
from orchestrator.slurm.local_cluster import ClusterError, LocalCluster
from orchestrator.slurm.render import render_sbatch
from orchestrator.views.dashboard import status_data
from orchestrator.views.status_screen import job_table, render_status
from tests.status_views import job_row

REPO = Path(__file__).resolve().parents[2]
ANSI = "\x1b[2J\x1b[H\x1b]0;pwned\x07\x9b31m"
FAKE_LINE = "\n2026-11-30 03:00:00  root  kill  allowed  reason: fake"


def own_run(tmp_path: Path, **overrides) -> RunPaths:
    paths = RunPaths.of(tmp_path / "run")
    paths.root.mkdir()
    paths.config.write_text(dump_config(make_config(**overrides)))
    return paths


def runctl(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    with redirect_stdout(out):
        rc = main(argv)
    return rc, out.getvalue()


def assert_inert(text: str, records: int) -> None:
    assert not any(ch in text for ch in "\x1b\x07\x9b"), repr(text)
    assert len(text.strip().splitlines()) == records, text


def test_reasons_reach_the_terminal_as_one_inert_line(tmp_path):
    paths = own_run(tmp_path)
    append_jsonl(
        paths.audit,
        {
            "time": time.time(),
            "user": "oncall",
            "action": "kill" + ANSI,
            "reason": ANSI + FAKE_LINE,
            "allowed": True,
        },
    )
    rc, out = runctl(["events", str(paths.root), "--audit"])
    assert rc == 0
    assert_inert(out, 1)
    assert "\\n2026-11-30" in out, "a newline is shown as \\n"

    paths.control.mkdir()
    atomic_write_json(
        paths.exclude_list,
        {"nodes": {"node01": {"since": 0, "reason": ANSI + FAKE_LINE, "by": "x" + ANSI}}},
    )
    rc, out = runctl(["nodes", str(paths.root)])
    assert rc == 0
    assert_inert(out, 1)

    row = job_row(state="pending", submitted_at=None, submit_reason=ANSI, reason=FAKE_LINE)  # its reason is shown
    console = Console(file=io.StringIO(), width=200, force_terminal=False)
    console.print(job_table([row], time.time()))  # `runctl status`: header, rule, one job
    shown = console.file.getvalue()
    assert_inert(shown, 3)
    assert "\\n2026-11-30" in shown, "a newline is shown as \\n"


def test_rich_markup_in_a_reason_does_not_break_the_live_view(tmp_path):
    paths = own_run(tmp_path)
    data = status_data(paths.root)
    jobs = (job_row(job_id="1[/]", why="[/][bold red]" + ANSI, submit_reason="x", nodes=("n[/]",), reason="[/]",
                    submitted_at=time.time()),)  # fmt: skip
    events = tuple(Event.from_dict(record) for record in [
        {"time": time.time(), "event": "kill_requested", "by": "[/]" + ANSI, "reason": "[/]" + ANSI},
        {"time": time.time(), "event": "x[/]"}])  # fmt: skip
    dashboard = replace(data.dashboard, events=events, excluded={"node01": {"reason": "[/]" + ANSI}})
    data = replace(data, jobs=jobs, dashboard=dashboard, warnings=("[/][bold]" + ANSI,))
    console = Console(file=io.StringIO(), width=200, force_terminal=False)
    console.print(render_status(data))
    shown = console.file.getvalue()
    print(shown)
    assert "[/][bold red]" in shown and "x[/]" in shown and "[/][bold]" in shown
    assert not any(ch in shown for ch in "\x1b\x07\x9b")


def test_notification_url_is_redacted_when_a_post_fails():
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"json://hookuser:PASSWORD@127.0.0.1:{port}/services/T0SECRET/B0TOKEN?key=QSECRET"
    settings = make_config(notifications={"urls": [url], "timeout_seconds": 1}).notifications
    problems = notify(settings, "run", "failure", "boom")
    assert problems and f"127.0.0.1:{port}" in problems[0], problems
    for secret in ("T0SECRET", "B0TOKEN", "QSECRET", "PASSWORD", "hookuser"):
        assert secret not in " ".join(problems), problems


def test_trailing_newline_never_reaches_the_script(tmp_path):
    cfg = load_config(REPO / "configs" / "demo-cpu-4node.yaml")
    with pytest.raises(ConfigError, match="run directory"):
        render_sbatch(cfg, "/x\n")
    with pytest.raises(ConfigError, match="job name"):
        render_sbatch(cfg, str(tmp_path), job_name="ok\n")
    with pytest.raises(ConfigError, match="excluded node"):
        render_sbatch(cfg, str(tmp_path), exclude=["node01\n"])
    # A config the schema was bypassed for (model_copy does not validate) still fails.
    bad = cfg.model_copy(update={"name": "ok\n"})
    with pytest.raises(ConfigError, match="job name"):
        render_sbatch(bad, str(tmp_path))
    script = render_sbatch(cfg, str(tmp_path))
    first_sbatch = script.index("#SBATCH")
    assert all(line.startswith("#") for line in script[:first_sbatch].splitlines()[1:])


def test_manifest_names_are_confined_to_the_checkpoint(tmp_path):
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"not ours")
    digest = {"size": outside.stat().st_size, "sha256": hashlib.sha256(b"not ours").hexdigest()}
    ckpt = tmp_path / "checkpoints" / "step_0000001"
    ckpt.mkdir(parents=True)
    (ckpt / "link").symlink_to(tmp_path)
    (ckpt / "own.bin").write_bytes(b"not ours")
    names = ["../../outside.bin", str(outside), "link/outside.bin", "./own.bin"]
    (ckpt / "MANIFEST.json").write_text(
        json.dumps({"files": {n: digest for n in names} | {"own.bin": digest}})
    )
    problems = verify_manifest(ckpt)
    assert len(problems) == len(names), problems
    assert all("not a plain path inside the checkpoint" in p for p in problems)


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("watchdog", "step_timeout_seconds", float("inf")),
        ("watchdog", "dead_after_seconds", float("nan")),
        ("optimizer", "lr", float("inf")),
        ("checkpoint", "interval_hours", float("inf")),
        ("watchdog", "poll_seconds", 1e-9),
        ("data", "seed", -1),
        ("data", "seed", 2**32),
        (None, "seed", -5),
    ],
)
def test_config_numbers_are_finite_in_range_and_sane(tmp_path, section, key, value):
    data = yaml.safe_load((REPO / "configs" / "demo-cpu-4node.yaml").read_text())
    (data[section] if section else data)[key] = value
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    rc = main(["plan", str(path)])
    assert rc == 2
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert any(p.startswith(f"{section + '.' if section else ''}{key} = ") for p in caught.value.problems), (
        caught.value
    )


def test_duplicate_yaml_keys_are_an_error_naming_key_and_line(tmp_path):
    text = (REPO / "configs" / "demo-cpu-4node.yaml").read_text()
    assert "\nwatchdog:\n" in text
    path = tmp_path / "dup.yaml"
    path.write_text(text.replace("\nwatchdog:\n", "\nwatchdog:\n  poll_seconds: 5\n  poll_seconds: 0.2\n", 1))
    with pytest.raises(ConfigError, match=r"key 'poll_seconds' is given twice \(lines \d+ and \d+\)"):
        load_config(path)


def test_exclude_list_lock_times_out_with_a_clear_error(tmp_path, monkeypatch):
    paths = own_run(tmp_path)
    exclude.add_excluded(paths, ["node01"], reason="bad gpu", by="controller")
    monkeypatch.setattr(exclude, "LOCK_TIMEOUT_SECONDS", 0.3)
    holder = os.open(paths.exclude_lock, os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX)  # an owner's process stuck on the filesystem
    try:
        began = time.monotonic()
        with pytest.raises(exclude.ExcludeLockTimeout, match="held for more than"):
            exclude.clear_excluded(paths, None)
        assert time.monotonic() - began < 3
    finally:
        os.close(holder)
    assert exclude.excluded_nodes(paths) == ["node01"], "nothing lost"
    assert exclude.clear_excluded(paths, None) == ["node01"]


def test_cluster_up_refuses_a_predictable_dir_it_does_not_own(team, tmp_path, monkeypatch):
    def write_files(self, spec):  # a regression must fail here, before any daemon starts
        raise AssertionError(f"up() went on to write its config into {self.dir}")

    monkeypatch.setattr(LocalCluster, "_write_files", write_files)
    base = Path("/tmp") / f"runctl-cluster-test-{os.getpid()}"
    as_user(team.outsider, lambda: os.mkdir(base, 0o777))
    link = Path("/tmp") / f"runctl-cluster-link-{os.getpid()}"
    as_user(team.outsider, lambda: os.symlink(base, link))
    try:
        for planted in (base, link):
            with pytest.raises(ClusterError, match="not a safe place"):
                LocalCluster(planted).up(install=False)
        mine = tmp_path / "cluster"
        LocalCluster(mine)._claim_dir()
        assert (os.stat(mine).st_mode & 0o077, os.stat(mine).st_uid) == (0, 0)
    finally:
        os.unlink(link)
        shutil.rmtree(base)
    assert uid(team.outsider) != 0
