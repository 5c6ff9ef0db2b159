"""The controller lists the checkpoints every pass and reads a manifest again only when it changed
(a BLOOM manifest lists thousands of shards). What a changed, replaced, removed or vandalised
manifest says must still be what a fresh listing says."""

from __future__ import annotations

import os

from orchestrator.contract import MANIFEST_NAME
from orchestrator.contract.checkpoints import list_checkpoints
from orchestrator.contract.manifest import FileEntry, Manifest, write_manifest


def _save(root, step: int, size: int) -> None:
    folder = root / f"step_{step:07d}"
    folder.mkdir(parents=True, exist_ok=True)
    write_manifest(folder, Manifest(files={"model.pt": FileEntry(size, "0" * 64)}, step=step, created=1.0))


def _listing(root, seen=None):
    return [(c.step, c.complete, c.size_bytes) for c in list_checkpoints(root, seen)]


def test_a_remembered_manifest_says_what_a_fresh_read_says(tmp_path):
    seen: dict = {}
    _save(tmp_path, 100, 1_000)
    (tmp_path / "step_0000200").mkdir()  # a save under way: no manifest yet
    assert _listing(tmp_path, seen) == [(100, True, 1_000), (200, False, 0)]

    _save(tmp_path, 200, 2_000)  # the save finishes
    _save(tmp_path, 100, 1_500)  # a manifest rewritten in place with another size
    assert _listing(tmp_path, seen) == _listing(tmp_path) == [(100, True, 1_500), (200, True, 2_000)]

    manifest = tmp_path / "step_0000100" / MANIFEST_NAME
    stamp = manifest.stat()
    manifest.write_text(manifest.read_text().replace('"size": 1500', '"size": 9999'))  # same length
    os.utime(manifest, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # and the old mtime put back
    assert _listing(tmp_path, seen) == _listing(tmp_path) == [(100, True, 9_999), (200, True, 2_000)]

    manifest.write_text("{ torn")  # vandalised: not a checkpoint any more
    assert _listing(tmp_path, seen) == _listing(tmp_path) == [(100, False, 0), (200, True, 2_000)]

    for name in (MANIFEST_NAME, "."):  # removed (keep_last): forgotten
        target = tmp_path / "step_0000200" / name
        target.unlink() if name == MANIFEST_NAME else target.rmdir()
    assert _listing(tmp_path, seen) == [(100, False, 0)]
    assert set(seen) == {tmp_path / "step_0000100"}
