"""SLURM host lists (`node[01-04,07]`) to names and back, without calling `scontrol`: python-hostlist
(NSC's library, what `hostlist` on many clusters is), set to expand as SLURM does.

tests/slurm/test_local_cluster.py compares the expansion with `scontrol show hostnames` on the
local cluster. The one setting that matters: SLURM keeps a name given twice, python-hostlist drops
it unless `allow_duplicates` (our callers pair names with task ranks, so a dropped one would
shift every rank after it). Compressing sorts the names (`scontrol show hostlistsorted`): it is
only used to show a list to people.
"""

from __future__ import annotations

import hostlist


def expand_hostlist(text: str) -> list[str]:
    """`node[01-03],gpu7` -> [node01, node02, node03, gpu7]. Raises ValueError on a malformed list."""
    try:
        return hostlist.expand_hostlist(text.strip(), allow_duplicates=True)
    except hostlist.BadHostlist as exc:
        raise ValueError(f"malformed host list {text!r}: {exc}") from None


def compress_hostlist(names: list[str]) -> str:
    """[node01, node02, node03, gpu7] -> `gpu7,node[01-03]` (sorted, as SLURM's hostlistsorted).
    Raises ValueError for a name a host list cannot hold (one with "[", "]" or ",")."""
    try:
        return hostlist.collect_hostlist(list(names))
    except hostlist.BadHostlist as exc:
        raise ValueError(f"cannot write {names!r} as a host list: {exc}") from None
