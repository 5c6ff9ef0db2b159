"""Optimizer parameter groups: no weight decay on biases/LayerNorm, split by max_group_params;
and the DeepSpeed config that selects BF16_Optimizer."""

from __future__ import annotations

import torch

from trainer.engine import build_param_groups, deepspeed_config, split_by_size, wants_weight_decay


def bloom_named_params():
    from orchestrator.plan.config import parse_config
    from tests.trainer.runs import tiny_config_dict
    from trainer.model import BloomModel
    from trainer.parallel.groups import ParallelLayout

    cfg = parse_config(tiny_config_dict(), source="test")
    return cfg, list(BloomModel(cfg, ParallelLayout()).named_parameters())


def test_no_decay_on_bias_and_layernorm():
    _, named = bloom_named_params()
    groups = build_param_groups(named, weight_decay=0.1, max_group_params=10**9)
    assert [g["name"] for g in groups] == ["decay_0", "no_decay_0"]
    by_id = {id(p): n for n, p in named}
    decayed = {by_id[id(p)] for p in groups[0]["params"]}
    not_decayed = {by_id[id(p)] for p in groups[1]["params"]}
    assert groups[0]["weight_decay"] == 0.1 and groups[1]["weight_decay"] == 0.0
    assert all("layernorm" not in n and "ln_f" not in n and not n.endswith(".bias") for n in decayed)
    assert any("word_embeddings.weight" in n for n in decayed)
    assert any("query_key_value.weight" in n for n in decayed)
    for n in not_decayed:
        assert n.endswith(".bias") or "layernorm" in n or n.startswith("ln_f"), n
    assert len(decayed) + len(not_decayed) == len(named)
    print(f"{len(decayed)} decayed, {len(not_decayed)} not decayed")


def test_groups_split_by_max_group_params():
    _, named = bloom_named_params()
    total = sum(p.numel() for _, p in named)
    biggest = max(p.numel() for _, p in named)
    limit = biggest + 100
    groups = build_param_groups(named, weight_decay=0.1, max_group_params=limit)
    sizes = [sum(p.numel() for p in g["params"]) for g in groups]
    print(f"limit {limit}: group sizes {sizes}")
    assert len(groups) > 2
    assert all(size <= limit for size in sizes)
    assert sum(sizes) == total
    # every parameter exactly once
    ids = [id(p) for g in groups for p in g["params"]]
    assert len(ids) == len(set(ids)) == len(named)


def test_oversized_tensor_gets_its_own_group():
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (3, 10, 2, 2)]
    chunks = split_by_size(params, 4)
    assert [[p.numel() for p in c] for c in chunks] == [[3], [10], [2, 2]]


def test_no_weight_decay_attribute_wins():
    p = torch.nn.Parameter(torch.zeros(4, 4))
    assert wants_weight_decay("w", p)
    p.no_weight_decay = True
    assert not wants_weight_decay("w", p)


def test_deepspeed_config_bf16_zero1_fp32_accumulation():
    from orchestrator.plan.config import parse_config
    from tests.trainer.runs import tiny_config_dict

    cfg = parse_config(tiny_config_dict(), source="test")
    ds = deepspeed_config(cfg, micro_batches=2, bf16=True)
    assert ds["bf16"] == {"enabled": True}
    assert ds["zero_optimization"] == {"stage": 1}
    assert ds["data_types"] == {"grad_accum_dtype": "fp32"}
    assert ds["train_batch_size"] == cfg.parallel.micro_batch_size * 2 * cfg.dp
    assert ds["gradient_clipping"] == cfg.optimizer.clip_grad
    fp32 = deepspeed_config(cfg, micro_batches=2, bf16=False)
    assert "bf16" not in fp32 and fp32["zero_optimization"]["stage"] == 0
