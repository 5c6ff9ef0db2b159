"""MANIFEST, `latest`, resume choice and keep-last cleanup on fake checkpoint directories (no engine)."""

from __future__ import annotations

from orchestrator.contract import (
    RunPaths,
    complete_checkpoints,
    prune_checkpoints,
    read_latest,
    read_manifest,
    write_latest,
)
from orchestrator.contract.manifest import read_damage_reports
from trainer import checkpoint as ckpt


def fake_checkpoint(paths: RunPaths, step: int, manifest: bool = True, point_latest: bool = True):
    d = paths.checkpoint(step)
    (d / "rng").mkdir(parents=True)
    (d / "mp_rank_00_model_states.pt").write_bytes(b"weights-%d" % step * 100)
    (d / "rng" / "rank-00000.pt").write_bytes(b"rng")
    if manifest:
        ckpt.write_manifest(d, ckpt.hash_files_shared(d, ckpt.list_files(d)), {"step": step})
        if point_latest:
            write_latest(paths.checkpoints, d.name)
    return d


def test_manifest_lists_every_file_and_verifies(tmp_path):
    paths = RunPaths.of(tmp_path)
    d = fake_checkpoint(paths, 10)
    manifest = read_manifest(d)
    assert set(manifest.files) == {"mp_rank_00_model_states.pt", "rng/rank-00000.pt"}
    assert manifest.files["rng/rank-00000.pt"].size == 3
    assert ckpt.verify_manifest(d) == []
    assert read_latest(paths.checkpoints) == "step_0000010"


def test_corruption_truncation_and_missing_manifest_are_detected(tmp_path):
    paths = RunPaths.of(tmp_path)
    d = fake_checkpoint(paths, 1)
    blob = d / "mp_rank_00_model_states.pt"
    data = bytearray(blob.read_bytes())
    data[5] ^= 0xFF
    blob.write_bytes(bytes(data))
    assert any("sha256" in p for p in ckpt.verify_manifest(d))
    blob.write_bytes(bytes(data[:-1]))
    assert any("size" in p for p in ckpt.verify_manifest(d))
    (d / "rng" / "rank-00000.pt").unlink()
    assert any("missing" in p for p in ckpt.verify_manifest(d))
    e = fake_checkpoint(paths, 2, manifest=False)
    assert "no MANIFEST" in ckpt.verify_manifest(e)[0]


def test_resume_skips_damaged_newest_and_reports_it(tmp_path):
    paths = RunPaths.of(tmp_path)
    fake_checkpoint(paths, 2)
    fake_checkpoint(paths, 4)
    newest = fake_checkpoint(paths, 6)
    (newest / "mp_rank_00_model_states.pt").write_bytes(b"garbage")
    fake_checkpoint(paths, 8, manifest=False)  # a save that died: not a candidate
    chosen = ckpt.find_resume_checkpoint(paths, job_id="j1")
    assert chosen.name == "step_0000004"
    damaged = read_damage_reports(paths.checkpoints)
    assert [r.checkpoint for r in damaged] == ["step_0000006"] and damaged[0].job_id == "j1"
    assert newest.exists()  # never deleted
    # a checkpoint with a manifest but newer than `latest` (died between MANIFEST and latest) is ignored
    fake_checkpoint(paths, 10, point_latest=False)
    assert ckpt.find_resume_checkpoint(paths).name == "step_0000004"


def test_keep_last_never_deletes_latest_damaged_or_only_good(tmp_path):
    paths = RunPaths.of(tmp_path)
    for step in (1, 2, 3, 4, 5):
        fake_checkpoint(paths, step)
    deleted = prune_checkpoints(paths.checkpoints, keep_last=2)
    assert deleted == ["step_0000001", "step_0000002", "step_0000003"]
    assert [d.name for _, d in complete_checkpoints(paths.checkpoints)] == ["step_0000004", "step_0000005"]
    assert not list(paths.checkpoints.glob(".deleting-*"))
    # `latest` pointing at an older one (e.g. set by hand) protects it
    fake_checkpoint(paths, 6)
    fake_checkpoint(paths, 7)
    write_latest(paths.checkpoints, "step_0000004")
    prune_checkpoints(paths.checkpoints, keep_last=1)
    names = [d.name for _, d in complete_checkpoints(paths.checkpoints)]
    assert names == ["step_0000004", "step_0000007"], names
    # a damaged (reported) checkpoint is never deleted
    ckpt.report_damaged(paths, paths.checkpoint(4), ["test"], "j")
    write_latest(paths.checkpoints, "step_0000007")
    fake_checkpoint(paths, 9)
    prune_checkpoints(paths.checkpoints, keep_last=1)
    names = [d.name for _, d in complete_checkpoints(paths.checkpoints)]
    assert names == ["step_0000004", "step_0000009"], names
    # keep_last=1 with only one complete checkpoint: nothing to delete
    assert prune_checkpoints(paths.checkpoints, keep_last=1) == []
