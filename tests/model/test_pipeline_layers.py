"""The pipeline layer specs: BLOOM's partitioning names, same weights/logits as BloomModel, and a real
DeepSpeed PipelineModule (one gloo process) built from them."""

from __future__ import annotations

import os
import re
import socket

import pytest
import torch
import torch.multiprocessing as mp

from tests.model.bloom_configs import tiny_config
from trainer.model import (
    BloomModel,
    bloom_pipeline_layers,
    pipeline_key_to_model_key,
    universal_checkpoint_info,
)
from trainer.parallel import ParallelLayout

pytest.importorskip("deepspeed")


def test_specs_partition_like_bloom():
    from deepspeed.pipe import TiedLayerSpec

    cfg = tiny_config(num_layers=3)
    specs = bloom_pipeline_layers(cfg, ParallelLayout())
    names = [s.typename.__name__ for s in specs]
    assert names == ["EmbeddingPipe"] + ["ParallelTransformerLayerPipe"] * 3 + ["FinalLayerNormPipe", "EmbeddingPipe"]
    # DeepSpeed's "type:transformer|embedding" weighs exactly the L layers + 2 embedding units.
    regex = re.compile("transformer|embedding", re.IGNORECASE)
    assert sum(bool(regex.search(n)) for n in names) == 3 + 2
    tied = [s for s in specs if isinstance(s, TiedLayerSpec)]
    assert [t.key for t in tied] == ["embed", "embed"]
    assert tied[0].forward_fn is None and tied[1].forward_fn is not None
    assert tied[1].tied_weight_attr == ["word_embeddings.weight"]


def test_specs_run_sequentially_equal_bloom_model():
    cfg = tiny_config(num_layers=2)
    specs = bloom_pipeline_layers(cfg, ParallelLayout())
    embed = specs[0].build()
    layers = [s.build() for s in specs[1:-1]]
    model = BloomModel(cfg)
    # Same seed -> the same weights, parameter by parameter.
    pipe_sd = {f"tied_modules.embed.{k}": v for k, v in embed.state_dict().items()}
    for unit, layer in enumerate(layers, start=1):
        pipe_sd.update({f"{unit}.{k}": v for k, v in layer.state_dict().items()})
    model_sd = model.state_dict()
    renamed = {pipeline_key_to_model_key(k, cfg.model.num_layers): v for k, v in pipe_sd.items()}
    assert renamed.keys() == model_sd.keys()
    assert all(torch.equal(renamed[k], model_sd[k]) for k in model_sd)

    ids = torch.randint(0, cfg.model.vocab_size, (2, cfg.model.seq_length))
    hidden = embed(ids)
    for layer in layers:
        hidden = layer(hidden)
    logits = specs[-1].forward_fn(embed, hidden)
    err = (logits - model(ids)).abs().max().item()
    print(f"pipeline units in sequence vs BloomModel: max abs err {err:.3e}")
    assert err == 0.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pipeline_module_worker(rank: int, port: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1",
                      DS_ACCELERATOR="cpu")
    torch.set_num_threads(1)
    import deepspeed
    import torch.distributed as dist

    from trainer.launch import skip_deepspeed_shm_op
    from trainer.model import build_pipeline_module
    from trainer.model.pipeline import build_stage_units
    from trainer.parallel import initialize_model_parallel

    skip_deepspeed_shm_op()  # as the trainer does: training never uses the op it would compile
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    layout = ParallelLayout()
    cfg = tiny_config(num_layers=2)
    units = build_stage_units(cfg, layout, 0)  # as the warm standby does, before the groups exist
    initialize_model_parallel(layout)
    module = build_pipeline_module(cfg, layout)
    ids = torch.randint(0, cfg.model.vocab_size, (2, cfg.model.seq_length))
    prebuilt = build_pipeline_module(cfg, layout, prebuilt=units)
    with torch.no_grad():
        logits = module(ids)
        reference = BloomModel(cfg)(ids)
        out["prebuilt_err"] = (prebuilt(ids) - logits).abs().max().item()
    out["prebuilt_used"] = sorted(units) == list(range(5)) and all(
        any(p is q for q in prebuilt.parameters()) for unit in units.values() for p in unit.parameters())
    out["err"] = (logits - reference).abs().max().item()
    out["names"] = [n for n, _ in module.named_parameters()]
    out["loss"] = module.loss_fn(logits, torch.roll(ids, -1, 1)).item()
    # Activation checkpointing (DeepSpeed's reentrant checkpoint of each transformer layer) must
    # give the same gradients, the embedding's included.
    checkpointed = build_pipeline_module(cfg, layout, activation_checkpoint_interval=1)
    reference = BloomModel(cfg)
    labels = torch.roll(ids, -1, 1)
    checkpointed.loss_fn(checkpointed(ids), labels).backward()
    reference.loss(ids, labels).backward()
    ref_grads = dict(reference.named_parameters())
    out["ckpt_grad_err"] = max(
        (p.grad - ref_grads[pipeline_key_to_model_key(n, 2)].grad).abs().max().item()
        for n, p in checkpointed.named_parameters())
    dist.destroy_process_group()


def test_real_pipeline_module_matches_and_names_are_covered():
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_pipeline_module_worker, args=(_free_port(), out), nprocs=1, join=True)
        out = dict(out)
    print(f"PipelineModule (world 1) vs BloomModel: max abs err {out['err']:.3e}, loss {out['loss']:.4f}")
    assert out["err"] == 0.0
    print(f"PipelineModule of units built before the process groups: max abs err {out['prebuilt_err']:.3e}")
    assert out["prebuilt_err"] == 0.0 and out["prebuilt_used"]
    print(f"activation-checkpointed PipelineModule grads vs BloomModel: max abs err {out['ckpt_grad_err']:.3e}")
    assert out["ckpt_grad_err"] <= 1e-6
    assert 4.0 < out["loss"] < 7.0  # ~ln(256) for a fresh model
    cfg = tiny_config(num_layers=2)
    info = universal_checkpoint_info(cfg, ParallelLayout())
    special = [p for key in ("tp_replicated_parameter_patterns", "parameter_with_row_parallelism_patterns",
                             "vocabulary_parameter_patterns") for p in info[key]]
    for name in out["names"]:
        pipeline_key_to_model_key(name, 2)  # every name maps to a BloomModel name
        matches = [p for p in special if re.match(p, name)]
        is_column = name.endswith(("query_key_value.weight", "query_key_value.bias", "dense_h_to_4h.weight",
                                   "dense_h_to_4h.bias"))
        # a parameter is exactly one of: column-parallel (DeepSpeed's default, no pattern), replicated,
        # row-parallel, vocabulary
        assert len(matches) == (0 if is_column else 1), (name, matches)
