"""The BLOOM model, Megatron-style: built from tensor-parallel-aware layers that are exact at tp = 1.

One way, used everywhere: every projection is a `ColumnParallelLinear` / `RowParallelLinear`, the
word embedding is a `VocabParallelEmbedding` (its LayerNorm after the all-reduce), the logits stay
split by vocabulary and go to `vocab_parallel_cross_entropy` (trainer.parallel). At tp = 1 these
layers are plain linear/embedding layers and no collective runs, so the single-process model is the
same code as the 3D-parallel one. Tensor parallelism is therefore not "applied" to a model: the
layout in force when the model is built (trainer.parallel.initialize_model_parallel) decides each
rank's slices. Pipeline and data parallelism are DeepSpeed's (PipelineModule, ZeRO-1).

Two entry points over the same layer classes, same parameter names, same init seeds:
    BloomModel(cfg, layout)                 plain nn.Module: input_ids [b, s] -> logits [b, s, V/tp]
    build_pipeline_module(cfg, layout)      DeepSpeed PipelineModule (bloom_pipeline_layers + bloom_loss)

Weights are identical across layouts for a given seed: every parameter's full master value is drawn
from its own generator seeded by (cfg.seed, parameter name), then sliced for this TP rank.

Numerics match transformers' BloomForCausalLM (tests/model): convert_hf.py maps weights both ways.
Activations are [b, s, h]. ALiBi slopes are per head for any head count, sliced per TP rank.
"""

from trainer.model.bloom import BloomModel, bloom_loss, model_dims
from trainer.model.layers import (
    Embedding,
    LayerNorm,
    ModelDims,
    ParallelAttention,
    ParallelMLP,
    ParallelTransformerLayer,
)
from trainer.model.pipeline import (
    EmbeddingPipe,
    FinalLayerNormPipe,
    ParallelTransformerLayerPipe,
    bloom_pipeline_layers,
    build_pipeline_module,
    embedding_to_logits,
    pipeline_key_to_model_key,
    universal_checkpoint_info,
)

__all__ = [
    "BloomModel", "Embedding", "EmbeddingPipe", "FinalLayerNormPipe", "LayerNorm", "ModelDims",
    "ParallelAttention", "ParallelMLP", "ParallelTransformerLayer", "ParallelTransformerLayerPipe",
    "bloom_loss", "bloom_pipeline_layers", "build_pipeline_module", "embedding_to_logits", "model_dims",
    "pipeline_key_to_model_key", "universal_checkpoint_info",
]
