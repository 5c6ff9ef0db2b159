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
when the holder cannot produce the file with the size the manifest says), then the bytes in chunks
of at most CHUNK_BYTES: the sender reads a chunk from its file into a buffer and sends it, the
receiver writes it where the file goes before it takes the next. A rank so holds at most two
chunks of the file it sends and two of the one it receives (double-buffered: the disk read or write
of one chunk overlaps the network transfer of the next), whatever the file's size. Every chunk
comes with a status (its byte count, or -1 when the sender could not read it: a file that shrank
or an I/O error mid-file); on -1 both sides end that transfer at that chunk and the receiver
discards what it wrote, so a sender that fails mid-file costs the receiver one chunk, never a hang.
What a receiver keeps is checked against the manifest's sha256 before any load uses it
(trainer/restore_order.py), as every local copy is.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO, Protocol

import torch
import torch.distributed as tdist

# The bytes of a file in flight at once on each side. Bounded, because at BLOOM's size a rank's
# largest file (its ZeRO partition) is ~5 GB and 8 ranks of a node move theirs at the moment the
# async-save snapshot already holds the node's checkpoint in host RAM: 64 MiB x 2 buffers x (send
# + receive) x 8 ranks is 2 GiB a node, inside the planner's SNAPSHOT_MARGIN (25% of ~51 GB),
# where whole files would take 80 GB. Not smaller, because each chunk costs a message pair and a
# wait: at 64 MiB that is < 1% of the chunk's time on the wire even at 10 GB/s.
CHUNK_BYTES = 64 * 1024 * 1024
_HEADER, _STATUS, _DATA = 1, 2, 3  # message tags: one kind of message per tag, matched in order


@dataclass(frozen=True)
class Transfer:
    src: int  # the rank that sends (holds the file)
    dst: int  # the rank that receives
    rel: str  # the file, relative to the checkpoint folder
    size: int  # bytes, as the manifest says


class Sink(Protocol):
    """Where a received file goes, chunk by chunk."""

    def write(self, chunk: memoryview) -> None: ...  # raises OSError when it cannot

    def finish(self, complete: bool) -> None: ...  # complete: keep the file; else drop what was written


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


def run_transfers(transfers: list[Transfer], group, open_source: Callable[[Transfer], BinaryIO | None],
                  open_sink: Callable[[Transfer], Sink | None], chunk_bytes: int = CHUNK_BYTES) -> int:
    """Collective over `group` (every rank passes the same list). `open_source(t)` on the sender:
    the file opened for reading (closed here), or None when it cannot; `open_sink(t)` on the
    receiver, only when the sender can send: where the chunks go, or None to receive and discard
    them. Returns the bytes this rank received in files that arrived whole."""
    rank = tdist.get_rank()
    largest = max((t.size for t in transfers), default=0)
    buffers = _Buffers(max(1, min(chunk_bytes, largest)))
    received = 0
    for batch in schedule_rounds(transfers):
        out = next((t for t in batch if t.src == rank), None)
        into = next((t for t in batch if t.dst == rank), None)
        received += _run_round(out, into, group, open_source, open_sink, buffers)
    return received


class _Buffers:
    """Two chunk buffers to send from and two to receive into, reused by every round (allocated
    empty: a small file touches only its own bytes)."""

    def __init__(self, chunk: int) -> None:
        self.chunk = chunk
        self.send = [torch.empty(chunk, dtype=torch.uint8) for _ in range(2)]
        self.recv = [torch.empty(chunk, dtype=torch.uint8) for _ in range(2)]


def _chunk_lengths(size: int, chunk: int) -> list[int]:
    return [min(chunk, size - start) for start in range(0, size, chunk)]


class _Outgoing:
    def __init__(self, transfer: Transfer, source: BinaryIO, buffers: _Buffers) -> None:
        self.transfer, self.source, self.buffers = transfer, source, buffers
        self.lengths = _chunk_lengths(transfer.size, buffers.chunk)
        self.count = len(self.lengths)  # chunks to send: cut short after a chunk that failed
        self.status = [torch.zeros(1, dtype=torch.int64) for _ in range(2)]

    def load(self, k: int) -> None:
        """Chunk k read into its buffer, its status set (-1: not read, this chunk is the last)."""
        length = self.lengths[k]
        view = memoryview(self.buffers.send[k % 2].numpy())[:length]
        got = 0
        try:
            while got < length and (n := self.source.readinto(view[got:])):
                got += n
        except OSError as exc:
            print(f"[peer] {self.transfer.rel}: read failed at byte {k * self.buffers.chunk + got}: {exc}; "
                  f"rank {self.transfer.dst} drops what it got", file=sys.stderr, flush=True)
        if got < length:
            self.count = k + 1
        self.status[k % 2][0] = length if got == length else -1

    def post(self, k: int, group) -> list:
        dst = self.transfer.dst
        data = self.buffers.send[k % 2][:self.lengths[k]]  # a failed chunk still goes: the receiver waits for it
        return [tdist.isend(self.status[k % 2], dst, group=group, tag=_STATUS),
                tdist.isend(data, dst, group=group, tag=_DATA)]


