"""Our BLOOM vs transformers' BloomForCausalLM with the same (converted) weights, fp32.

Weights are randomised well beyond the init scale (LayerNorm weights/biases too) so that every
parameter matters; the max abs error of logits and of gradients is printed and must be <= 1e-5.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import bloom_kernels
from tests.model.bloom_configs import tiny_config
from trainer.convert_hf import bloom_config_for, from_hf_state_dict, hf_key_for, to_hf_state_dict
from trainer.model import BloomModel, bloom_loss

transformers = pytest.importorskip("transformers")

TOL = 1e-5


def randomised(model: BloomModel, seed: int) -> BloomModel:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            if "layernorm" in name or name.startswith("ln_f"):
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.3 * noise)
            else:
                p.copy_(0.08 * noise)
    return model


def pair(cfg, seed: int = 0):
    ours = randomised(BloomModel(cfg), seed)
    hf = transformers.BloomForCausalLM(bloom_config_for(cfg))
    hf.load_state_dict(to_hf_state_dict(ours.state_dict()))
    return ours, hf


@pytest.mark.parametrize(
    "model, attention",
    [
        ({"num_attention_heads": 6, "hidden_size": 48}, "materialized"),  # non-power-of-2 heads
        ({"num_attention_heads": 4, "hidden_size": 64, "num_layers": 3}, "materialized"),
        ({"num_attention_heads": 6, "hidden_size": 48}, "chunked"),  # bloom_kernels.attention path
    ],
)
def test_logits_match_transformers(model, attention):
    cfg = tiny_config(**model)
    ours, hf = pair(cfg)
    ours.eval()
    hf.eval()
    ids = torch.randint(0, cfg.model.vocab_size, (3, cfg.model.seq_length), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), bloom_kernels.kernel_path("reference", attention=attention):
        ours_logits = ours(ids)
        hf_logits = hf(ids).logits
    err = (ours_logits - hf_logits).abs().max().item()
    print(f"logits max abs err vs transformers ({model}, attention={attention}): {err:.3e} "
          f"(logit scale {hf_logits.abs().max().item():.2f})")
    assert ours_logits.shape == hf_logits.shape == (3, cfg.model.seq_length, cfg.model.padded_vocab(1))
    assert err <= TOL


def test_gradients_match_transformers():
    cfg = tiny_config()
    ours, hf = pair(cfg, seed=3)
    ours.train()
    hf.train()  # dropout is 0 in the config: train mode must be deterministic
    ids = torch.randint(0, cfg.model.vocab_size, (2, cfg.model.seq_length), generator=torch.Generator().manual_seed(2))
    labels = torch.roll(ids, -1, dims=1)
    with bloom_kernels.kernel_path("reference", attention="materialized"):
        loss = bloom_loss(ours(ids), labels)
    hf_logits = hf(ids).logits
    hf_loss = F.cross_entropy(hf_logits.reshape(-1, hf_logits.shape[-1]), labels.reshape(-1))
    loss.backward()
    hf_loss.backward()
    hf_params = dict(hf.named_parameters())
    worst = 0.0
    for name, p in ours.named_parameters():
        hf_name = hf_key_for(name)
        worst = max(worst, (p.grad - hf_params[hf_name].grad).abs().max().item())
    print(f"loss ours {loss.item():.6f} transformers {hf_loss.item():.6f}; max abs grad err {worst:.3e}")
    assert abs(loss.item() - hf_loss.item()) <= TOL
    assert worst <= TOL


def test_converter_round_trips_exactly():
    cfg = tiny_config()
    ours = randomised(BloomModel(cfg), 5).state_dict()
    hf = to_hf_state_dict(ours)
    assert hf["lm_head.weight"] is hf["transformer.word_embeddings.weight"]
    back = from_hf_state_dict(hf, cfg.model.padded_vocab(1))
    assert back.keys() == ours.keys()
    assert all(torch.equal(back[k], ours[k]) for k in ours)
    # transformers -> ours -> transformers, from a randomly initialised BloomForCausalLM
    hf_model = transformers.BloomForCausalLM(bloom_config_for(cfg))
    hf_sd = hf_model.state_dict()
    again = to_hf_state_dict(from_hf_state_dict(hf_sd, cfg.model.padded_vocab(1)))
    assert again.keys() == hf_sd.keys()
    assert all(torch.equal(again[k], hf_sd[k]) for k in hf_sd)


def test_converter_vocab_padding():
    cfg = tiny_config()  # vocab 250 padded to 256
    padded = cfg.model.padded_vocab(1)
    ours = randomised(BloomModel(cfg), 6)
    trimmed = to_hf_state_dict(ours.state_dict(), vocab_size=cfg.model.vocab_size)
    assert trimmed["lm_head.weight"].shape[0] == cfg.model.vocab_size == 250
    hf = transformers.BloomForCausalLM(bloom_config_for(cfg, vocab_size=cfg.model.vocab_size))
    hf.load_state_dict(trimmed)
    back = from_hf_state_dict(hf.state_dict(), padded)
    emb = back["embedding.word_embeddings.weight"]
    assert emb.shape[0] == padded
    assert torch.equal(emb[:250], ours.state_dict()["embedding.word_embeddings.weight"][:250])
    assert torch.count_nonzero(emb[250:]) == 0
    # Over the real vocabulary, the trimmed transformers model and ours agree.
    ids = torch.randint(0, 250, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        err = (ours.eval()(ids)[..., :250] - hf.eval()(ids).logits).abs().max().item()
    print(f"trimmed-vocab logits max abs err: {err:.3e}")
    assert err <= TOL
    with pytest.raises(ValueError, match="padded_vocab_size"):
        from_hf_state_dict(hf.state_dict(), 128)


def test_conversion_refuses_what_transformers_cannot_hold():
    with pytest.raises(ValueError, match="4 \\* hidden"):
        bloom_config_for(tiny_config(ffn_hidden_size=100))
    with pytest.raises(ValueError, match="alibi"):
        bloom_config_for(tiny_config(alibi=False))


def test_converter_command_line_round_trip(tmp_path):
    from orchestrator.plan.config import dump_config
    from trainer.convert_hf import _main

    cfg = tiny_config()
    (tmp_path / "run.yaml").write_text(dump_config(cfg))
    ours = randomised(BloomModel(cfg), 8).state_dict()
    torch.save(ours, tmp_path / "model.pt")
    assert _main(["to-hf", "--config", str(tmp_path / "run.yaml"), "--ours", str(tmp_path / "model.pt"),
                  "--out", str(tmp_path / "hf")]) == 0
    assert _main(["from-hf", "--config", str(tmp_path / "run.yaml"), "--hf", str(tmp_path / "hf"),
                  "--out", str(tmp_path / "back.pt")]) == 0
    back = torch.load(tmp_path / "back.pt", weights_only=True)
    assert back.keys() == ours.keys()
    assert all(torch.equal(back[k], ours[k]) for k in ours)
