"""Tiny run directories for the trainer tests: configs/tiny-cpu.yaml, shrunk, on the shipped corpus."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from orchestrator.plan.config import dump_config, parse_config
from orchestrator.plan.config.load import resolve_paths

REPO_ROOT = Path(__file__).resolve().parents[2]
TINY = REPO_ROOT / "configs" / "tiny-cpu.yaml"
CORPUS_PREFIX = REPO_ROOT / "data" / "corpus" / "multilingual_text_document"


def ensure_corpus() -> None:
    from trainer.data.prepare_corpus import prepare_corpus

    prepare_corpus()


def merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def tiny_config_dict(**changes: Any) -> dict[str, Any]:
    data = yaml.safe_load(TINY.read_text())
    data = merge(data, {
        "model": {"num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "seq_length": 32},
        "parallel": {"micro_batch_size": 2, "global_batch_size": 4},
        "optimizer": {"warmup_samples": 8},
        "data": {"datasets": [{"path": str(CORPUS_PREFIX), "weight": 1.0}],
                 "tokenizer": str(REPO_ROOT / "data" / "tokenizer.json"), "train_samples": 400},
        "checkpoint": {"interval_steps": 1000, "keep_last": 3},
    })
    return merge(data, changes)


def make_run_dir(run_dir: Path, **changes: Any) -> Path:
    """Write RUN_DIR/run.yaml from the tiny config plus `changes` (nested dicts merge)."""
    ensure_corpus()
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = resolve_paths(parse_config(tiny_config_dict(**changes), source="tests"), REPO_ROOT)
    (run_dir / "run.yaml").write_text(dump_config(cfg))
    return run_dir
