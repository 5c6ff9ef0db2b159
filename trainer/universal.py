"""Universal checkpoints: resume a run on another (dp, tp, pp) layout, with DeepSpeed's machinery.

One command converts a saved checkpoint (any layout) into a layout-free one:

    python -m trainer.universal RUN_DIR --step N        # or --checkpoint DIR [--output DIR]

It wraps `deepspeed.checkpoint.ds_to_universal`: every parameter's fp32 master weight and Adam
moments are gathered from the ZeRO-1 shards of every DP rank, the TP slices are merged (column-
parallel on dim 0, row-parallel on dim 1, replicated ones checked equal and taken once), and each
parameter lands in `zero/<name>/{fp32,exp_avg,exp_avg_sq,step}.pt`. The output goes next to the
source, `checkpoints/step_NNNNNNN_universal/` (a name the resume logic of trainer.checkpoint never
takes for a normal checkpoint), with our MANIFEST.json written last, as for every checkpoint.

A run resumes from it with any layout whose padded vocabulary is the same: the DeepSpeed config
gets `checkpoint: {load_universal: true}` (`universal_load_config()`), then the engine's
`load_checkpoint(checkpoints/, tag="step_NNNNNNN_universal")` slices each fp32 master / moment for
the new TP rank and ZeRO partition, and copies the fp32 weights into the bf16 model.

What DeepSpeed needs for that is UNIVERSAL_CHECKPOINT_INFO in the client state of every saved
checkpoint: which parameter names are TP-replicated, row-parallel, the vocabulary, and which are
replicated across pipeline stages (the tied embedding). `universal_client_state(cfg, layout)` is
that client state; trainer.checkpoint.save_checkpoint takes it as `extra_client_state`.

Pitfalls of DeepSpeed 0.19.8 found while building this (see docs/parallelism.md):
- universal loading works only through ZeRO's optimizer (bf16 + ZeRO-1 here); an fp32 run
  (ZeRO-0) cannot load a universal checkpoint, and DeepSpeed raises an assertion deep inside.
- ds_to_universal writes each parameter's fragments under its name only, without the pipeline
  stage: a parameter name present on two stages that is not in PIPELINE_REPLICATED patterns is
  extracted twice and the later stage silently wins. The last stage of our pipeline holds an
  unused copy of the embedding LayerNorm (same name as the trained one on stage 0), so the whole
  tied module is listed as pipeline-replicated (trainer.model.pipeline's patterns).
- `latest_universal` is written by the converter in the output's parent directory; we load by
  explicit tag and never rely on it.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any

from orchestrator.contract.client.checkpoints import list_files, write_manifest
from trainer.checkpoint_format import UNIVERSAL_SUFFIX, hash_files_shared, require_verified


def universal_client_state(cfg, layout) -> dict[str, Any]:
    """What every checkpoint's client state must carry for ds_to_universal (merge it in)."""
    from deepspeed.checkpoint.constants import UNIVERSAL_CHECKPOINT_INFO

    from trainer.model.pipeline import universal_checkpoint_info

    return {UNIVERSAL_CHECKPOINT_INFO: universal_checkpoint_info(cfg, layout)}


def universal_load_config() -> dict[str, Any]:
    """The DeepSpeed config entries that make `engine.load_checkpoint` read a universal checkpoint."""
    return {"checkpoint": {"load_universal": True}}


def is_universal(ckpt_dir: Path) -> bool:
    return ckpt_dir.name.endswith(UNIVERSAL_SUFFIX) and (ckpt_dir / "zero").is_dir()


