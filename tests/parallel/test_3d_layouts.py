"""Every (dp, tp, pp) layout trains the tiny BLOOM exactly like the single process.

Real DeepSpeed (PipelineEngine, ZeRO-1 BF16_Optimizer in bf16) on gloo CPU ranks, our Megatron TP
layers, the same model seed and the same global batches: 10 steps, then every loss and gradient
norm is compared with the (1,1,1) run (tolerances in tests/parallel/three_d_runs.py). The loss falls
from ~5.5 to ~3.6 over the 10 steps, so a layout that trained differently would show it.

Default run: the 8-rank (2,2,2) layout in fp32 (~60 s on 2 cores). The rest is `slow`.
"""

from __future__ import annotations

import pytest

from tests.parallel.three_d_runs import compare, run_layout  # single_process: conftest.py

pytest.importorskip("deepspeed")

LAYOUTS = [(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2), (2, 2, 1), (1, 2, 2), (2, 2, 2)]
DEFAULT = {("fp32", (2, 2, 2))}


def _params():
    for dtype in ("fp32", "bf16"):
        for layout in LAYOUTS:
            marks = () if (dtype, layout) in DEFAULT else (pytest.mark.slow,)
            yield pytest.param(dtype, layout, marks=marks, id=f"{dtype}-dp{layout[0]}-tp{layout[1]}-pp{layout[2]}")


@pytest.mark.parametrize(("dtype", "layout"), list(_params()))
def test_layout_matches_single_process(dtype, layout, single_process, tmp_path):
    dp, tp, pp = layout
    reference = single_process(dtype)
    result = run_layout(tmp_path, dp, tp, pp, dtype)
    assert result["micro_batches"] == 4 // dp  # global batch 8 = micro 2 x m x dp
    assert reference["losses"][-1] < reference["losses"][0] - 1.0, "the reference run must learn something"
    compare(result, reference, dtype, f"(dp,tp,pp)={layout} {dtype} vs single process")
