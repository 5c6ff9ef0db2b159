"""SLURM host lists (`node[01-04,07]`) to names and back, without calling `scontrol`."""

from __future__ import annotations

import re

_BRACKET = re.compile(r"^([^\[\],]*)\[([^\]]+)\](.*)$")


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    if current:
        parts.append(current)
    return parts


def expand_hostlist(hostlist: str) -> list[str]:
    """`node[01-03],gpu7` -> [node01, node02, node03, gpu7]. Raises ValueError on a malformed list."""
    names: list[str] = []
    for part in _split_top_level(hostlist.strip()):
        match = _BRACKET.match(part)
        if not match:
            if "[" in part or "]" in part:
                raise ValueError(f"malformed host list {hostlist!r}")
            names.append(part)
            continue
        prefix, ranges, suffix = match.groups()
        for item in ranges.split(","):
            if "-" in item:
                lo, hi = item.split("-", 1)
                if not (lo.isdigit() and hi.isdigit()) or int(hi) < int(lo):
                    raise ValueError(f"malformed range {item!r} in host list {hostlist!r}")
                for k in range(int(lo), int(hi) + 1):
                    names.extend(expand_hostlist(f"{prefix}{k:0{len(lo)}d}{suffix}"))
            elif item.isdigit():
                names.extend(expand_hostlist(f"{prefix}{item}{suffix}"))
            else:
                raise ValueError(f"malformed range {item!r} in host list {hostlist!r}")
    return names


def compress_hostlist(names: list[str]) -> str:
    """[node01, node02, node03, gpu7] -> `node[01-03],gpu7` (order of first appearance kept)."""
    groups: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    order: list[tuple[str, int] | str] = []
    for name in names:
        match = re.match(r"^(.*?)(\d+)$", name)
        if not match:
            plain.append(name)
            order.append(name)
            continue
        key = (match.group(1), len(match.group(2)))
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(int(match.group(2)))
    out = []
    for key in order:
        if isinstance(key, str):
            out.append(key)
            continue
        prefix, width = key
        numbers = sorted(set(groups[key]))
        if len(numbers) == 1:
            out.append(f"{prefix}{numbers[0]:0{width}d}")
            continue
        ranges, start, prev = [], numbers[0], numbers[0]
        for n in numbers[1:] + [None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            ranges.append(f"{start:0{width}d}" if start == prev else f"{start:0{width}d}-{prev:0{width}d}")
            if n is not None:
                start = prev = n
        out.append(f"{prefix}[{','.join(ranges)}]")
    return ",".join(out)
