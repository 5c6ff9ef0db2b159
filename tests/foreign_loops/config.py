"""The run config of the foreign loops' tests: the demo config with one rank per node (a
foreign loop's model and data are its own; the corpus is there because every run config names
one), a quick watchdog, and `cluster.command` running a loop of this folder."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from orchestrator.plan.config import parse_config
from orchestrator.plan.config.load import resolve_paths

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def corpus() -> Path:
    path = REPO / "data" / "corpus"
    if not (REPO / "data" / "corpus.idx").exists() and (path / "multilingual_text_document.idx").exists():
        path = path / "multilingual_text_document"
    return path


def loop_config(command: list[str], *, nodes: int = 2, gpus_per_node: int = 1, spare_nodes: int = 0,
                command_per: str = "rank", watchdog: dict | None = None, operators: dict | None = None):
    data = yaml.safe_load((REPO / "configs" / "demo-cpu-4node.yaml").read_text())
    data["cluster"].update(nodes=nodes, gpus_per_node=gpus_per_node, python=sys.executable,
                           spare_nodes=spare_nodes, command=command, command_per=command_per)
    data["parallel"].update(tp=1, pp=1, micro_batch_size=1, global_batch_size=4 * nodes * gpus_per_node)
    data["data"]["datasets"] = [{"path": str(corpus()), "weight": 1.0}]
    data["watchdog"].update(heartbeat_seconds=0.5, poll_seconds=0.5, dead_after_seconds=6, step_timeout_seconds=20,
                            **(watchdog or {}))
    data["operators"] = operators or {"group": None, "users": []}
    data["notifications"] = {}
    return resolve_paths(parse_config(data, source="foreign-loop"), REPO / "configs")


def plain_command() -> list[str]:
    return [sys.executable, str(HERE / "plain_ddp.py")]


def torchrun_command() -> list[str]:
    """torchrun, with no option but what the loop needs: the rest comes from torchrun's PET_
    variables, set by the launcher's node shim (`command_per: node`)."""
    return [sys.executable, "-m", "torch.distributed.run", "--max-restarts=0", str(HERE / "plain_ddp.py")]
