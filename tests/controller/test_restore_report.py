"""What rank 0 says of its restore reaches the events: `first_step_after_restart` carries the bytes
read by source and the start's parts; each dropped checkpoint copy is one
`checkpoint_copy_dropped` event naming it; the beat's new fields survive the file round trip."""

from __future__ import annotations

import json

from orchestrator.contract import Heartbeat, Phase
from orchestrator.contract import failure_events as fev
from orchestrator.contract.state import ControllerState, Recovery
from orchestrator.controller import upkeep
from orchestrator.controller.detection import Assessment
from orchestrator.views.event_text import sentence

COPY = "node01's copy of bf16_zero_pp_rank_0_mp_rank_02_optim_states.pt (fetched by node03): sha256 differs"


def rank0_beat() -> Heartbeat:
    return Heartbeat(rank=0, world_size=4, host="node01", job_id="17", pid=1, step=9, phase=Phase.STEP,
                     beat_time=100.0, progress_time=100.0, phase_started=90.0, launch=1, resumed_from=8,
                     restore_bytes={"local": 5.5e6, "peer": 4.7e6, "shared": 0.0},
                     start_phases={"rendezvous": 0.2, "engine": 1.3, "load_and_probe": 0.2},
                     dropped_copies=[COPY])  # fmt: skip


def test_restore_report_reaches_the_events_and_survives_the_beat_file():
    beat = rank0_beat()
    again = Heartbeat.from_dict(json.loads(beat.to_json()))
    assert (again.restore_bytes, again.start_phases, again.dropped_copies) == \
        (beat.restore_bytes, beat.start_phases, beat.dropped_copies)  # fmt: skip
    assessment = Assessment(job_id="17", ranks_seen=4, world_size=4, max_step=9, reference=beat)
    [dropped] = upkeep.dropped_copies(assessment)
    assert dropped.copy == COPY and dropped.launch == 1 and "node01" in sentence(dropped)
    state = ControllerState()
    state.recovering = Recovery(job_id="17", failure_time=50.0, restart_time=55.0, resume_step=8)
    first = next(a.event for a in upkeep.follow_recovery(state, assessment, 70.0) if hasattr(a, "event"))
    assert isinstance(first, fev.FirstStepAfterRestart)
    assert first.restore_bytes["shared"] == 0.0 and first.start_phases["engine"] == 1.3
    assert "5.5 MB from local" in sentence(first) and "0.0 MB from shared" in sentence(first)
