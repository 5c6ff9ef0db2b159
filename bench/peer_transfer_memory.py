"""What a peer transfer of one checkpoint file costs in host memory and time (trainer/peer_replica.py):
the extra resident memory on the sending and on the receiving rank, against the file's size.

    python bench/peer_transfer_memory.py [--mib 1024] [--chunk-mib 64] [--out bench/results/peer_transfer_memory.json]

Two gloo ranks on this machine, each with its own node-local store (trainer/local_copies.py) in a
temporary folder on disk: rank 0 holds one file of --mib MiB of random bytes (a ZeRO partition:
incompressible), rank 1 fetches it, as a relaunched rank fetches a lost node's file. Each rank
resets its peak resident set (/proc/self/clear_refs) after the group is up and reports its peak
above what it held then (VmHWM - VmRSS): the buffers of the transfer, not the interpreter or
torch. The receiver's copy is then checked against the sender's sha256.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
RESULTS = REPO / "bench" / "results"
MIB = 1 << 20
REL = "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _rank(rank: int, world: int, port: int, root: str, size: int, chunk: int) -> None:
    import torch.distributed as dist

    from trainer.local_copies import FETCHED, OWN, LocalStore
    from trainer.peer_replica import Transfer, run_transfers

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=600))
    store = LocalStore.of(Path(root) / "local", Path(root), "1", f"node{rank}").create()
    dist.barrier()
    Path("/proc/self/clear_refs").write_text("5")  # the peak resident set starts again from here
    rss_before = _status_kib("VmRSS")
    started = time.perf_counter()
    run_transfers([Transfer(0, 1, REL, size)], None, lambda t: store.open_held(1, OWN, t.rel),
                  lambda t: store.incoming(1, FETCHED, t.rel), chunk_bytes=chunk)
    seconds = time.perf_counter() - started
    peak_extra_mib = (_status_kib("VmHWM") - rss_before) / 1024
    (Path(root) / f"rank{rank}.json").write_text(json.dumps({"peak_extra_mib": round(peak_extra_mib, 1),
                                                             "seconds": round(seconds, 3)}))
    dist.destroy_process_group()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(8 * MIB):
            digest.update(block)
    return digest.hexdigest()


def main() -> None:
    import torch.multiprocessing as mp

    from tests.trainer.launch_local import free_port
    from trainer.local_copies import FETCHED, OWN, LocalStore

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024, help="the file's size")
    parser.add_argument("--chunk-mib", type=int, default=64, help="run_transfers' chunk_bytes")
    parser.add_argument("--out", type=Path, default=RESULTS / "peer_transfer_memory.json")
    args = parser.parse_args()
    size, chunk = args.mib * MIB, args.chunk_mib * MIB
    with tempfile.TemporaryDirectory() as root:
        holder = LocalStore.of(Path(root) / "local", Path(root), "1", "node0").create()
        source = holder.path(1, OWN, REL)
        source.parent.mkdir(parents=True)
        block = os.urandom(8 * MIB)
        with open(source, "wb") as handle:
            for _ in range(size // len(block)):
                handle.write(block)
            handle.write(block[: size % len(block)])
        mp.spawn(_rank, args=(2, free_port(), root, size, chunk), nprocs=2, join=True)
        sender, receiver = (json.loads((Path(root) / f"rank{r}.json").read_text()) for r in range(2))
        fetched = LocalStore.of(Path(root) / "local", Path(root), "1", "node1").path(1, FETCHED, REL)
        equal = _sha256(fetched) == _sha256(source)
    result = {"file_mib": args.mib, "chunk_mib": args.chunk_mib, "sender_peak_extra_mib": sender["peak_extra_mib"],
              "receiver_peak_extra_mib": receiver["peak_extra_mib"], "seconds": receiver["seconds"],
              "mib_per_s": round(args.mib / receiver["seconds"], 1), "bytes_equal": equal,
              "machine": f"{platform.node()}, {os.cpu_count()} cores"}
    print(json.dumps(result, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    if not equal:
        raise SystemExit("the fetched copy differs from the file sent")


if __name__ == "__main__":
    main()
