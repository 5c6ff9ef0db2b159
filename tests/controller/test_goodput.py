"""Goodput accounting (orchestrator/views/goodput.py) through `runctl report --json`, against a
timeline built by hand: every expected second below was counted on paper from the timeline, not
computed by the code under test.

The run (t = seconds after BASE):
      0  job A submitted                      queue        0-100   = 100
    100  A starts                             init       100-150   =  50
    150  step 1 starts (10 s steps)           useful     150-180   =  30  (steps 1-3)
    180  step 3 ends, checkpoint 3 saving     save       180-200   =  20  (checkpoint_complete event)
    200  step 4 (ends 215)                    recomputed 200-215   =  15  (the restart resumes from 3)
    215  step 5 with eval (eval 215-225)      eval       215-225   =  10
                                              recomputed 225-235   =  10
    245  step 6 ends, then A hangs            recomputed 235-245   =  10
    305  the controller detects it            detection  245-305   =  60
    310  A ends (cancelled)                   shutdown   305-310   =   5  (init_rendezvous)
    320  job B submitted                      no job     310-320   =  10
    340  B starts                             queue      320-340   =  20
    368  B loads the checkpoint (12 s)        init       340-368   =  28, load 368-380 = 12
    380  steps 4-7                            useful     380-420   =  40
    420  checkpoint 7 (manifest on disk)      save       420-450   =  30
    460  B ends, run finished                 shutdown   450-460   =  10
"""

from __future__ import annotations

import json
import os

import pytest
from fakes import REPO

from orchestrator.cli.main import main
from orchestrator.views.goodput import run_breakdown

BASE = 1_800_000_000.0
WHOLE = {
    "queue_wait": 120.0, "init_rendezvous": 93.0, "useful_training": 70.0, "checkpoint_save": 50.0,
    "recomputed_steps": 35.0, "eval": 10.0, "detection_wait": 60.0, "no_job": 10.0, "checkpoint_load": 12.0,
}  # fmt: skip
# The last 200 s (260-460): detection 260-305, then as above (init 5 + 28 + 10 = 43).
LAST_200 = {
    "detection_wait": 45.0, "init_rendezvous": 43.0, "no_job": 10.0, "queue_wait": 20.0, "checkpoint_load": 12.0,
    "useful_training": 40.0, "checkpoint_save": 30.0, "recomputed_steps": 0.0, "eval": 0.0,
}  # fmt: skip


def _lines(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture
def hand_built_run(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints" / "step_0000007").mkdir(parents=True)
    (run / "run.yaml").write_text((REPO / "configs" / "demo-cpu-4node.yaml").read_text())
    t = lambda s: BASE + s  # noqa: E731
    state = {
        "status": "finished",
        "jobs": [
            {"job_id": "1", "submitted_at": t(0), "started_at": t(100), "ended_at": t(310), "state": "cancelled"},
            {"job_id": "2", "submitted_at": t(320), "started_at": t(340), "ended_at": t(460), "state": "completed"},
        ],
    }
    (run / "state.json").write_text(json.dumps(state))
    steps = [(1, 160), (2, 170), (3, 180), (4, 215), (5, 235), (6, 245), (4, 390), (5, 400), (6, 410), (7, 420)]
    _lines(run / "metrics.jsonl", [
        {"step": s, "time": t(end), "step_seconds": 10.0, "loss": 5.0, **({"eval_loss": 5.1} if end == 235 else {})}
        for s, end in steps
    ])  # fmt: skip
    _lines(run / "events.jsonl", [
        {"event": "job_submitted", "time": t(0), "job_id": "1"},
        {"event": "checkpoint_complete", "time": t(201), "step": 3, "saved_at": t(200)},
        {"event": "failure", "time": t(305), "job_id": "1", "failure_time": t(245), "detection_time": t(305)},
        {"event": "restart", "time": t(305), "job_id": "2", "failed_job_id": "1", "failure_time": t(245),
         "detection_time": t(305), "restart_time": t(305), "resume_step": 3, "last_step": 6},
        {"event": "job_training", "time": t(385), "job_id": "2", "checkpoint_load_seconds": 12.0},
        {"event": "run_stopped", "time": t(460), "status": "finished"},
    ])  # fmt: skip
    manifest = run / "checkpoints" / "step_0000007" / "MANIFEST.json"
    manifest.write_text("{}")
    os.utime(manifest, (t(450), t(450)))
    return run


def test_report_breaks_wall_time_into_hand_counted_categories(hand_built_run, capsys, tmp_path):
    assert main(["report", str(hand_built_run), "--json", "--out", str(tmp_path / "out")]) == 0
    summary = json.loads(capsys.readouterr().out)
    whole = summary["time_breakdown"]["whole_run"]
    errors = {k: abs(whole["seconds"][k] - v) for k, v in WHOLE.items()}
    print("whole run:", whole["seconds"], "max error", max(errors.values()))
    assert max(errors.values()) < 1e-6
    assert abs(sum(whole["seconds"].values()) - 460.0) < 1e-6 and whole["wall_seconds"] == 460.0
    assert summary["goodput"] == pytest.approx(70 / 460)
    assert (tmp_path / "out" / "goodput.png").stat().st_size > 1000
    recent = run_breakdown(hand_built_run, window_seconds=200.0)["last_24h"]
    print("last 200 s:", recent["seconds"])
    assert recent["wall_seconds"] == 200.0
    assert all(abs(recent["seconds"][k] - v) < 1e-6 for k, v in LAST_200.items()), recent["seconds"]


def test_report_prints_the_breakdown_for_people(hand_built_run, capsys, tmp_path):
    assert main(["report", str(hand_built_run), "--out", str(tmp_path / "out")]) == 0
    text = capsys.readouterr().out
    print(text)
    # the run is younger than 24 h: its one breakdown, printed once
    assert "goodput (whole run, all of it in the last 24 h): 15.2%" in text and "last 24 h):" not in text.replace("all of it in the last 24 h):", "")
    assert "detection wait" in text and "recomputed steps" in text and "time breakdown:" in text
    from rich.console import Console

    from orchestrator.views.dashboard import status_data
    from orchestrator.views.status_screen import render_status

    console = Console(record=True, width=160)
    console.print(render_status(status_data(hand_built_run)))
    board = console.export_text()
    print(board)
    # The three largest losses, by hand: queue 120 s (26%), init 93 s (20%), detection 60 s (13%).
    assert "goodput: 15.2% whole run, 15.2% last 24 h; lost to queue wait 26%, init, rendezvous and shutdown 20%, detection wait 13%" in board
