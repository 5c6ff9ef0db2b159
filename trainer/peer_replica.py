"""Checkpoint files moved between nodes inside the job: the buddy replica at each save, and the
files a relaunched rank fetches from the node that holds them.

The transport is torch.distributed point-to-point (isend/irecv of uint8 tensors) on a gloo group
of the job's own, not a socket server of ours: the group is made from the job's rendezvous, which
is already the trust boundary every rank accepted (a server of ours would listen on the node's
network for anyone and need its own secret and port); gloo runs over TCP between hosts on CPU and
GPU jobs alike, so the copies never take GPU memory or an NCCL stream from training; and a peer
that dies mid-transfer ends the transfer with the group's timeout, not a hang. The cost: the
sending and receiving ranks must both be in the collective sequence, so transfers run in rounds
that every rank walks in the same order.

A round: every rank sends at most one file and receives at most one (a ring's replicas move all at
once, no rank serialises the others). Each transfer first sends a header (the byte count, or -1
when the holder cannot produce the file with the size the manifest says), then the bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as tdist


@dataclass(frozen=True)
class Transfer:
    src: int  # the rank that sends (holds the file)
    dst: int  # the rank that receives
    rel: str  # the file, relative to the checkpoint folder
    size: int  # bytes, as the manifest says


def schedule_rounds(transfers: list[Transfer]) -> list[list[Transfer]]:
    """Transfers in rounds, in order, each rank at most once a sender and once a receiver a round;
    the same rounds on every rank for the same list."""
    rounds: list[list[Transfer]] = []
    busy: list[tuple[set[int], set[int]]] = []
    for transfer in transfers:
        for index, (senders, receivers) in enumerate(busy):
            if transfer.src not in senders and transfer.dst not in receivers:
                rounds[index].append(transfer)
                senders.add(transfer.src)
                receivers.add(transfer.dst)
                break
        else:
            rounds.append([transfer])
            busy.append(({transfer.src}, {transfer.dst}))
    return rounds


def run_transfers(transfers: list[Transfer], group, read: Callable[[Transfer], bytearray | None],
                  write: Callable[[Transfer, memoryview | None], None]) -> int:
    """Collective over `group` (every rank passes the same list). `read(t)` on the sender: the
    bytes (a bytearray: sent as a tensor over that very buffer), or None when it cannot;
    `write(t, data)` on the receiver: a view of the received bytes, None when the sender could
    not. Returns the bytes this rank received. A file is held in memory whole while it moves: at
    BLOOM's size a rank's largest file (its ZeRO partition, ~5 GB) once on each side."""
    rank = tdist.get_rank()
    received = 0
    for batch in schedule_rounds(transfers):
        mine_out = [t for t in batch if t.src == rank]
        mine_in = [t for t in batch if t.dst == rank]
        payload = {}
        headers_out, headers_in, pending = {}, {}, []
        for t in mine_out:
            data = read(t)
            ok = data is not None and len(data) == t.size
            payload[t] = data if ok else None
            headers_out[t] = torch.tensor([t.size if ok else -1], dtype=torch.int64)
            pending.append(tdist.isend(headers_out[t], t.dst, group=group))
        for t in mine_in:
            headers_in[t] = torch.zeros(1, dtype=torch.int64)
            pending.append(tdist.irecv(headers_in[t], t.src, group=group))
        for work in pending:
            work.wait()
        pending, buffers = [], {}
        for t in mine_out:
            if payload[t] is not None and t.size:
                pending.append(tdist.isend(torch.frombuffer(payload[t], dtype=torch.uint8), t.dst, group=group))
        for t in mine_in:
            size = int(headers_in[t].item())
            if size > 0:
                buffers[t] = torch.empty(size, dtype=torch.uint8)
                pending.append(tdist.irecv(buffers[t], t.src, group=group))
        for work in pending:
            work.wait()
        for t in mine_in:
            size = int(headers_in[t].item())
            data = None if size < 0 else memoryview(buffers[t].numpy()) if size else memoryview(b"")
            received += max(size, 0)
            write(t, data)
    return received
