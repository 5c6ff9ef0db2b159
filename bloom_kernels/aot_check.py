"""Compile every Triton kernel for real GPU targets, without a GPU.

    python -m bloom_kernels.aot_check            bf16 at BLOOM-176B sizes for sm_90 (~1 min on 2 cores)
    python -m bloom_kernels.aot_check --full     also fp32, small sizes, head_dim 64, sm_80 (~10 min)

The CPU tests run the kernels in Triton's interpreter, which does not type-check like the compiler
does and ignores register/shared-memory limits. This compiles each kernel, with the launch
configurations the wrappers really use, through triton's full pipeline (TTIR -> TTGIR -> LLVM ->
PTX -> cubin via the bundled ptxas) for sm_80 (A100) and sm_90 (H100/H200), and checks the shared
memory each needs against the device limit. Run it in a process without TRITON_INTERPRET=1.
Prints one line per compiled kernel; exits 1 on the first failure.
"""

from __future__ import annotations

import os
import sys
import time

# sm -> max dynamic shared memory per block (bytes): A100 163 KiB, H100/H200 227 KiB
TARGETS = {80: 166912, 90: 232448}


def _cases(full: bool):
    """(name, jit function, signature, constexprs, options) for each kernel and configuration."""
    import torch

    from bloom_kernels.attention import triton_impl as attn
    from bloom_kernels.bias_gelu import triton_impl as gelu
    from bloom_kernels.layer_norm import triton_impl as ln
    from bloom_kernels.softmax import triton_impl as smax

    p = {torch.bfloat16: "*bf16", torch.float32: "*fp32"}
    for dt in (torch.bfloat16, torch.float32) if full else (torch.bfloat16,):
        t = p[dt]
        for n in (14336, 1024) if full else (14336,):  # BLOOM-176B hidden; a small model
            block_n = ln.next_pow2(n)
            rows = max(1, 2048 // block_n)
            yield (f"layer_norm_fwd n={n} {t}", ln._layer_norm_fwd,
                   {"X": t, "Y": t, "W": t, "B": t, "Mean": "*fp32", "Rstd": "*fp32", "M": "i32", "N": "i32",
                    "eps": "fp32", "ROWS": "constexpr", "BLOCK_N": "constexpr"},
                   {"ROWS": rows, "BLOCK_N": block_n}, {"num_warps": ln._num_warps(rows * block_n)})
            yield (f"layer_norm_bwd n={n} {t}", ln._layer_norm_bwd,
                   {"X": t, "DY": t, "DX": t, "W": t, "Mean": "*fp32", "Rstd": "*fp32", "DW_part": "*fp32",
                    "DB_part": "*fp32", "M": "i32", "N": "i32", "rows_per_prog": "i32", "BLOCK_N": "constexpr"},
                   {"BLOCK_N": block_n}, {"num_warps": ln._num_warps(block_n)})
        bm, bn = gelu._blocks(14336)
        common = {"X": t, "B": t, "M": "i32", "N": "i32", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr"}
        yield (f"bias_gelu_fwd {t}", gelu._bias_gelu_fwd, {**common, "Y": t}, {"BLOCK_M": bm, "BLOCK_N": bn}, {})
        yield (f"bias_gelu_bwd {t}", gelu._bias_gelu_bwd, {**common, "DY": t, "DX": t, "DB_part": "*fp32"},
               {"BLOCK_M": bm, "BLOCK_N": bn}, {})
        for sq, sk in ((2048, 2048), (1, 100000)) if full else ((2048, 2048),):
            rows, block_k = smax._tiles(sq, sk)
            yield (f"softmax_fwd {sq}x{sk} {t}", smax._softmax_fwd,
                   {"S": t, "A": t, "Y": t, "sq": "i32", "sk": "i32", "stride_ab": "i32", "stride_aq": "i32",
                    "stride_ak": "i32", "scale": "fp32", "HAS_ALIBI": "constexpr", "CAUSAL": "constexpr",
                    "ROWS": "constexpr", "BLOCK_K": "constexpr"},
                   {"HAS_ALIBI": True, "CAUSAL": True, "ROWS": rows, "BLOCK_K": block_k},
                   {"num_warps": smax._num_warps(rows * block_k)})
            yield (f"softmax_bwd {sq}x{sk} {t}", smax._softmax_bwd,
                   {"Y": t, "DY": t, "DX": t, "sq": "i32", "sk": "i32", "scale": "fp32", "ROWS": "constexpr",
                    "BLOCK_K": "constexpr"}, {"ROWS": rows, "BLOCK_K": block_k},
                   {"num_warps": smax._num_warps(rows * block_k)})
        for d in (128, 64) if full else (128,):
            cfg = attn._config(d, dt)
            options = {"num_warps": cfg.pop("num_warps"), "num_stages": cfg.pop("num_stages")}
            consts = {**cfg, "CAUSAL": True}
            sizes = {"H": "i32", "SQ": "i32", "SK": "i32", "D": "i32"}
            qkv = {"Q": t, "K": t, "V": t, "Slopes": "*fp32"}
            yield (f"attn_fwd d={d} {t}", attn._attn_fwd,
                   {**qkv, "Out": t, "LSE": "*fp32", **sizes, "qk_scale": "fp32", **dict.fromkeys(consts, "constexpr")},
                   consts, options)
            yield (f"attn_bwd_delta d={d} {t}", attn._attn_bwd_delta,
                   {"Out": t, "DO": t, "Delta": "*fp32", "SQ": "i32", "D": "i32", "BLOCK_M": "constexpr",
                    "BLOCK_D": "constexpr"}, {"BLOCK_M": cfg["BLOCK_M"], "BLOCK_D": cfg["BLOCK_D"]}, {})
            bwd_common = {"LSE": "*fp32", "Delta": "*fp32", **sizes, "qk_scale": "fp32", "sm_scale": "fp32",
                          **dict.fromkeys(consts, "constexpr")}
            yield (f"attn_bwd_dkdv d={d} {t}", attn._attn_bwd_dkdv,
                   {**qkv, "DO": t, "DK": t, "DV": t, **bwd_common}, consts, options)
            yield (f"attn_bwd_dq d={d} {t}", attn._attn_bwd_dq,
                   {**qkv, "DO": t, "DQ": t, **bwd_common}, consts, options)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Compile the Triton kernels for GPU targets, no GPU needed.")
    parser.add_argument("--full", action="store_true", help="all dtypes/sizes and sm_80 too")
    parser.add_argument("--arch", type=int, nargs="*", help="compute capabilities, e.g. 80 90")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("aot_check: unset TRITON_INTERPRET: the interpreter cannot compile kernels")
        return 2
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    archs = args.arch or (list(TARGETS) if args.full else [90])
    for name, fn, signature, constexprs, options in _cases(args.full):
        for arch in archs:
            start = time.perf_counter()
            try:
                compiled = triton.compile(ASTSource(fn, signature, constexprs),
                                          target=GPUTarget("cuda", arch, 32), options=options)
            except Exception as exc:  # report which kernel/config failed, then stop
                print(f"FAIL {name} sm_{arch}: {type(exc).__name__}: {exc}")
                return 1
            shared, limit = compiled.metadata.shared, TARGETS.get(arch, min(TARGETS.values()))
            print(f"{'ok  ' if shared <= limit else 'FAIL'} {name:32s} sm_{arch} shared memory {shared:6d} B "
                  f"(limit {limit})  {time.perf_counter() - start:5.1f} s", flush=True)
            if shared > limit:
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
