"""Tiny RunConfigs for the model and tensor-parallel tests (no files needed)."""

from __future__ import annotations

from orchestrator.plan.config import parse_config


def tiny_config(*, tp: int = 1, pp: int = 1, dp: int = 1, seed: int = 1234, dtype: str = "fp32", **model):
    """A RunConfig of a tiny BLOOM; `model` overrides model.* fields (num_layers, hidden_size, ...)."""
    model_section = {
        "num_layers": 2, "hidden_size": 48, "num_attention_heads": 6, "seq_length": 16,
        "vocab_size": 250, "make_vocab_size_divisible_by": 8, "init_std": 0.02, "dtype": dtype,
        "kernels": "reference",
    }
    model_section.update(model)
    world = tp * pp * dp
    data = {
        "name": "tiny-model-test",
        "seed": seed,
        "cluster": {"nodes": 1, "gpus_per_node": world, "accelerator": "cpu"},
        "model": model_section,
        "parallel": {"tp": tp, "pp": pp, "dp": dp, "micro_batch_size": 2, "global_batch_size": 2 * dp,
                     "activation_checkpointing": False},
        "optimizer": {"lr": 1e-3},
        "data": {"datasets": [{"path": "unused"}], "tokenizer": "unused", "train_samples": 100},
        "checkpoint": {"interval_steps": 10},
    }
    return parse_config(data, source="tiny_config")
