"""Checkpoints written during a run, later loaded with pickle
(DeepSpeed's torch.load(weights_only=False)), in a checkpoint folder an operator could write (a
save under the owner's umask 002 in a setgid project tree, by an older job script).

An operator who writes a pickle and a manifest that lists it with the right size and sha256
passed the hash check: the manifest itself was nobody's in particular. Now a manifest, and every
file it lists, must be the run owner's; the RNG files load with weights_only=True; and the
universal conversion and the aux tasks load nothing that does not verify.
Real users (attack_env.py); the loads run as the owner.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from pathlib import Path

import torch  # imported before any fork (the children cannot read the stdlib)
from attack_env import as_user

import trainer.checkpoint  # noqa: F401
from orchestrator.contract import MANIFEST_NAME, RunPaths, verify_manifest
from trainer.checkpoint import load_rng_state
from trainer.checkpoint_format import require_verified


class RunsCode:
    """Unpickling it makes the folder `path`: proof that a load ran the operator's code."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def test_a_checkpoint_someone_else_wrote_is_never_unpickled(team, shared_run):
    paths: RunPaths = shared_run(team_dir=True)
    ckpt = paths.checkpoint(2)

    def older_save():  # the checkpoint folder as a save under umask 002 left it, in the team's group
        os.chown(paths.checkpoints, -1, os.stat(paths.root).st_gid)
        os.chmod(paths.checkpoints, 0o2750)
        (ckpt / "rng").mkdir(parents=True)
        os.chmod(ckpt, 0o2775)
        os.chmod(ckpt / "rng", 0o2775)

    as_user(team.owner, older_save, umask=0o002)
    proof = paths.root.parent / "ran-as-owner"

    def plant():
        files = {}
        for rel in ("rng/rank-00000.pt", "mp_rank_00_model_states.pt"):
            torch.save({"python": RunsCode(proof)}, ckpt / rel)  # runs code when unpickled
            data = (ckpt / rel).read_bytes()
            files[rel] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        (ckpt / MANIFEST_NAME).write_text(json.dumps({"version": 1, "files": files, "step": 2}))

    planted, out = as_user(team.oncall, plant, umask=0o002)
    assert not isinstance(planted, BaseException), out

    problems, _ = as_user(team.owner, lambda: verify_manifest(ckpt))
    print(problems)
    assert problems and all("not the run's owner" in p for p in problems), problems
    refused, _ = as_user(team.owner, lambda: require_verified(ckpt))
    assert isinstance(refused, ValueError) and "none of it is loaded" in str(refused), refused
    loaded, _ = as_user(team.owner, lambda: load_rng_state(ckpt / "rng" / "rank-00000.pt"))
    assert isinstance(loaded, pickle.UnpicklingError), loaded
    assert not proof.exists(), "the operator's pickle ran as the owner"
