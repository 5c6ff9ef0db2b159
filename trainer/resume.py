"""Which checkpoint a job resumes from, and whether it computes what it computed when it was saved.

Collective helpers of trainer/loop.py's build() and resume(). Every file is read by rank 0 and its
content (or the error) sent to every rank, so that a lagging shared filesystem cannot make ranks
choose differently. The rules are orchestrator/contract/client/rollback.py's (the directive) and trainer/probe.py's
(the probe); the order of candidates is trainer/checkpoint.py's (newest verified first).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from orchestrator.contract import RunPaths, step_of
from orchestrator.contract.client import rollback as rb
from orchestrator.contract.directive import (
    CheckpointState,
    DirectiveError,
    Rollback,
    read_checkpoint_state,
    read_rollback,
)
from trainer import checkpoint as ckpt
from trainer import probe
from trainer.checkpoint_format import dist_world, gather_to_all
from trainer.parallel.groups import LayoutError

T = TypeVar("T")


def on_rank0(read: Callable[[], T]) -> T:
    """read() on rank 0, its result on every rank; a DirectiveError there is a LayoutError on every
    rank (the trainer exits CONFIG_ERROR: a restart would read the same file)."""
    rank, _ = dist_world()
    result: Any = None
    error = None
    if rank == 0:
        try:
            result = read()
        except DirectiveError as exc:
            error = str(exc)
    result, error = gather_to_all((result, error))[0]
    if error:
        raise LayoutError(error)
    return result


def read_directive(paths: RunPaths) -> Rollback | None:
    return on_rank0(lambda: read_rollback(paths))


@dataclass(frozen=True)
class Candidate:
    found: Path  # checkpoints/step_N (its JSON files, its manifest)
    loadable: Path  # found, or its universal conversion at another layout
    universal: bool
    step: int
    state: CheckpointState | None  # its trainer_state.json (None: saved before it existed)
    passed: tuple[CheckpointState | None, ...]  # newer checkpoints the directive abandons


def candidates(paths: RunPaths, layout: dict[str, int], job_id: str, directive: Rollback | None,
               log: Callable[[str], None]) -> Iterator[Candidate]:
    """Checkpoints to try, best first (collective): verified by hash, not known to fail their
    probe, and not newer than the directive's target unless they applied it."""
    passed: list[CheckpointState | None] = []
    for found in ckpt.verified_checkpoints(paths, job_id):
        state = on_rank0(lambda found=found: read_checkpoint_state(found))
        step = step_of(found.name)
        if rb.passed_over(directive, step, state):
            log(f"rollback {directive.id}: passing over {found.name} (newer than step {directive.to_step})")
            passed.append(state)
            continue
        loadable, universal = ckpt.loadable_form(paths, found, layout)
        yield Candidate(found, loadable, universal, step, state, tuple(passed))


def pinned(paths: RunPaths, found: Path, layout: dict[str, int]) -> Iterator[Candidate]:
    """Exactly `found` (a replay's checkpoint): it must verify by hash (collective)."""
    problems = ckpt.verify_shared(found)
    if problems:
        raise RuntimeError(f"{found}: {'; '.join(problems[:3])}")
    state = on_rank0(lambda: read_checkpoint_state(found))
    loadable, universal = ckpt.loadable_form(paths, found, layout)
    yield Candidate(found, loadable, universal, step_of(found.name), state, ())


def check_probe(engine, cfg, layout, dataset_name: str, dataset, found: Path) -> tuple[str, list[str]]:
    """(what was done, problems) of the probe of the checkpoint just loaded into `engine` (collective)."""
    recorded = on_rank0(lambda: probe.read_probe(found))
    probe.refresh_model_from_master(engine)
    if recorded is None:
        return f"no {probe.PROBE_NAME} in {found.name} (saved before probes, or with checkpoint.verify_probe off)", []
    now = probe.compute_probe(engine, cfg, layout, dataset_name, dataset)
    mode, problems = probe.compare(recorded, now)
    loss_diff, logit_diff = probe.max_differences(recorded, now)
    done = (f"probe of {found.name}: {mode}, {'MISMATCH' if problems else 'match'} (loss {now['loss']:.6g}, "
            f"|loss diff| {loss_diff:.3g}, max |sampled logit diff| {logit_diff:.3g}) in {now['seconds']:.3f}s")
    return done, problems
