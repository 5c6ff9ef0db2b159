"""Convert between our BLOOM state dict (tp = 1, full tensors) and transformers' BloomForCausalLM.

    ours                                         transformers (BloomForCausalLM)
    embedding.word_embeddings.weight   [Vp, h]   transformer.word_embeddings.weight, lm_head.weight (tied)
    embedding.word_embeddings_layernorm.*        transformer.word_embeddings_layernorm.*
    h.{i}.<same names>                           transformer.h.{i}.<same names>
    ln_f.*                                       transformer.ln_f.*

The fused QKV layout is BLOOM's in both ([heads, 3, head_dim] rows), so tensors map one to one.
Vocabulary: ours is padded (Megatron, e.g. 250,680 -> 250,880). To transformers we keep the padded
rows by default (as bigscience/bloom does: vocab_size 250,880), or trim to `vocab_size`. From
transformers, a smaller vocabulary is padded with zero rows (their logits are 0: use the padded size
in transformers too if you need identical logits).

Pipeline checkpoints: `model_state_from_pipeline` renames PipelineModule keys (tp = 1 or merged by
DeepSpeed's universal checkpoint) to ours.

CLI (weights as torch .pt files of our state dict, transformers models as save_pretrained dirs):
    python -m trainer.convert_hf to-hf   --config run.yaml --ours model.pt --out hf_dir [--vocab-size N]
    python -m trainer.convert_hf from-hf --config run.yaml --hf hf_dir --out model.pt
"""

from __future__ import annotations

import argparse
import sys

import torch

HF_PREFIX = "transformer."


def bloom_config_for(cfg, *, vocab_size: int | None = None, tp: int = 1):
    """A transformers BloomConfig with the sizes of `cfg.model` (vocab: padded unless given)."""
    from transformers import BloomConfig

    m = cfg.model
    if m.ffn_size != 4 * m.hidden_size:
        raise ValueError(f"transformers' BLOOM has an MLP of 4 * hidden = {4 * m.hidden_size}, "
                         f"but model.ffn_hidden_size = {m.ffn_size}: this model cannot be converted")
    if not (m.alibi and m.embedding_layernorm):
        raise ValueError("transformers' BLOOM always has ALiBi and the embedding LayerNorm: set model.alibi "
                         "and model.embedding_layernorm to true to convert")
    return BloomConfig(
        vocab_size=vocab_size or m.padded_vocab(tp),
        hidden_size=m.hidden_size,
        n_layer=m.num_layers,
        n_head=m.num_attention_heads,
        layer_norm_epsilon=m.layernorm_epsilon,
        initializer_range=m.init_std,
        hidden_dropout=m.hidden_dropout,
        attention_dropout=m.attention_dropout,
        apply_residual_connection_post_layernorm=False,
        pretraining_tp=1,
        slow_but_exact=False,
        use_cache=False,
    )


def hf_key_for(key: str) -> str:
    """Our parameter name -> transformers' (BloomForCausalLM)."""
    if key.startswith("embedding."):
        return HF_PREFIX + key[len("embedding."):]
    if key.startswith(("h.", "ln_f.")):
        return HF_PREFIX + key
    raise KeyError(f"unexpected parameter {key!r} in our BLOOM state dict")


def our_key_for(key: str) -> str | None:
    """None for keys we drop (lm_head: tied)."""
    if key == "lm_head.weight":
        return None
    if not key.startswith(HF_PREFIX):
        key = HF_PREFIX + key  # a BloomModel (no LM head) state dict
    rest = key[len(HF_PREFIX):]
    if rest.startswith(("word_embeddings.", "word_embeddings_layernorm.")):
        return "embedding." + rest
    if rest.startswith(("h.", "ln_f.")):
        return rest
    raise KeyError(f"unexpected parameter {key!r} in a transformers BLOOM state dict")


def to_hf_state_dict(ours: dict[str, torch.Tensor], *, vocab_size: int | None = None) -> dict[str, torch.Tensor]:
    """Our full (tp = 1) state dict -> BloomForCausalLM's. `vocab_size` trims the padded rows."""
    hf: dict[str, torch.Tensor] = {}
    for key, value in ours.items():
        hf_key = hf_key_for(key)
        if key == "embedding.word_embeddings.weight" and vocab_size is not None:
            if vocab_size > value.shape[0]:
                raise ValueError(f"vocab_size {vocab_size} exceeds the embedding's {value.shape[0]} rows")
            value = value[:vocab_size]
        hf[hf_key] = value.clone()
    if HF_PREFIX + "word_embeddings.weight" in hf:
        hf["lm_head.weight"] = hf[HF_PREFIX + "word_embeddings.weight"]  # tied: the same tensor
    return hf


def from_hf_state_dict(hf: dict[str, torch.Tensor], padded_vocab_size: int) -> dict[str, torch.Tensor]:
    """BloomForCausalLM's (or BloomModel's) state dict -> ours, padding the vocabulary with zero rows."""
    ours: dict[str, torch.Tensor] = {}
    for key, value in hf.items():
        our_key = our_key_for(key)
        if our_key is None:
            continue
        if our_key == "embedding.word_embeddings.weight":
            rows = value.shape[0]
            if rows > padded_vocab_size:
                raise ValueError(f"the checkpoint has {rows} vocabulary rows but our padded vocab is "
                                 f"{padded_vocab_size}: set model.padded_vocab_size >= {rows}")
            if rows < padded_vocab_size:
                value = torch.cat([value, value.new_zeros(padded_vocab_size - rows, value.shape[1])])
        ours[our_key] = value.clone()
    if "lm_head.weight" in hf and not torch.equal(hf["lm_head.weight"], hf[HF_PREFIX + "word_embeddings.weight"]):
        raise ValueError("lm_head.weight differs from the word embedding: BLOOM ties them, this checkpoint does not")
    return ours


def model_state_from_pipeline(pipe_state: dict[str, torch.Tensor], num_layers: int) -> dict[str, torch.Tensor]:
    """PipelineModule parameter names (full tensors) -> BloomModel names."""
    from trainer.model.pipeline import pipeline_key_to_model_key

    return {pipeline_key_to_model_key(k, num_layers): v for k, v in pipe_state.items()}


def _main(argv: list[str] | None = None) -> int:
    from orchestrator.plan.config import load_config

    parser = argparse.ArgumentParser(prog="python -m trainer.convert_hf", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="direction", required=True)
    to_hf = sub.add_parser("to-hf", help="our model.pt -> a transformers save_pretrained directory")
    to_hf.add_argument("--config", required=True)
    to_hf.add_argument("--ours", required=True)
    to_hf.add_argument("--out", required=True)
    to_hf.add_argument("--vocab-size", type=int, default=None, help="trim the padded vocabulary to this size")
    from_hf = sub.add_parser("from-hf", help="a transformers directory -> our model.pt")
    from_hf.add_argument("--config", required=True)
    from_hf.add_argument("--hf", required=True)
    from_hf.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    from transformers import BloomForCausalLM

    cfg = load_config(args.config)
    if args.direction == "to-hf":
        ours = torch.load(args.ours, map_location="cpu", weights_only=True)
        model = BloomForCausalLM(bloom_config_for(cfg, vocab_size=args.vocab_size))
        model.load_state_dict(to_hf_state_dict(ours, vocab_size=args.vocab_size))
        model.save_pretrained(args.out)
    else:
        model = BloomForCausalLM.from_pretrained(args.hf)
        torch.save(from_hf_state_dict(model.state_dict(), cfg.model.padded_vocab(1)), args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
