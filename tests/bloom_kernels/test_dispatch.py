"""The dispatch: which path runs, overrides (config, env var), logging once, triton optional."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import bloom_kernels
from bloom_kernels import dispatch
from bloom_kernels.attention.reference import attention_reference
from bloom_kernels.layer_norm.reference import layer_norm_reference


@pytest.fixture(autouse=True)
def clean_dispatch(monkeypatch):
    """Each test starts from the defaults, with no env override and nothing logged yet."""
    monkeypatch.delenv(dispatch.ENV_KERNELS, raising=False)
    monkeypatch.delenv(dispatch.ENV_ATTENTION, raising=False)
    monkeypatch.setattr(dispatch, "_configured_path", "auto")
    monkeypatch.setattr(dispatch, "_configured_attention", "auto")
    monkeypatch.setattr(dispatch, "_logged_decisions", set())


def test_auto_is_reference_on_cpu_and_triton_on_cuda():
    assert bloom_kernels.current_path("cpu") == "reference"
    assert bloom_kernels.current_path("cuda") == ("triton" if dispatch.triton_available() else "reference")
    assert bloom_kernels.current_attention_impl("cpu") == "materialized"


def test_config_then_env_var_override(monkeypatch):
    bloom_kernels.set_kernel_path("triton")
    assert dispatch.requested_path() == "triton"
    monkeypatch.setenv("BLOOM_KERNELS", "reference")  # the env var beats the config
    assert bloom_kernels.current_path("cuda") == "reference"
    assert bloom_kernels.current_path("cpu") == "reference"


@pytest.mark.parametrize("call", [lambda: bloom_kernels.set_kernel_path("fast"),
                                  lambda: bloom_kernels.set_attention_impl("flash")])
def test_bad_values_name_what_is_allowed(call):
    with pytest.raises(ValueError, match="not allowed; use one of"):
        call()


def test_bad_env_var_names_the_variable(monkeypatch):
    monkeypatch.setenv("BLOOM_KERNELS", "cuda")
    with pytest.raises(ValueError, match="BLOOM_KERNELS"):
        bloom_kernels.current_path("cpu")


def test_path_is_logged_once(caplog):
    x, w, b = torch.randn(3, 8), torch.ones(8), torch.zeros(8)
    with caplog.at_level(logging.INFO, logger="bloom_kernels"):
        for _ in range(3):
            y = bloom_kernels.layer_norm(x, w, b, 1e-5)
    records = [r for r in caplog.records if r.name == "bloom_kernels"]
    print([r.getMessage() for r in records])
    assert len(records) == 1 and "path=reference" in records[0].getMessage()
    assert torch.equal(y, layer_norm_reference(x, w, b, 1e-5))


def test_attention_impl_selection(monkeypatch):
    q = torch.randn(1, 2, 9, 16, requires_grad=True)
    slopes = bloom_kernels.alibi_slopes(2)
    out = bloom_kernels.attention(q, q, q, slopes)
    assert "ChunkedAttention" not in type(out.grad_fn).__name__
    bloom_kernels.set_attention_impl("chunked")
    chunked = bloom_kernels.attention(q, q, q, slopes)
    assert type(chunked.grad_fn).__name__ == "_ChunkedAttentionBackward"
    monkeypatch.setenv("BLOOM_ATTENTION", "materialized")  # env beats config
    assert bloom_kernels.current_attention_impl("cpu") == "materialized"
    torch.testing.assert_close(chunked, attention_reference(q, q, q, slopes), rtol=1e-5, atol=1e-5)


def test_kernel_path_context_restores_settings(monkeypatch):
    monkeypatch.setenv("BLOOM_KERNELS", "reference")
    bloom_kernels.set_attention_impl("chunked")
    with bloom_kernels.kernel_path("auto", attention="materialized"):
        assert dispatch.requested_path() == "auto"
        assert bloom_kernels.current_attention_impl("cpu") == "materialized"
    assert dispatch.requested_path() == "reference"
    assert bloom_kernels.current_attention_impl("cpu") == "chunked"


def test_import_kernels_without_triton_installed():
    """Triton is optional: with it unimportable, everything runs on the reference path."""
    code = textwrap.dedent("""
        import sys
        sys.modules["triton"] = None  # makes `import triton` fail like a missing package
        import torch, bloom_kernels
        assert bloom_kernels.current_path("cuda") == "reference"
        x = torch.randn(2, 8, requires_grad=True)
        bloom_kernels.bias_gelu(x, torch.zeros(8)).sum().backward()
        bloom_kernels.set_kernel_path("triton")
        try:
            bloom_kernels.current_path("cpu")
        except RuntimeError as exc:
            assert "triton cannot be imported" in str(exc), exc
        else:
            raise AssertionError("forcing triton without triton must fail")
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=str(Path(bloom_kernels.__file__).parents[1]))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
