"""BLOOM as DeepSpeed pipeline layers (the engine's model), from the same layer classes as BloomModel.

Pipeline units, in order (BLOOM-176B: 70 transformer layers + 2 embedding units = 72 units):

    0        TiedLayerSpec('embed', EmbeddingPipe)          input_ids [b, s] -> hidden [b, s, h]
    1..L     LayerSpec(ParallelTransformerLayerPipe, i)     hidden -> hidden
    L+1      LayerSpec(FinalLayerNormPipe)                  hidden -> hidden (ln_f)
    L+2      TiedLayerSpec('embed', EmbeddingPipe, forward_fn=embedding_to_logits)
                                                            hidden -> logits [b, s, V/tp]
    loss_fn  bloom_loss(logits, labels)                     labels [b, s] or (labels, loss_mask)

`partition_method="type:transformer|embedding"` weighs the units whose class name matches
(EmbeddingPipe twice, ParallelTransformerLayerPipe L times; FinalLayerNormPipe matches neither), as
BLOOM did. The two 'embed' units share one module per stage; DeepSpeed all-reduces the
word-embedding gradient between the first and last stage (tied_weight_attr). Between stages only
the hidden tensor [b, s, h] travels; ALiBi is recomputed in every layer from its head slopes, and
the causal mask is implicit, so no mask tensor crosses a stage boundary.

Parameter names inside the PipelineModule (DeepSpeed checkpoint files, universal checkpoint):
    tied_modules.embed.word_embeddings.weight         vocab-parallel, dim 0; tied first/last stage
    tied_modules.embed.word_embeddings_layernorm.*    TP-replicated
    {i}.input_layernorm.*, {i}.post_attention_layernorm.*      TP-replicated   (i = 1..L)
    {i}.self_attention.query_key_value.{weight,bias}  column-parallel, dim 0
    {i}.self_attention.dense.weight                   row-parallel, dim 1; .bias TP-replicated
    {i}.mlp.dense_h_to_4h.{weight,bias}               column-parallel, dim 0
    {i}.mlp.dense_4h_to_h.weight                      row-parallel, dim 1; .bias TP-replicated
    {L+1}.weight, {L+1}.bias                          final LayerNorm, TP-replicated
On the last stage (pp > 1) the tied module's embedding LayerNorm is present but unused (it gets no
gradient); the copy on the first stage is the one that trains and is saved (layer_00 file).
"""

from __future__ import annotations

import copy
import os
import re

import torch

from trainer.model.bloom import bloom_loss, model_dims
from trainer.model.layers import Embedding, LayerNorm, ModelDims, ParallelTransformerLayer
from trainer.parallel.groups import ParallelLayout


def _single(inputs):
    """DeepSpeed passes a tensor, or a 1-tuple after activation checkpointing: unwrap it."""
    if isinstance(inputs, (tuple, list)):
        if len(inputs) != 1:
            raise ValueError(f"a BLOOM pipeline layer takes one tensor, got a tuple of {len(inputs)}")
        return inputs[0]
    return inputs


class EmbeddingPipe(Embedding):
    def forward(self, input_ids):
        return super().forward(_single(input_ids))


def embedding_to_logits(embedding: EmbeddingPipe, hidden) -> torch.Tensor:
    """forward_fn of the tied head: hidden [b, s, h] -> logits [b, s, V/tp]."""
    return embedding.logits(_single(hidden))


class ParallelTransformerLayerPipe(ParallelTransformerLayer):
    def forward(self, hidden):
        return super().forward(_single(hidden))


class FinalLayerNormPipe(LayerNorm):
    def __init__(self, dims: ModelDims):
        super().__init__(dims.hidden_size, dims.eps, dims.params_dtype)

    def forward(self, hidden):
        return super().forward(_single(hidden))


def bloom_pipeline_layers(cfg, layout: ParallelLayout | None = None, *, init_seed: int | None = None,
                          params_dtype: torch.dtype = torch.float32) -> list:
    """The LayerSpecs of BLOOM for `deepspeed.pipe.PipelineModule` (nothing is built yet)."""
    from deepspeed.pipe import LayerSpec, TiedLayerSpec

    dims = model_dims(cfg, layout, init_seed=init_seed, params_dtype=params_dtype)
    specs: list = [TiedLayerSpec("embed", EmbeddingPipe, dims, tied_weight_attr=["word_embeddings.weight"])]
    specs += [LayerSpec(ParallelTransformerLayerPipe, dims, i) for i in range(dims.num_layers)]
    specs.append(LayerSpec(FinalLayerNormPipe, dims))
    specs.append(TiedLayerSpec("embed", EmbeddingPipe, dims, forward_fn=embedding_to_logits,
                               tied_weight_attr=["word_embeddings.weight"]))
    return specs


