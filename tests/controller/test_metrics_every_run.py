"""`runctl metrics ROOT --all`: every run under a folder in one scrape, each series labelled with
its run's identity (render.run_job_name: the config's name and a hash of the run directory) and
run_dir. Two runs of ONE config must never share a series, and the Grafana dashboard's `run`
variable must tell them apart."""

from __future__ import annotations

import json
import re

from fakes import REPO, make_config
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.cli.main import main
from orchestrator.contract import append_jsonl
from orchestrator.contract.state import ControllerState, PoolStatus, RunStatus, save_state
from orchestrator.operate.runs import prepare_run_dir
from orchestrator.slurm.render import run_job_name


def test_two_runs_of_one_config_export_distinct_series_in_one_scrape(tmp_path):
    cfg = make_config()
    runs = [tmp_path / "team" / "first", tmp_path / "team" / "nested" / "second"]
    for index, run in enumerate(runs):
        paths = prepare_run_dir(cfg, run)
        append_jsonl(paths.metrics, {"step": 10 + index, "time": 1.0, "loss": 2.5 - index})
        status = RunStatus.CRASH_LOOP if index else RunStatus.RUNNING
        save_state(paths, ControllerState(status=status, pool=PoolStatus(usable=3, needed=2, spares_next=1)))
    out = tmp_path / "all.prom"
    assert main(["metrics", str(tmp_path / "team"), "--all", "--textfile", str(out)]) == 0
    text = out.read_text()
    assert len(re.findall(r"^# TYPE runctl_step ", text, re.M)) == 1, "one family per metric, all runs in it"
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    steps = {(s.labels["run"], s.labels["run_dir"]): s.value for s in samples if s.name == "runctl_step"}
    identities = {run_job_name(cfg.name, run.resolve()) for run in runs}
    print(steps)
    assert {r for r, _ in steps} == identities and len(identities) == 2
    assert sorted(steps.values()) == [10.0, 11.0] and {d for _, d in steps} == {str(r.resolve()) for r in runs}
    crash = [s.labels["run"] for s in samples if s.name == "runctl_run_status" and s.labels["status"] == "crash_loop" and s.value == 1]
    assert crash == [run_job_name(cfg.name, runs[1].resolve())]
    assert len([s for s in samples if s.name == "runctl_pool_spares_next"]) == 2
    # The dashboard's `run` variable is label_values(runctl_step, run): one choice per run.
    dashboard = json.loads((REPO / "deploy" / "grafana" / "runctl.json").read_text())
    variable = next(v for v in dashboard["templating"]["list"] if v["name"] == "run")
    metric, label = re.fullmatch(r"label_values\((\w+), (\w+)\)", variable["query"]).groups()
    assert len({s.labels[label] for s in samples if s.name == metric}) == 2
    assert main(["metrics", str(runs[0]), "--textfile", str(tmp_path / "one.prom")]) == 0
    assert f'run="{run_job_name(cfg.name, runs[0].resolve())}"' in (tmp_path / "one.prom").read_text()
