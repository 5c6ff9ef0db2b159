"""The whole BLOOM model gives the same loss and gradients on every kernel path (CPU).

Paths compared with the reference path (reference kernels, materialised attention):
  triton (auto attention -> flash kernel), triton with materialised attention (-> Triton
  scale+mask+softmax), and reference with chunked attention. The Triton kernels run interpreted
  (TRITON_INTERPRET=1, see conftest.py), so the model is tiny: 2 layers, hidden 48, 6 heads of 8,
  16 tokens, batch 2.
Tolerances: fp32, elementwise rtol 1e-4 of each tensor's max (bloom_kernels/testing.py rule): each op
  agrees to ~1e-6 and a 2-layer model amplifies that by ~10. bf16: relative Frobenius error of
  each gradient <= 2e-2 and loss within 0.5%: every op rounds its output to bf16 (2**-9 relative),
  the paths round different intermediates, and those differences compound through the layers.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from bloom_kernels import dispatch  # noqa: E402
from bloom_kernels.testing import compare_paths  # noqa: E402

PATHS = [("triton", None), ("triton", "materialized"), ("reference", "chunked")]


@pytest.fixture(scope="module")
def model_api():
    try:
        dispatch.triton_ops("cpu")
    except RuntimeError as exc:
        pytest.skip(f"Triton interpreter unavailable in this process: {exc}")
    tiny_config = pytest.importorskip("tests.model.bloom_configs").tiny_config
    model_mod = pytest.importorskip("trainer.model")
    return tiny_config, model_mod.BloomModel, model_mod.bloom_loss


def _step(model_api, dtype):
    tiny_config, BloomModel, bloom_loss = model_api
    cfg = tiny_config(init_std=0.1)

    def step():
        torch.manual_seed(0)
        model = BloomModel(cfg).to(dtype).train()
        ids = torch.randint(0, cfg.model.vocab_size, (2, cfg.model.seq_length),
                            generator=torch.Generator().manual_seed(4))
        loss = bloom_loss(model(ids), torch.roll(ids, -1, 1))
        loss.backward()
        grads = {f"grad {n}": p.grad for n, p in model.named_parameters() if p.grad is not None}
        assert len(grads) == len(list(model.parameters())), "every parameter should get a gradient"
        return {"loss": loss.reshape(1), **grads}

    return step


@pytest.mark.parametrize("path, attention", PATHS, ids=lambda x: str(x))
def test_model_fp32_same_loss_and_grads_on_every_path(model_api, path, attention):
    compare_paths(_step(model_api, torch.float32), torch.float32, "reference", path,
                  attention_a="materialized", attention_b=attention, rtol=1e-4)


@pytest.mark.parametrize("path, attention", PATHS, ids=lambda x: str(x))
def test_model_bf16_same_loss_and_grads_on_every_path(model_api, path, attention):
    errors = compare_paths(_step(model_api, torch.bfloat16), torch.bfloat16, "reference", path,
                           attention_a="materialized", attention_b=attention, norm_rtol=2e-2)
    assert errors["loss"] <= 5e-3
