"""BloomModel: the whole BLOOM as one plain nn.Module (single process, tests, conversion).

    input_ids [b, s] -> logits [b, s, V_padded / tp]   (this TP rank's vocabulary slice)

The pipeline version (`pipeline.py`) is built from the same layer classes with the same parameter
names and init seeds, so both give the same weights for the same config and seed.
"""

from __future__ import annotations

import torch
from torch import nn

from trainer.model.layers import Embedding, LayerNorm, ModelDims, ParallelTransformerLayer
from trainer.parallel import groups
from trainer.parallel.cross_entropy import vocab_parallel_cross_entropy
from trainer.parallel.groups import ParallelLayout


def model_dims(cfg, layout: ParallelLayout | None = None, *, init_seed: int | None = None,
               params_dtype: torch.dtype = torch.float32,
               apply_residual_connection_post_layernorm: bool = False) -> ModelDims:
    """Sizes + init settings from a RunConfig, checked against the TP layout in force."""
    layout = layout or groups.get_layout()
    if layout.tp != groups.get_tp_world_size():
        raise RuntimeError(
            f"the layout has tp = {layout.tp} but the process groups in force have tp = "
            f"{groups.get_tp_world_size()}: call trainer.parallel.initialize_model_parallel(layout) first")
    padded_vocab = cfg.model.padded_vocab(layout.tp)
    layout.check_model(cfg.model.num_attention_heads, cfg.model.ffn_size, padded_vocab)
    return ModelDims(cfg.model, padded_vocab, init_seed=cfg.seed if init_seed is None else init_seed,
                     params_dtype=params_dtype,
                     apply_residual_connection_post_layernorm=apply_residual_connection_post_layernorm)


def bloom_loss(logits_local: torch.Tensor, labels) -> torch.Tensor:
    """Mean token loss (fp32) from logits [b, s, V/tp] and labels [b, s], or (labels, loss_mask).

    This is also the pipeline's `loss_fn` (DeepSpeed calls loss_fn(outputs, labels))."""
    loss_mask = None
    if isinstance(labels, (tuple, list)):
        labels, loss_mask = labels
    losses = vocab_parallel_cross_entropy(logits_local, labels)  # [b, s] fp32
    if loss_mask is None:
        return losses.mean()
    loss_mask = loss_mask.float()
    return (losses * loss_mask).sum() / loss_mask.sum().clamp(min=1.0)


class BloomModel(nn.Module):
    """BLOOM: embedding (+LN) -> L pre-LN blocks with ALiBi -> final LN -> tied output projection.

    Parameter names (below `transformer.` in transformers' BloomForCausalLM):
      embedding.word_embeddings.weight            [V/tp, h]   vocab-parallel (dim 0)
      embedding.word_embeddings_layernorm.*       [h]         replicated
      h.{i}.input_layernorm.*, post_attention_layernorm.*     replicated
      h.{i}.self_attention.query_key_value.*      [3h/tp, h]  column-parallel, [heads, 3, hd] rows
      h.{i}.self_attention.dense.weight           [h, h/tp]   row-parallel (dim 1); bias replicated
      h.{i}.mlp.dense_h_to_4h.*                   [4h/tp, h]  column-parallel
      h.{i}.mlp.dense_4h_to_h.weight              [h, 4h/tp]  row-parallel; bias replicated
      ln_f.*                                      [h]         replicated
    """

    def __init__(self, cfg, layout: ParallelLayout | None = None, *, init_seed: int | None = None,
                 params_dtype: torch.dtype = torch.float32, apply_residual_connection_post_layernorm: bool = False):
        super().__init__()
        dims = model_dims(cfg, layout, init_seed=init_seed, params_dtype=params_dtype,
                          apply_residual_connection_post_layernorm=apply_residual_connection_post_layernorm)
        self.dims = dims
        self.embedding = Embedding(dims)
        self.h = nn.ModuleList(ParallelTransformerLayer(dims, i) for i in range(dims.num_layers))
        self.ln_f = LayerNorm(dims.hidden_size, dims.eps, params_dtype)

    def hidden_states(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [b, s] -> final-LN hidden states [b, s, h]."""
        hidden = self.embedding(input_ids)
        for layer in self.h:
            hidden = layer(hidden)
        return self.ln_f(hidden)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embedding.logits(self.hidden_states(input_ids))

    def loss(self, input_ids: torch.Tensor, labels) -> torch.Tensor:
        return bloom_loss(self(input_ids), labels)
