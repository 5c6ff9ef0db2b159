"""`make demo`'s scenario on the real local SLURM cluster: the job holds every node of the
partition (2 nodes + 2 spares of the 4), a node's rank is SIGKILLed, the launcher relaunches on a
spare inside the job. Nobody must be paged for that: the run trains. Notifications go to two
local apprise JSON endpoints, one per severity (`page:` and `chat:`); while the job trains on its
spare, `runctl status` has no CRITICAL line, the pager has received nothing, and the next job
would ask for the one spare left (state.json's pool)."""

from __future__ import annotations

import signal

import pytest
from fakes import WebhookServer
from test_e2e_slurm import drive, e2e_run, inject_once, job_outputs  # noqa: F401 - e2e_run is a fixture

from orchestrator.contract.state import RunStatus
from orchestrator.controller import Controller
from orchestrator.views.dashboard import status_data
from tests.run_records import event_dicts

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_a_node_lost_with_a_spare_left_pages_nobody(e2e_run):  # noqa: F811 - the imported fixture
    from orchestrator.operate.runs import submit_job

    pager, chat = WebhookServer(), WebhookServer()
    try:
        json_url = lambda server: server.url.replace("http://", "json://")  # noqa: E731
        cfg, ctl = e2e_run(
            spare_nodes=2,
            env_extra={"TRAINER_STEP_DELAY_SECONDS": "1"},
            notifications={"page": [json_url(pager)], "chat": [json_url(chat)]},
        )
        job_id = str(submit_job(ctl.paths.root, cfg, ctl.scheduler, reason="initial"))
        ctl.start()
        act, done = inject_once(3, 2, signal.SIGKILL)

        def training_on_the_spare(c: Controller) -> bool:
            events = [e["event"] for e in event_dicts(c.paths)]
            return "first_step_after_restart" in events and c.state.status == RunStatus.RUNNING

        drive(ctl, 240, act=act, until=training_on_the_spare)
        ctl.tick()  # one more pass: the pool judged after the relaunch
        assert done, "the fault was never injected"
        events = event_dicts(ctl.paths)
        restart = next(e for e in events if e["event"] == "restart")
        assert restart["in_allocation"] and restart["job_id"] == job_id, job_outputs(ctl.paths)
        screen = status_data(ctl.paths.root, ctl.scheduler)
        print("warnings:", screen["warnings"])
        print("pager:", pager.received, "\nchat:", [m["title"] for m in chat.received])
        print("pool:", ctl.state.pool)
        assert not [w for w in screen["warnings"] if "CRITICAL" in w]
        assert pager.received == [], "nobody is paged while the job trains on its spare"
        kinds = [m["title"].split()[1] for m in chat.received]
        assert "restart:" in kinds and "spares:" in kinds, kinds
        assert not ctl.state.pool.short and ctl.state.pool.spares_next == 1
        assert [e for e in events if e["event"] == "spares_for_next_job"][0]["spares_next"] == 1
        assert not [e for e in events if e["event"] == "pool_short"]
    finally:
        pager.close(), chat.close()