def _check_source(source: Path) -> None:
    if not source.is_dir():
        raise FileNotFoundError(f"no checkpoint directory {source}: give RUN_DIR --step N of a saved step, "
                                "or --checkpoint with the path of a checkpoints/step_NNNNNNN directory")
    if not list(source.glob("*optim_states.pt")):
        raise ValueError(f"{source} has no ZeRO optimizer files (*optim_states.pt): only bf16 + ZeRO-1 "
                         "checkpoints can be converted (an fp32 run saves no ZeRO shards)")
    import torch
    from deepspeed.checkpoint.constants import UNIVERSAL_CHECKPOINT_INFO

    # Everything below (and ds_to_universal after it) unpickles the source's files.
    require_verified(source)
    model_files = sorted(source.glob("mp_rank_*_model_states.pt"))
    if not model_files:
        raise ValueError(f"{source} has no mp_rank_*_model_states.pt: not a DeepSpeed checkpoint")
    state = torch.load(model_files[0], map_location="cpu", weights_only=False)
    if UNIVERSAL_CHECKPOINT_INFO not in state:
        raise ValueError(f"{model_files[0]} has no {UNIVERSAL_CHECKPOINT_INFO} in its client state: the run must "
                         "save trainer.universal.universal_client_state(cfg, layout) with every checkpoint")


def convert_to_universal(source: Path, output: Path | None = None, *, workers: int = 1,
                         overwrite: bool = False) -> Path:
    """Convert DeepSpeed checkpoint `source` into a universal checkpoint; returns its directory.

    Runs in one process (no torch.distributed needed): it only reads and writes files."""
    from deepspeed.checkpoint import ds_to_universal

    source = Path(source).resolve()
    _check_source(source)
    output = Path(output).resolve() if output else source.with_name(source.name + UNIVERSAL_SUFFIX)
    if output.exists():
        if not overwrite:
            raise FileExistsError(f"{output} exists: pass --overwrite to replace it")
        shutil.rmtree(output)
    partial = output.with_name(f".partial-{output.name}")
    shutil.rmtree(partial, ignore_errors=True)
    args = argparse.Namespace(input_folder=str(source), output_folder=str(partial), num_extract_workers=workers,
                              num_merge_workers=workers, keep_temp_folder=False, strict=True,
                              inject_missing_state=False)
    ds_to_universal.main(args)
    # ds_to_universal points a `latest_universal` file in the output's parent at the partial name:
    # we load by explicit tag, so remove it rather than leave a pointer to a directory that moves.
    stray_latest = partial.parent / "latest_universal"
    if stray_latest.exists() and stray_latest.read_text().strip() == partial.name:
        stray_latest.unlink()
    _write_manifest(partial, source)
    partial.rename(output)  # complete, or not there at all
    return output


def _write_manifest(ckpt_dir: Path, source: Path) -> None:
    entries = hash_files_shared(ckpt_dir, list_files(ckpt_dir))
    write_manifest(ckpt_dir, entries, {"universal_from": source.name})


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trainer.universal", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", nargs="?", help="the run directory (its checkpoints/step_NNNNNNN)")
    parser.add_argument("--step", type=int, help="the step of the checkpoint to convert (default: latest)")
    parser.add_argument("--checkpoint", help="convert this checkpoint directory instead of RUN_DIR --step")
    parser.add_argument("--output", help="output directory (default: <checkpoint>_universal beside it)")
    parser.add_argument("--workers", type=int, default=1, help="extraction/merge processes (default 1)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output directory")
    args = parser.parse_args(argv)
    if not args.checkpoint and not args.run_dir:
        parser.error("give RUN_DIR [--step N] or --checkpoint DIR")
    return args


def _source_of(args: argparse.Namespace) -> Path:
    if args.checkpoint:
        return Path(args.checkpoint)
    from orchestrator.contract import RunPaths

    paths = RunPaths.of(args.run_dir)
    if paths.config.is_file():  # the checkpoints are where the run's config says
        from orchestrator.plan.config import load_config

        paths = RunPaths.of(args.run_dir, load_config(paths.config).checkpoint.dir)
    if args.step is not None:
        return paths.checkpoint(args.step)
    if not paths.latest.exists():
        raise FileNotFoundError(f"{paths.latest} does not exist: no complete checkpoint to convert; pass --step N")
    return paths.checkpoints / paths.latest.read_text().strip()


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    try:
        source = _source_of(args)
        output = convert_to_universal(source, Path(args.output) if args.output else None, workers=args.workers,
                                      overwrite=args.overwrite)
    except (FileNotFoundError, FileExistsError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"universal checkpoint: {output}\nresume on any layout with DeepSpeed config checkpoint.load_universal: "
          f"true and tag {output.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
