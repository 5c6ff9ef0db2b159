"""Benchmark: build the GPT index arrays at BLOOM's scale, and read samples from a real dataset.

    python bench/data_index.py               # 350M documents, ~350B tokens, seq 2048 (~171M samples)
    python bench/data_index.py --scale 0.05  # a quick run at 5% of that

Documents sizes: a synthetic lognormal table (sigma 1, mean ~1000 tokens), as int32 like a real
`.idx`. The build runs the real code path (`build_index_files`: doc_idx, streamed sample_idx,
shuffle_idx, each saved with fsync) into a temp cache directory. Reported: wall time per array,
peak RSS (the process's high-water mark from getrusage, including the 1.4 GB sizes table), and
the per-sample read rate of `GPTDataset` on the shipped corpus. Writes bench/results/data_index.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from trainer.data.gpt_dataset import GPTDataset, build_index_files  # noqa: E402
from trainer.data.index_cache import cache_entry  # noqa: E402
from trainer.data.indexed_dataset import MMapIndexedDataset  # noqa: E402
from trainer.data.prepare_corpus import prepare_corpus  # noqa: E402

BLOOM_DOCUMENTS = 350_000_000
MEAN_TOKENS = 1000
SIGMA = 1.0


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30  # ru_maxrss is KiB on Linux


def synthetic_sizes(num_documents: int, seed: int) -> np.ndarray:
    """int32 lognormal sizes with mean ~MEAN_TOKENS, generated in chunks (no float64 copy of 350M)."""
    rng = np.random.default_rng(seed)
    mu = np.log(MEAN_TOKENS) - SIGMA**2 / 2
    sizes = np.empty(num_documents, dtype=np.int32)
    step = 1 << 24
    for start in range(0, num_documents, step):
        stop = min(num_documents, start + step)
        # float32 normal -> exp: lognormal(mu, SIGMA) at a third of float64's cost.
        chunk = rng.standard_normal(size=stop - start, dtype=np.float32)
        chunk *= SIGMA
        chunk += mu
        np.exp(chunk, out=chunk)
        np.clip(chunk, 1, 1_000_000, out=chunk)
        sizes[start:stop] = chunk
    return sizes


def bench_build(num_documents: int, seq_length: int, seed: int, epochs: float, cache_dir: Path) -> dict:
    load_before = os.getloadavg()
    started = time.monotonic()
    sizes = synthetic_sizes(num_documents, seed)
    generate_s = time.monotonic() - started
    tokens = int(sizes.sum(dtype=np.int64))
    # epochs=1: every sample one epoch holds (BLOOM's ~171M at 350B tokens).
    num_samples = int(((tokens * epochs) - 1) // seq_length)
    entry = cache_entry(cache_dir, "bench", {"synthetic": num_documents, "seed": seed}, f"{num_samples}ns")
    rss_before = peak_rss_gib()
    timings: dict = {}
    started, cpu_started = time.monotonic(), time.process_time()
    build_index_files(entry, sizes, range(num_documents), num_samples, seq_length, seed, timings)
    build_s = time.monotonic() - started
    # CPU seconds of all threads: on a shared machine the wall time also counts waiting for a core.
    build_cpu_s = time.process_time() - cpu_started
    files = {p.name.split("_")[-2] + "_idx": p.stat().st_size for p in cache_dir.glob("*.npy")}
    return {
        "documents": num_documents, "tokens": tokens, "seq_length": seq_length, "num_samples_asked": num_samples,
        "generate_sizes_s": round(generate_s, 2), "build_s": round(build_s, 2),
        "build_cpu_s": round(build_cpu_s, 2), "load_avg_before": load_before,
        "phases_s": {k: round(v, 2) if isinstance(v, float) else v for k, v in timings.items()},
        "peak_rss_gib_before_build": round(rss_before, 3), "peak_rss_gib": round(peak_rss_gib(), 3),
        "sizes_table_gib": round(sizes.nbytes / 2**30, 3), "file_bytes": files,
    }


def bench_reads(seq_length: int, reads: int, cache_dir: Path) -> dict:
    prefix = prepare_corpus(cache_dir / "corpus")["prefix"]
    indexed = MMapIndexedDataset(prefix)
    num_samples = 2 * indexed.num_tokens // seq_length
    ds = GPTDataset("train", indexed, range(len(indexed)), num_samples, seq_length, 1, cache_dir, True)
    order = np.random.default_rng(0).integers(0, len(ds), size=reads)
    started = time.monotonic()
    checksum = 0
    for i in order:
        checksum += int(ds[int(i)]["text"][-1])
    elapsed = time.monotonic() - started
    return {"corpus_tokens": indexed.num_tokens, "seq_length": seq_length, "samples": len(ds), "reads": reads,
            "samples_per_s": round(reads / elapsed, 1), "tokens_per_s": round(reads * (seq_length + 1) / elapsed),
            "us_per_sample": round(1e6 * elapsed / reads, 1), "checksum": checksum}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of BLOOM's 350M documents")
    parser.add_argument("--seq-length", type=int, default=2048)
    parser.add_argument("--epochs", type=float, default=1.0, help="samples asked, in epochs of the table")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--reads", type=int, default=20_000, help="random samples read from the real corpus")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "results" / "data_index.json")
    parser.add_argument("--workdir", type=Path, default=None, help="where the index files go (default: a temp dir)")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="data_index_", dir=args.workdir))
    try:
        reads = bench_reads(args.seq_length, args.reads, workdir / "reads")
        print("reads:", json.dumps(reads), flush=True)
        build = bench_build(int(BLOOM_DOCUMENTS * args.scale), args.seq_length, args.seed, args.epochs,
                            workdir / "build")
        print("build:", json.dumps(build), flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result = {
        "scale": args.scale, "build": build, "reads": reads,
        "targets": {"build_s": 60, "peak_rss_gib": 4},
        "meets_targets": build["build_s"] < 60 and build["peak_rss_gib"] < 4,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__,
                    "load_avg_at_end": os.getloadavg()},
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