def stage_units(cfg, layout: ParallelLayout, specs: list, stage: int) -> range:
    """The unit indices PipelineModule builds on `stage`, by DeepSpeed's own partition functions
    (its `_partition_layers`, which needs the process groups). `parameters` counts the parameters of
    every unit, i.e. builds them all: an empty range (nothing built ahead)."""
    import regex
    from deepspeed.runtime import utils as ds_utils

    method = cfg.parallel.partition_method.lower()
    if method == "uniform":
        parts = ds_utils.partition_uniform(num_items=len(specs), num_parts=layout.pp)
    elif method.startswith("type:"):
        pattern = regex.compile(method.split(":", 1)[1], regex.IGNORECASE)
        weights = [1 if pattern.search(spec.typename.__name__) else 0 for spec in specs]
        parts = ds_utils.partition_balanced(weights=weights, num_parts=layout.pp)
    else:
        return range(0)
    return range(parts[stage], parts[stage + 1])


def build_stage_units(cfg, layout: ParallelLayout, rank: int) -> dict[int, torch.nn.Module]:
    """The units `rank` of `layout` will hold, built before any process group exists (the warm
    standby: trainer/prepared_start.py), by index; the tied embedding once, under both of its
    indices on a stage that holds both. `build_pipeline_module(..., prebuilt=...)` takes them."""
    from trainer.parallel.groups import building_as

    _, _, stage = layout.coords_of(rank)
    with building_as(layout, rank):
        specs = bloom_pipeline_layers(cfg, layout)
        built: dict[int, torch.nn.Module] = {}
        tied: dict[str, torch.nn.Module] = {}
        for index in stage_units(cfg, layout, specs, stage):
            spec = specs[index]
            key = getattr(spec, "key", None)
            if key is None:
                built[index] = spec.build()
            else:
                built[index] = tied[key] = tied[key] if key in tied else spec.build()
    return built


def with_prebuilt(specs: list, prebuilt: dict[int, torch.nn.Module]) -> list:
    """The specs, each unit of `prebuilt` handed out by its spec instead of built again; the class
    name and the tie key stay, so PipelineModule partitions and ties as it would."""
    ready = []
    for index, spec in enumerate(specs):
        if index in prebuilt:
            spec = copy.copy(spec)
            spec.build = lambda log=False, module=prebuilt[index]: module
        ready.append(spec)
    return ready


def build_pipeline_module(cfg, layout: ParallelLayout, *, init_seed: int | None = None,
                          params_dtype: torch.dtype = torch.float32,
                          activation_checkpoint_interval: int | None = None,
                          partition_method: str | None = None,
                          prebuilt: dict[int, torch.nn.Module] | None = None):
    """The DeepSpeed PipelineModule of BLOOM for this layout (call initialize_model_parallel first).

    Activation checkpointing (cfg.parallel.activation_checkpointing) checkpoints every transformer
    layer (interval 1); only ParallelTransformerLayerPipe units are checkpointed, because
    DeepSpeed's reentrant checkpoint would cut the embedding's gradient (its input is integer ids).
    Build in fp32: the DeepSpeed engine casts the module to bf16 when bf16 is enabled.
    `prebuilt`: units build_stage_units built for this rank (same config and layout, default seed
    and dtype); a unit of this stage that is not there is built here.
    """
    import deepspeed
    import torch.distributed as torch_dist
    from deepspeed.pipe import PipelineModule

    if not torch_dist.is_initialized():
        raise RuntimeError("build_pipeline_module needs torch.distributed (gloo/nccl) initialised first, "
                           "even for one process")
    if not deepspeed.comm.is_initialized():  # DeepSpeed's comm wraps the existing torch process group
        deepspeed.init_distributed(dist_backend=torch_dist.get_backend(), auto_mpi_discovery=False)
    if "LOCAL_RANK" not in os.environ:
        raise RuntimeError("DeepSpeed's PipelineModule reads LOCAL_RANK: set it (the launcher does; 0 for one process)")
    if activation_checkpoint_interval is None:
        activation_checkpoint_interval = 1 if cfg.parallel.activation_checkpointing else 0
    module = PipelineModule(
        layers=with_prebuilt(bloom_pipeline_layers(cfg, layout, init_seed=init_seed, params_dtype=params_dtype),
                             prebuilt or {}),
        loss_fn=bloom_loss,
        topology=layout.deepspeed_topology(),
        partition_method=partition_method or cfg.parallel.partition_method,
        activation_checkpoint_interval=activation_checkpoint_interval,
        checkpointable_layers=["ParallelTransformerLayerPipe"],
    )
    # PipelineModule.forward only runs the layer blocks it precomputed for the interval; the pipeline
    # engine does that, but a module used directly (tests, evaluation) would silently skip every
    # layer and return its input. set_checkpoint_interval precomputes them.
    if activation_checkpoint_interval > 0:
        module.set_checkpoint_interval(activation_checkpoint_interval)
    return module