class _Incoming:
    def __init__(self, transfer: Transfer, sink: Sink | None, buffers: _Buffers) -> None:
        self.transfer, self.sink, self.buffers = transfer, sink, buffers
        self.lengths = _chunk_lengths(transfer.size, buffers.chunk)
        self.count = len(self.lengths)
        self.status = [torch.zeros(1, dtype=torch.int64) for _ in range(2)]
        self.ready: int | None = None  # a chunk received whole, not yet written
        self.broken = sink is None  # the sender failed or the sink did: receive the rest, keep nothing
        self.received = 0

    def post(self, k: int, group) -> list:
        src = self.transfer.src
        return [tdist.irecv(self.status[k % 2], src, group=group, tag=_STATUS),
                tdist.irecv(self.buffers.recv[k % 2][:self.lengths[k]], src, group=group, tag=_DATA)]

    def check(self, k: int) -> None:
        if int(self.status[k % 2].item()) == self.lengths[k]:
            self.ready = k
            self.received += self.lengths[k]
        else:
            self.count = k + 1  # the sender stops here too
            self.broken = True

    def store(self) -> None:
        if self.ready is None:
            return
        k, self.ready = self.ready, None
        if self.broken:
            return
        try:
            self.sink.write(memoryview(self.buffers.recv[k % 2].numpy())[:self.lengths[k]])
        except OSError as exc:
            print(f"[peer] {self.transfer.rel} from rank {self.transfer.src} not kept: {exc}",
                  file=sys.stderr, flush=True)
            self.broken = True

    def finish(self) -> int:
        self.store()
        if self.sink is not None:
            try:
                self.sink.finish(not self.broken)
            except OSError as exc:
                print(f"[peer] {self.transfer.rel} from rank {self.transfer.src} not kept: {exc}",
                      file=sys.stderr, flush=True)
                self.broken = True
        return 0 if self.broken else self.received


def _open_checked(open_source: Callable[[Transfer], BinaryIO | None], t: Transfer) -> BinaryIO | None:
    """The source, opened and of the manifest's size, or None."""
    source = open_source(t)
    if source is None:
        return None
    try:
        size = source.seek(0, 2)
        source.seek(0)
    except OSError:
        size = -1
    if size != t.size:
        source.close()
        return None
    return source


def _run_round(out: Transfer | None, into: Transfer | None, group, open_source, open_sink,
               buffers: _Buffers) -> int:
    source = _open_checked(open_source, out) if out is not None else None
    receiving = None
    try:
        pending = []
        if out is not None:
            header_out = torch.tensor([out.size if source is not None else -1], dtype=torch.int64)
            pending.append(tdist.isend(header_out, out.dst, group=group, tag=_HEADER))
        if into is not None:
            header_in = torch.zeros(1, dtype=torch.int64)
            pending.append(tdist.irecv(header_in, into.src, group=group, tag=_HEADER))
        for work in pending:
            work.wait()
        sending = _Outgoing(out, source, buffers) if source is not None else None
        if into is not None and int(header_in.item()) >= 0:
            receiving = _Incoming(into, open_sink(into), buffers)
        _stream(sending, receiving, group)
        got = receiving.finish() if receiving is not None else 0
        receiving = None
        return got
    finally:
        if source is not None:
            source.close()
        if receiving is not None and receiving.sink is not None:  # the group failed mid-file (a peer died)
            receiving.sink.finish(False)


def _stream(out: _Outgoing | None, into: _Incoming | None, group) -> None:
    """Chunk k moves while chunk k+1 is read and chunk k-1 written; the sender and the receiver
    count the same chunks (the status of each says when a transfer ends early)."""
    if out is not None and out.count:
        out.load(0)
    k = 0
    while (out is not None and k < out.count) or (into is not None and k < into.count):
        pending = []
        if out is not None and k < out.count:
            pending += out.post(k, group)
        if into is not None and k < into.count:
            pending += into.post(k, group)
        if out is not None and k + 1 < out.count:
            out.load(k + 1)
        if into is not None:
            into.store()
        for work in pending:
            work.wait()
        if into is not None and k < into.count:
            into.check(k)
        k += 1
