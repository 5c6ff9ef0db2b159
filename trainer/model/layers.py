"""BLOOM's building blocks, made of tensor-parallel layers (exact at tp = 1).

Activations between blocks are [b, s, h] (batch first, as transformers' BLOOM), full width and
replicated on the TP ranks. Inside a block the attention heads and the MLP's 4h features are split
over TP. Fused ops (LayerNorm, scale+mask+softmax, bias+GeLU, attention) go through `kernels`.

Parameter names equal transformers' BLOOM names below `transformer.` (see convert_hf.py), and the
per-parameter init seeds are derived from those names, so the same seed gives the same weights
whatever the tp/pp layout that builds them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

import bloom_kernels
from bloom_kernels.bias_gelu.reference import gelu_reference
from trainer.parallel import groups
from trainer.parallel.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    mark_tp_replicated,
)


class LayerNorm(nn.Module):
    """LayerNorm through `bloom_kernels.layer_norm` (fp32 statistics). Its parameters are replicated on TP
    ranks (marked `tp_replicated`)."""

    def __init__(self, hidden_size: int, eps: float, params_dtype: torch.dtype = torch.float32):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=params_dtype))
        self.bias = nn.Parameter(torch.zeros(hidden_size, dtype=params_dtype))
        mark_tp_replicated(self.weight)
        mark_tp_replicated(self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return bloom_kernels.layer_norm(x, self.weight, self.bias, self.eps)


class ModelDims:
    """The sizes every block needs, read once from `cfg.model` (a trainer-side view of the config)."""

    def __init__(self, model_cfg, padded_vocab_size: int, *, init_seed: int,
                 apply_residual_connection_post_layernorm: bool = False,
                 params_dtype: torch.dtype = torch.float32):
        m = model_cfg
        self.num_layers = m.num_layers
        self.hidden_size = m.hidden_size
        self.num_heads = m.num_attention_heads
        self.head_dim = m.hidden_size // m.num_attention_heads
        self.ffn_size = m.ffn_size
        self.padded_vocab_size = padded_vocab_size
        self.vocab_size = m.vocab_size
        self.alibi = m.alibi
        self.embedding_layernorm = m.embedding_layernorm
        self.eps = m.layernorm_epsilon
        self.init_std = m.init_std
        # Megatron's scaled init for the layers that write into the residual stream: std / sqrt(2L).
        self.output_init_std = m.init_std / math.sqrt(2.0 * m.num_layers)
        self.hidden_dropout = m.hidden_dropout
        self.attention_dropout = m.attention_dropout
        self.init_seed = init_seed
        self.apply_residual_connection_post_layernorm = apply_residual_connection_post_layernorm
        self.params_dtype = params_dtype
        if self.head_dim * self.num_heads != self.hidden_size:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_attention_heads {self.num_heads}")


class Embedding(nn.Module):
    """input_ids [b, s] -> word embedding (vocab-parallel, all-reduced) -> embedding LayerNorm -> [b, s, h]."""

    def __init__(self, dims: ModelDims):
        super().__init__()
        self.word_embeddings = VocabParallelEmbedding(
            dims.padded_vocab_size, dims.hidden_size, init_std=dims.init_std, init_seed=dims.init_seed,
            name="word_embeddings", params_dtype=dims.params_dtype)
        # BLOOM's LayerNorm right after the embedding (StableEmbedding), on full rows: after the all-reduce.
        self.word_embeddings_layernorm = (
            LayerNorm(dims.hidden_size, dims.eps, dims.params_dtype) if dims.embedding_layernorm else None)
        self.hidden_dropout = dims.hidden_dropout

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.word_embeddings(input_ids)
        if self.word_embeddings_layernorm is not None:
            hidden = self.word_embeddings_layernorm(hidden)
        return F.dropout(hidden, p=self.hidden_dropout, training=self.training)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The tied output projection: hidden [b, s, h] -> logits [b, s, V/tp] (this rank's vocab slice)."""
        from trainer.parallel.tensor_parallel import parallel_lm_logits

        return parallel_lm_logits(hidden, self.word_embeddings.weight)