# --- universal checkpoint (DeepSpeed ds_to_universal) ----------------------------------------------
_REPLICATED = [
    r"^tied_modules\.embed\.word_embeddings_layernorm\.(weight|bias)$",
    r"^\d+\.(input_layernorm|post_attention_layernorm)\.(weight|bias)$",
    r"^\d+\.self_attention\.dense\.bias$",
    r"^\d+\.mlp\.dense_4h_to_h\.bias$",
    r"^\d+\.(weight|bias)$",  # the final LayerNorm unit
]
_ROW_PARALLEL = [r"^\d+\.self_attention\.dense\.weight$", r"^\d+\.mlp\.dense_4h_to_h\.weight$"]
_VOCAB = [r"^tied_modules\.embed\.word_embeddings\.weight$"]
# Everything in the tied module exists on the first AND last stage; ds_to_universal must take the
# first stage's copy only (the last stage's embedding LayerNorm is unused there: never trained).
_PIPELINE_REPLICATED = [r"^tied_modules\.embed\."]


def universal_checkpoint_info(cfg, layout: ParallelLayout) -> dict:
    """DeepSpeed's UNIVERSAL_CHECKPOINT_INFO for this model: save it in the client state of every
    checkpoint (`engine.save_checkpoint(..., client_state={UNIVERSAL_CHECKPOINT_INFO: info})`).

    Column-parallel weights/biases are concatenated on dim 0 (DeepSpeed's default), row-parallel
    weights on dim 1, replicated parameters taken from TP rank 0. The vocabulary is kept at the
    saving run's padded size (original_vocab_size = padded size): its padded rows are trained
    parameters, so stripping them would change the loss after a resume; a target layout with a
    larger padded vocab gets zero rows appended by DeepSpeed. Keep `model.padded_vocab_size` fixed
    across layouts for exactly continuous losses.
    """
    from deepspeed.checkpoint.constants import (
        ORIGINAL_VOCAB_SIZE,
        PADDED_VOCAB_SIZE,
        PARAMETER_WITH_ROW_PARALLELISM_PATTERNS,
        PIPELINE_REPLICATED_PARAMETER_PATTERNS,
        TP_REPLICATED_PARAMETER_PATTERNS,
        UNIVERSAL_CHECKPOINT_VERSION_KEY,
        UNIVERSAL_CHECKPOINT_VERSION_VALUE,
        VOCABULARY_PARAMETER_PATTERNS,
    )

    padded = cfg.model.padded_vocab(layout.tp)
    return {
        UNIVERSAL_CHECKPOINT_VERSION_KEY: UNIVERSAL_CHECKPOINT_VERSION_VALUE,
        TP_REPLICATED_PARAMETER_PATTERNS: list(_REPLICATED),
        PARAMETER_WITH_ROW_PARALLELISM_PATTERNS: list(_ROW_PARALLEL),
        VOCABULARY_PARAMETER_PATTERNS: list(_VOCAB),
        PIPELINE_REPLICATED_PARAMETER_PATTERNS: list(_PIPELINE_REPLICATED),
        ORIGINAL_VOCAB_SIZE: padded,
        PADDED_VOCAB_SIZE: padded,
    }


def pipeline_key_to_model_key(key: str, num_layers: int) -> str:
    """A PipelineModule parameter name -> the BloomModel name (for converters and checks)."""
    if key.startswith("tied_modules.embed."):
        return "embedding." + key[len("tied_modules.embed."):]
    match = re.match(r"^(\d+)\.(.*)$", key)
    if not match:
        raise KeyError(f"not a BLOOM pipeline parameter name: {key!r}")
    unit, rest = int(match.group(1)), match.group(2)
    if 1 <= unit <= num_layers:
        return f"h.{unit - 1}.{rest}"
    if unit == num_layers + 1:
        return f"ln_f.{rest}"
    raise KeyError(f"pipeline unit {unit} of {key!r} holds no parameters (the model has {num_layers} layers)")
