"""Every shipped config validates; one invalid config per rule gives the expected message."""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.plan.config import ConfigError, dump_config, load_config, parse_config

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))
BLOOM = Path(__file__).resolve().parents[2] / "configs" / "bloom-176b.yaml"


def bloom_dict() -> dict:
    return yaml.safe_load(BLOOM.read_text())


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_config_loads(path: Path) -> None:
    cfg = load_config(path)
    assert cfg.parallel.tp * cfg.parallel.pp * cfg.dp == cfg.cluster.nodes * cfg.cluster.gpus_per_node


def test_bloom_config_is_bloom() -> None:
    cfg = load_config(BLOOM)
    m, p, o = cfg.model, cfg.parallel, cfg.optimizer
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.seq_length) == (70, 14336, 112, 2048)
    assert cfg.padded_vocab_size == 250880 and m.alibi and m.embedding_layernorm and m.init_std == 0.0048
    assert (p.tp, p.pp, cfg.dp, cfg.cluster.nodes, cfg.cluster.gpus_per_node) == (4, 12, 8, 48, 8)
    assert (p.micro_batch_size, p.global_batch_size) == (2, 2048)
    assert p.rampup is not None and (p.rampup.start, p.rampup.increment, p.rampup.samples) == (192, 16, 9765625)
    assert cfg.train_samples == 220_000_000
    assert (o.lr, o.min_lr, o.warmup_samples, o.decay_samples) == (6e-5, 6e-6, 183105, 200_000_000)
    assert (o.adam_beta1, o.adam_beta2, o.adam_eps, o.clip_grad, o.weight_decay) == (0.9, 0.95, 1e-8, 1.0, 0.1)
    assert cfg.checkpoint.interval_hours == 3 and cfg.checkpoint.exit_duration_minutes == 5990
    assert cfg.cluster.qos == "qos_gpu-gc" and cfg.cluster.time_limit == "100:00:00"
    assert cfg.cluster.env["CUDA_LAUNCH_BLOCKING"] == "1" and cfg.cluster.env["NCCL_ASYNC_ERROR_HANDLING"] == "1"


def test_frozen_config_round_trips(tmp_path: Path) -> None:
    cfg = load_config(BLOOM)
    frozen = tmp_path / "run.yaml"
    frozen.write_text(dump_config(cfg))
    assert load_config(frozen) == cfg


def _mutate(path: str, value) -> dict:
    data = copy.deepcopy(bloom_dict())
    keys = path.split(".")
    node = data
    for key in keys[:-1]:
        node = node[key]
    if value is _DELETE:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return data


_DELETE = object()

INVALID = [
    # (key path, new value, expected fragment of the message)
    ("cluster.nodes", 24, "tp*pp*dp = 4*12*8 = 384, but the job has 24 nodes x 8 GPUs = 192"),
    # the world size said once, with its factors (not "... = 384 is 384")
    ("parallel.tp", 3, "tp*pp*dp = 3*12*8 = 288, but the job has 48 nodes x 8 GPUs = 384\n"),
    ("model.num_attention_heads", 110, "num_attention_heads = 110 is not divisible by parallel.tp = 4"),
    ("parallel.pp", 80, "parallel.pp = 80 stages but only 70 layers"),
    ("parallel.global_batch_size", 2050, "global_batch_size = 2050 is not divisible by micro_batch_size*dp"),
    ("model.padded_vocab_size", 250752, "not divisible by make_vocab_size_divisible_by*tp = 128*4 = 512"),
    ("parallel.rampup", {"start": 200, "increment": 16, "samples": 9765625}, "rampup.start = 200 is not divisible"),
    ("parallel.rampup", {"start": 192, "increment": 24, "samples": 9765625}, "not a multiple of rampup.increment = 24"),
    ("parallel.rampup", {"start": 4096, "increment": 16, "samples": 9765625}, "rampup.start = 4096 exceeds"),
    ("model.hidden_size", "big", "model.hidden_size = 'big'"),
    ("model.hidden_sise", 1, "model.hidden_sise: unknown key"),
    ("model.num_layers", _DELETE, "model.num_layers: required key is missing"),
    ("cluster.partition", "gpu;rm -rf /", "cluster.partition = 'gpu;rm -rf /': contains characters that are not allowed"),
    ("cluster.env", {"BAD NAME": "1"}, "cluster.env.BAD NAME"),
    ("cluster.env", {"X": "a\nb"}, "must be one line"),
    ("cluster.time_limit", "100h", "cluster.time_limit = '100h'"),
    ("optimizer.min_lr", 1.0, "min_lr (1.0) must not exceed lr"),
    ("data.train_tokens", 100, "give exactly one of train_samples or train_tokens"),
    ("model.dtype", "fp8", "model.dtype = 'fp8'"),
]


@pytest.mark.parametrize("path,value,expected", INVALID, ids=[f"{p}={v!r}"[:40] for p, v, _ in INVALID])
def test_invalid_config_names_the_problem(path: str, value, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(_mutate(path, value), source="bad.yaml")
    message = str(info.value)
    print(message)
    assert expected in message
    assert message.startswith("bad.yaml: invalid run config")


def test_all_problems_reported_at_once() -> None:
    data = _mutate("cluster.nodes", 24)
    data["model"]["num_attention_heads"] = 110
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert len(info.value.problems) >= 2


def test_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(bad)


def test_a_venvs_python_is_kept_as_written_not_resolved_to_the_base_interpreter(tmp_path):
    """A venv's bin/python is a symlink to the base interpreter; only the link's own path finds the
    venv's packages (pyvenv.cfg beside it)."""
    venv_python = tmp_path / "venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.symlink_to(sys.executable)
    (tmp_path / "configs").mkdir()
    text = (Path(__file__).resolve().parents[2] / "configs" / "tiny-cpu.yaml").read_text()
    config = tmp_path / "configs" / "tiny.yaml"
    config.write_text(text.replace("python: ../.venv/bin/python", "python: ../venv/bin/python"))
    assert load_config(config).cluster.python == str(venv_python)
    assert Path(os.path.realpath(venv_python)) != venv_python, "the test needs a real symlink"