class ParallelAttention(nn.Module):
    """Self-attention with ALiBi; heads split over TP ranks.

    query_key_value is column-parallel with BLOOM's fused layout: output features ordered
    [heads, 3 (q,k,v), head_dim], so a contiguous slice of rows is whole heads with their q, k, v
    (transformers' weights map directly, and TP slicing is plain chunking).
    """

    def __init__(self, dims: ModelDims, layer_number: int):
        super().__init__()
        h = dims.hidden_size
        prefix = f"h.{layer_number}.self_attention"
        self.query_key_value = ColumnParallelLinear(
            h, 3 * h, init_std=dims.init_std, init_seed=dims.init_seed, name=f"{prefix}.query_key_value",
            params_dtype=dims.params_dtype)
        self.dense = RowParallelLinear(
            h, h, input_is_parallel=True, init_std=dims.output_init_std, init_seed=dims.init_seed,
            name=f"{prefix}.dense", params_dtype=dims.params_dtype)
        tp = groups.get_tp_world_size()
        self.num_heads = dims.num_heads
        self.heads_per_rank = dims.num_heads // tp
        self.head_dim = dims.head_dim
        self.tp_rank, self.tp_size = groups.get_tp_rank(), tp
        self.softmax_scale = 1.0 / math.sqrt(dims.head_dim)
        self.use_alibi = dims.alibi
        self.attention_dropout = dims.attention_dropout
        self._slopes: dict[torch.device, torch.Tensor] = {}  # not a buffer: must stay fp32 under .bfloat16()
        self._alibi_cache: tuple[tuple, torch.Tensor] | None = None  # ((b, s, device), [b*nh, 1, s])

    def alibi_slopes(self, device: torch.device) -> torch.Tensor:
        """fp32 [heads_per_rank]: this rank's slice of the slopes of all heads (zeros without ALiBi)."""
        if device not in self._slopes:
            if self.use_alibi:
                slopes = bloom_kernels.alibi_slopes_for_rank(self.num_heads, self.tp_rank, self.tp_size)
            else:
                slopes = torch.zeros(self.heads_per_rank, dtype=torch.float32)
            self._slopes[device] = slopes.to(device)
        return self._slopes[device]

    def _alibi(self, slopes: torch.Tensor, b: int, s: int, device: torch.device) -> torch.Tensor:
        """fp32 [b*nh, 1, s]: slope * key position per (sample, head) row, kept for the last (b, s)."""
        key = (b, s, device)
        if self._alibi_cache is None or self._alibi_cache[0] != key:
            positions = torch.arange(s, device=device, dtype=torch.float32)
            self._alibi_cache = (key, (slopes[:, None, None] * positions).repeat(b, 1, 1))
        return self._alibi_cache[1]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        b, s, _ = hidden.shape
        nh, hd = self.heads_per_rank, self.head_dim
        qkv, _ = self.query_key_value(hidden)  # [b, s, nh * 3 * hd]
        qkv = qkv.view(b, s, nh, 3, hd)
        q, k, v = (qkv[..., i, :].transpose(1, 2) for i in range(3))  # each [b, nh, s, hd]
        slopes = self.alibi_slopes(hidden.device)

        dropout = self.attention_dropout if self.training else 0.0
        if dropout == 0.0 and bloom_kernels.current_attention_impl(hidden.device.type) != "materialized":
            context = bloom_kernels.attention(q, k, v, slopes, causal=True, softmax_scale=self.softmax_scale)
        else:
            # The standard path, as transformers': scores [b*nh, s, s], ALiBi = slope * key position
            # [b*nh, 1, s] (softmax is invariant to the per-row constant), fused scale+mask+softmax.
            q3 = q.reshape(b * nh, s, hd)
            k3 = k.reshape(b * nh, s, hd)
            v3 = v.reshape(b * nh, s, hd)
            alibi = self._alibi(slopes, b, s, hidden.device)  # [b*nh, 1, s] fp32
            if bloom_kernels.current_path(hidden.device.type) == "reference" and q3.dtype == torch.float32:
                # Plain torch (CPU): scale and ALiBi ride in the GEMM (baddbmm, as transformers), the
                # softmax then only adds the causal mask. The Triton kernel fuses them itself.
                scores = torch.baddbmm(alibi, q3, k3.transpose(1, 2), beta=1.0, alpha=self.softmax_scale)
                probs = bloom_kernels.scale_mask_softmax(scores, 1.0, None, causal=True)
            else:
                scores = torch.bmm(q3, k3.transpose(1, 2))
                probs = bloom_kernels.scale_mask_softmax(scores, self.softmax_scale, alibi, causal=True)
            probs = F.dropout(probs, p=dropout, training=self.training)
            context = torch.bmm(probs, v3).view(b, nh, s, hd)
        context = context.transpose(1, 2).reshape(b, s, nh * hd)  # [b, s, h/tp], heads in order
        out, _ = self.dense(context)  # all-reduced over TP, bias added once
        return out


