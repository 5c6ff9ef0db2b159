"""How fast one rank reads its checkpoint shard back, from the shared directory and from /dev/shm,
and how fast it hashes it: the local figures behind orchestrator/plan/restart_paths.py.

    python bench/load_bandwidth.py [--mib 512] [--rounds 3] [--out bench/results/load_bandwidth.json]

One process, one file of --mib MiB of random bytes (a shard: incompressible, as fp32 Adam state is):
- shared: the file in the run's checkpoint folder (here the machine's disk, where GPFS would be),
  fsynced, then dropped from the page cache (posix_fadvise DONTNEED) before each read, so the read
  comes from the device and not from memory;
- shm: the same bytes in /dev/shm (host memory, what a node-local copy in RAM is);
- sha256: hashlib over the bytes already in memory (what verifying a shard against its manifest
  costs per rank, on one core).
Each figure is the median over --rounds reads of the whole file in 8 MiB chunks (readinto one
buffer: what torch.load's reader does, without unpickling).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
CHUNK = 8 << 20


def write_shard(path: Path, size: int) -> None:
    block = os.urandom(CHUNK)
    with open(path, "wb") as handle:
        for _ in range(size // CHUNK):
            handle.write(block)
        handle.flush()
        os.fsync(handle.fileno())


def read_seconds(path: Path, drop_cache: bool) -> float:
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    fd = os.open(path, os.O_RDONLY)
    try:
        if drop_cache:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        start = time.perf_counter()
        while os.readv(fd, [view]) > 0:
            pass
        return time.perf_counter() - start
    finally:
        os.close(fd)


def hash_seconds(path: Path) -> float:
    data = path.read_bytes()
    start = time.perf_counter()
    hashlib.sha256(data).hexdigest()
    return time.perf_counter() - start


def measure(mib: int, rounds: int, shared_dir: Path) -> dict:
    size = mib << 20
    figures: dict[str, dict] = {}
    for name, folder, drop in (("shared", shared_dir, True), ("shm", Path("/dev/shm"), False)):
        holder = Path(tempfile.mkdtemp(prefix="load-bw-", dir=folder))
        shard = holder / "mp_rank_00_model_states.pt"
        try:
            write_shard(shard, size)
            seconds = [read_seconds(shard, drop) for _ in range(rounds)]
            if name == "shm":
                hashed = [hash_seconds(shard) for _ in range(rounds)]
                figures["sha256"] = _figure(size, hashed)
        finally:
            shard.unlink(missing_ok=True)
            holder.rmdir()
        figures[name] = _figure(size, seconds)
    return figures


def _figure(size: int, seconds: list[float]) -> dict:
    median = statistics.median(seconds)
    return {"seconds": [round(s, 4) for s in seconds], "median_seconds": round(median, 4),
            "gb_per_second": round(size / median / 1e9, 3)}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shared-dir", type=Path, default=RESULTS.parent.parent / "data")
    parser.add_argument("--out", type=Path, default=RESULTS / "load_bandwidth.json")
    args = parser.parse_args()
    if args.mib < 8 or args.rounds < 1:
        parser.error("--mib at least 8, --rounds at least 1")
    args.shared_dir.mkdir(parents=True, exist_ok=True)
    figures = measure(args.mib, args.rounds, args.shared_dir)
    result = {
        "what": "one rank reading its checkpoint shard: shared directory (page cache dropped) vs /dev/shm; "
        "sha256 over it in memory",
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}",
        "shard_mib": args.mib,
        "rounds": args.rounds,
        **figures,
        "shm_over_shared": round(figures["shm"]["gb_per_second"] / figures["shared"]["gb_per_second"], 2),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for name in ("shared", "shm", "sha256"):
        print(f"{name:<7} {figures[name]['gb_per_second']:8.3f} GB/s  (median of {args.rounds})")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
