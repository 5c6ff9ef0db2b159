"""The on-disk index cache: reused on restart, refused to non-building ranks, safe under races."""

from __future__ import annotations

import multiprocessing as mp
import os
from pathlib import Path

import numpy as np
import pytest

from trainer.data import IndexCacheMissing, build_train_valid_test_datasets

ARGS = {"split": "90,5,5", "num_samples": (500, 20, 20), "seq_length": 16, "seed": 11}


def _mtimes(cache_dir: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in cache_dir.iterdir()}


def test_second_run_reuses_the_cache(random_dataset, tmp_path: Path) -> None:
    prefix, _ = random_dataset(num_docs=400, seed=1)
    cache = tmp_path / "run" / "data_cache"
    first = build_train_valid_test_datasets([prefix], [1.0], cache_dir=cache, build_on_this_rank=True, **ARGS)
    assert all(ds.index_built for ds in first)
    before = _mtimes(cache)
    assert len(before) == 3 * 4  # 3 splits x (doc, sample, shuffle, marker)
    assert not [name for name in before if name.endswith(".tmp")]
    # A restart: rank 0 may build, but finds everything and builds nothing.
    second = build_train_valid_test_datasets([prefix], [1.0], cache_dir=cache, build_on_this_rank=True, **ARGS)
    assert not any(ds.index_built for ds in second)
    assert _mtimes(cache) == before
    for a, b in zip(first, second, strict=True):
        assert len(a) == len(b)
        for i in (0, len(a) // 2, len(a) - 1):
            np.testing.assert_array_equal(a[i]["text"], b[i]["text"])
    # Other ranks only load.
    third = build_train_valid_test_datasets([prefix], [1.0], cache_dir=cache, build_on_this_rank=False, **ARGS)
    assert not any(ds.index_built for ds in third)


def test_non_building_rank_with_no_cache_gets_a_clear_error(random_dataset, tmp_path: Path) -> None:
    prefix, _ = random_dataset(num_docs=100, seed=2)
    with pytest.raises(IndexCacheMissing, match="build_on_this_rank=True"):
        build_train_valid_test_datasets([prefix], [1.0], cache_dir=tmp_path / "c", build_on_this_rank=False, **ARGS)


def test_changed_parameters_or_data_build_a_new_entry(random_dataset, tmp_path: Path) -> None:
    prefix, _ = random_dataset(num_docs=200, seed=3)
    cache = tmp_path / "c"
    build_train_valid_test_datasets([prefix], [1.0], cache_dir=cache, build_on_this_rank=True, **ARGS)
    other_seed = dict(ARGS, seed=12)
    again = build_train_valid_test_datasets([prefix], [1.0], cache_dir=cache, build_on_this_rank=True, **other_seed)
    assert all(ds.index_built for ds in again)
    # Rewriting the dataset (new mtime/size) invalidates its entries.
    random_dataset(num_docs=201, seed=3)
    rewritten = build_train_valid_test_datasets([prefix], [1.0], cache_dir=cache, build_on_this_rank=True, **ARGS)
    assert all(ds.index_built for ds in rewritten)


def _build_in_process(prefix: str, cache: str, start, queue) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    start.wait()
    datasets = build_train_valid_test_datasets([prefix], [1.0], cache_dir=Path(cache), build_on_this_rank=True,
                                               split="100,0,0", num_samples=(200_000, 0, 0), seq_length=64, seed=5)
    train = datasets[0]
    queue.put((train.index_built, int(train.shuffle_idx[:1000].sum()), len(train)))


def test_concurrent_builders_do_not_corrupt(random_dataset, tmp_path: Path) -> None:
    """Two processes build the same entry at the same moment (a restarted job racing a dying one)."""
    prefix, _ = random_dataset(num_docs=20_000, seed=4, mean_size=200)
    cache = tmp_path / "shared_cache"
    ctx = mp.get_context("spawn")
    start, queue = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_build_in_process, args=(prefix, str(cache), start, queue)) for _ in range(2)]
    for proc in procs:
        proc.start()
    start.set()
    for proc in procs:
        proc.join(timeout=120)
        assert proc.exitcode == 0
    results = [queue.get(timeout=5) for _ in procs]
    print("concurrent builders (built, checksum, len):", results)
    assert len({r[1:] for r in results}) == 1  # both saw the same arrays
    assert not [p.name for p in cache.iterdir() if p.name.endswith(".tmp")]
    # The files left are complete and equal to a fresh single-builder build.
    reference = build_train_valid_test_datasets([prefix], [1.0], cache_dir=tmp_path / "fresh", build_on_this_rank=True,
                                                split="100,0,0", num_samples=(200_000, 0, 0), seq_length=64, seed=5)[0]
    loaded = build_train_valid_test_datasets([prefix], [1.0], cache_dir=cache, build_on_this_rank=False,
                                             split="100,0,0", num_samples=(200_000, 0, 0), seq_length=64, seed=5)[0]
    for name in ("doc_idx", "sample_idx", "shuffle_idx"):
        np.testing.assert_array_equal(getattr(loaded, name), getattr(reference, name))