class ParallelMLP(nn.Module):
    """h -> 4h (column-parallel, bias fused into tanh-GeLU) -> h (row-parallel)."""

    def __init__(self, dims: ModelDims, layer_number: int):
        super().__init__()
        prefix = f"h.{layer_number}.mlp"
        self.dense_h_to_4h = ColumnParallelLinear(
            dims.hidden_size, dims.ffn_size, skip_bias_add=True, init_std=dims.init_std,
            init_seed=dims.init_seed, name=f"{prefix}.dense_h_to_4h", params_dtype=dims.params_dtype)
        self.dense_4h_to_h = RowParallelLinear(
            dims.ffn_size, dims.hidden_size, input_is_parallel=True, init_std=dims.output_init_std,
            init_seed=dims.init_seed, name=f"{prefix}.dense_4h_to_h", params_dtype=dims.params_dtype)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if hidden.dtype == torch.float32 and bloom_kernels.current_path(hidden.device.type) == "reference":
            # Plain torch (CPU): the only place to fuse the bias into is the GEMM itself (addmm, as
            # nn.Linear), then GeLU. (In bf16 the GEMM would round x + bias to bf16 first, which the
            # bias_gelu definition does not, so bf16 keeps the path below.)
            intermediate, _ = self.dense_h_to_4h(hidden, skip_bias_add=False)  # [b, s, 4h/tp]
            out, _ = self.dense_4h_to_h(gelu_reference(intermediate))
            return out
        intermediate, bias = self.dense_h_to_4h(hidden)  # [b, s, 4h/tp], bias [4h/tp]
        out, _ = self.dense_4h_to_h(bloom_kernels.bias_gelu(intermediate, bias))
        return out


class ParallelTransformerLayer(nn.Module):
    """BLOOM's pre-LN block: hidden [b, s, h] -> [b, s, h]."""

    def __init__(self, dims: ModelDims, layer_number: int):
        super().__init__()
        self.layer_number = layer_number
        self.input_layernorm = LayerNorm(dims.hidden_size, dims.eps, dims.params_dtype)
        self.self_attention = ParallelAttention(dims, layer_number)
        self.post_attention_layernorm = LayerNorm(dims.hidden_size, dims.eps, dims.params_dtype)
        self.mlp = ParallelMLP(dims, layer_number)
        self.hidden_dropout = dims.hidden_dropout
        self.residual_post_ln = dims.apply_residual_connection_post_layernorm

    def _dropout_add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return residual + F.dropout(x, p=self.hidden_dropout, training=self.training)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        ln_out = self.input_layernorm(hidden)
        residual = ln_out if self.residual_post_ln else hidden
        attention_out = self._dropout_add(self.self_attention(ln_out), residual)
        ln_out = self.post_attention_layernorm(attention_out)
        residual = ln_out if self.residual_post_ln else attention_out
        return self._dropout_add(self.mlp(ln_out), residual)
