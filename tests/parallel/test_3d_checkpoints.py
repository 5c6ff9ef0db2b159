"""Checkpoints of a 3D-parallel run: exact resume at the same layout, and the universal checkpoint
(`python -m trainer.universal`) resuming on another layout with losses continuous with the run.

Default run: the 2-rank chain (1,1,2) bf16 -> save at step 5 -> exact resume at (1,1,2), and
universal conversion -> resume at (2,1,1). `slow`: exact resume for every layout, (2,2,2) -> (1,2,1).
Universal loading needs ZeRO's optimizer, so these runs are bf16 (the real run's dtype).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.parallel.spawn import REPO_ROOT
from tests.parallel.three_d_runs import compare, run_layout

pytest.importorskip("deepspeed")

SAVE_AT, STEPS = 5, 10


def _original_with_checkpoint(work, layout):
    dp, tp, pp = layout
    ckpt = work / "checkpoints"
    run = run_layout(work, dp, tp, pp, "bf16", STEPS, save_dir=str(ckpt), save_at=SAVE_AT)
    return run, ckpt


def _exact_resume(work, layout, original, ckpt):
    dp, tp, pp = layout
    resumed = run_layout(work, dp, tp, pp, "bf16", STEPS - SAVE_AT, load_dir=str(ckpt),
                         load_tag=f"step_{SAVE_AT:07d}", first_step=SAVE_AT)
    tail = {k: original[k][SAVE_AT:] for k in ("losses", "grad_norms")}
    print(f"{layout} exact resume: losses {resumed['losses']} vs {tail['losses']}")
    assert resumed["losses"] == tail["losses"], "resume at the same layout must be bit-identical"
    assert resumed["grad_norms"] == tail["grad_norms"]


def _convert(ckpt):
    # The one command, in its run-directory form: RUN_DIR/checkpoints/step_0000005 -> ..._universal
    done = subprocess.run([sys.executable, "-m", "trainer.universal", str(ckpt.parent), "--step", str(SAVE_AT)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                          env={"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stdout + done.stderr
    out = ckpt / f"step_{SAVE_AT:07d}_universal"
    assert (out / "zero").is_dir() and (out / "MANIFEST.json").is_file(), done.stdout
    return out


def _check_stage0_embedding_layernorm(ckpt, universal_dir):
    """The last stage holds an unused copy of the embedding LayerNorm under the trained one's name;
    the universal checkpoint must carry stage 0's trained values (not the last stage's initial ones)."""
    import torch

    name = "tied_modules.embed.word_embeddings_layernorm.weight"
    merged = torch.load(universal_dir / "zero" / name / "fp32.pt", weights_only=False)["param"]
    stage0 = torch.load(ckpt / f"step_{SAVE_AT:07d}" / "layer_00-model_00-model_states.pt",
                        weights_only=False)["word_embeddings_layernorm.weight"].float()
    err = (merged - stage0).abs().max().item()
    print(f"universal {name} vs stage 0's bf16 copy: max abs err {err:.2e}; max |w - 1| {(merged - 1).abs().max():.2e}")
    assert err <= 2 ** -8 * merged.abs().max().item(), "fp32 master must round to stage 0's bf16 weight"
    assert (merged - 1).abs().max().item() > 1e-3, "the embedding LayerNorm must have trained (not the init 1.0)"


def _universal_resume(work, target, original, universal_dir):
    dp, tp, pp = target
    resumed = run_layout(work, dp, tp, pp, "bf16", STEPS - SAVE_AT, load_dir=str(universal_dir.parent),
                         load_tag=universal_dir.name, first_step=SAVE_AT, load_universal=True)
    tail = {k: original[k][SAVE_AT:] for k in ("losses", "grad_norms")}
    # Continuous: the first loss after the resume is the original run's step-5 loss (not ~5.5, a fresh
    # model's), and the next steps follow the original within the bf16 layout tolerance.
    assert resumed["losses"][0] < original["losses"][0] - 1.0
    compare(resumed, tail, "bf16", f"universal {tuple(original['layout'])} -> {target} resume vs original run")


def test_exact_and_universal_resume_pp2_to_dp2(tmp_path):
    original, ckpt = _original_with_checkpoint(tmp_path, (1, 1, 2))
    _exact_resume(tmp_path, (1, 1, 2), original, ckpt)
    universal_dir = _convert(ckpt)
    _check_stage0_embedding_layernorm(ckpt, universal_dir)
    _universal_resume(tmp_path, (2, 1, 1), original, universal_dir)


def test_convert_refuses_what_it_cannot_convert(tmp_path, capsys):
    from trainer.universal import main

    assert main([str(tmp_path), "--step", "7"]) == 2
    assert "no checkpoint directory" in capsys.readouterr().err
    fp32_like = tmp_path / "checkpoints" / "step_0000003"
    fp32_like.mkdir(parents=True)
    (fp32_like / "mp_rank_00_model_states.pt").write_bytes(b"")
    assert main([str(tmp_path), "--step", "3"]) == 2
    err = capsys.readouterr().err
    print(err)
    assert "no ZeRO optimizer files" in err and "bf16 + ZeRO-1" in err


@pytest.mark.slow
def test_universal_resume_222_to_121(tmp_path):
    original, ckpt = _original_with_checkpoint(tmp_path, (2, 2, 2))
    _universal_resume(tmp_path, (1, 2, 1), original, _convert(ckpt))


@pytest.mark.slow
@pytest.mark.parametrize("layout", [(1, 1, 1), (2, 1, 1), (1, 2, 1), (2, 2, 1), (1, 2, 2), (2, 2, 2)],
                         ids=lambda layout: "dp{}-tp{}-pp{}".format(*layout))
def test_exact_resume_at_layout(layout, tmp_path):
    original, ckpt = _original_with_checkpoint(tmp_path, layout)
    _exact_resume(tmp_path, layout, original, ckpt)
