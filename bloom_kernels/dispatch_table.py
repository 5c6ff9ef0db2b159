"""The measured table that `bloom_kernels.dispatch` follows: per device, op, dtype, shape class and mode,
each candidate implementation's time and whether it was correct; the fastest correct one runs.

A row (one JSON object in `rows` of bloom_kernels/dispatch_table.json):
    {"device": "NVIDIA H200",          torch.cuda.get_device_name(), or "cpu"
     "op": "layer_norm",               one of OPS
     "dtype": "bfloat16",              the input dtype (torch.<name>)
     "size_class": 16384,              SIZE_DIMENSION below, rounded up to a power of two
     "mode": "fwd_bwd",                "fwd" (no autograd recording) or "fwd_bwd" (training)
     "shape": [8192, 14336],           the shape it was measured at (information only)
     "candidates": {"triton": {"ms": 0.692, "correct": true, "max_error": 0.0078}, ...},
     "source": "a key of the file's \"sources\" (which run measured it)", "note": "optional"}
A candidate with "ms": null was not timed (unavailable there, or incorrect); "correct": false is
never chosen; "correct": null means "not checked by that run" (only in the first version of the
table, imported from a benchmark that did not check; see its row's source). A row with no timed
candidate says the class is known but unmeasured: the fallback applies.

Shape class: the one dimension that moves these ops' speed most at BLOOM's shapes, rounded up to a
power of two: the row width (hidden or ffn) for layer_norm and bias_gelu, the key length for
scale_mask_softmax and attention. Coarse on purpose: one measured shape stands for its class.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

OPS = ("layer_norm", "bias_gelu", "scale_mask_softmax", "attention")
# every implementation an op has; "reference" is the plain-torch definition
IMPLEMENTATIONS = {
    "layer_norm": ("reference", "triton", "compiled"),
    "bias_gelu": ("reference", "triton", "compiled"),
    "scale_mask_softmax": ("reference", "triton", "compiled"),
    "attention": ("reference", "chunked", "triton", "compiled", "flex", "sdpa"),
}
MODES = ("fwd", "fwd_bwd")
SIZE_DIMENSION = {"layer_norm": "row width (x.shape[-1])", "bias_gelu": "row width (x.shape[-1])",
                  "scale_mask_softmax": "key length (scores.shape[-1])", "attention": "key length (k.shape[2])"}
DEFAULT_TABLE = Path(__file__).with_name("dispatch_table.json")


def size_class(op: str, tensors: tuple[torch.Tensor, ...]) -> int:
    """The row width (layer_norm, bias_gelu) or key length (softmax, attention), up to a power of 2."""
    size = tensors[1].shape[2] if op == "attention" else tensors[0].shape[-1]
    return 1 << max(0, math.ceil(math.log2(max(1, int(size)))))


def mode_of(tensors: tuple[torch.Tensor, ...]) -> str:
    """'fwd_bwd' when autograd records this call (training), else 'fwd' (eval, inference)."""
    return "fwd_bwd" if torch.is_grad_enabled() and any(t.requires_grad for t in tensors) else "fwd"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class Row:
    device: str
    op: str
    dtype: str
    size_class: int
    mode: str
    candidates: Mapping[str, Mapping]
    source: str
    shape: tuple[int, ...] = ()
    note: str = ""

    @property
    def key(self) -> tuple[str, str, str, int, str]:
        return (self.device, self.op, self.dtype, self.size_class, self.mode)

    def ranked(self) -> list[tuple[float, str]]:
        """(ms, impl) of the timed candidates not known to be incorrect, fastest first."""
        timed = [(c["ms"], impl) for impl, c in self.candidates.items()
                 if c.get("ms") is not None and c.get("correct") is not False]
        return sorted(timed)

    def fastest_correct(self, unavailable: Callable[[str], str | None] = lambda impl: None) -> str | None:
        """The fastest candidate that is not incorrect and can run here (`unavailable(impl)` is None)."""
        for _ms, impl in self.ranked():
            if unavailable(impl) is None:
                return impl
        return None


@dataclass
class Table:
    rows: dict[tuple, Row] = field(default_factory=dict)
    source: str = "empty"
    sources: dict[str, str] = field(default_factory=dict)

    def row(self, device: str, op: str, dtype: torch.dtype, size: int, mode: str) -> Row | None:
        return self.rows.get((device, op, dtype_name(dtype), size, mode))


def _fail(where: str, what: str) -> None:
    raise ValueError(f"{where}: {what} (fix the row, or re-measure: python bench/kernels_side_by_side.py)")


def parse_row(raw: Mapping, where: str) -> Row:
    for key in ("device", "op", "dtype", "size_class", "mode", "candidates", "source"):
        if key not in raw:
            _fail(where, f"missing key {key!r}")
    op, mode, size = raw["op"], raw["mode"], raw["size_class"]
    if op not in IMPLEMENTATIONS:
        _fail(where, f"op = {op!r} is not one of {', '.join(OPS)}")
    if mode not in MODES:
        _fail(where, f"mode = {mode!r} is not one of {', '.join(MODES)}")
    if not isinstance(size, int) or size < 1 or size & (size - 1):
        _fail(where, f"size_class = {size!r} is not a power of two")
    if not isinstance(getattr(torch, str(raw["dtype"]), None), torch.dtype):
        _fail(where, f"dtype = {raw['dtype']!r} is not a torch dtype name (e.g. bfloat16)")
    for impl, cand in raw["candidates"].items():
        if impl not in IMPLEMENTATIONS[op]:
            _fail(where, f"candidate {impl!r} is not an implementation of {op} ({', '.join(IMPLEMENTATIONS[op])})")
        ms = cand.get("ms")
        if ms is not None and not (isinstance(ms, (int, float)) and ms > 0 and math.isfinite(ms)):
            _fail(where, f"candidate {impl!r}: ms = {ms!r} is not a positive time or null")
        if cand.get("correct") not in (True, False, None):
            _fail(where, f"candidate {impl!r}: correct = {cand.get('correct')!r} is not true, false or null")
    return Row(device=str(raw["device"]), op=op, dtype=str(raw["dtype"]), size_class=size, mode=mode,
               candidates=dict(raw["candidates"]), source=str(raw["source"]),
               shape=tuple(raw.get("shape", ())), note=str(raw.get("note", "")))


def load_table(path: Path | str = DEFAULT_TABLE) -> Table:
    """Read and validate a table file; a missing file is an empty table (everything falls back)."""
    path = Path(path)
    if not path.exists():
        return Table(source=f"{path} (missing: every op takes the fallback)")
    data = json.loads(path.read_text())
    table = Table(source=str(path), sources=dict(data.get("sources", {})))
    for index, raw in enumerate(data.get("rows", [])):
        row = parse_row(raw, f"{path} row {index}")
        if row.key in table.rows:
            _fail(f"{path} row {index}", f"a second row for {row.key}")
        table.rows[row.key] = row
    return table


def row_to_json(row: Row) -> dict:
    out = {"device": row.device, "op": row.op, "dtype": row.dtype, "size_class": row.size_class,
           "mode": row.mode, "shape": list(row.shape), "candidates": dict(row.candidates), "source": row.source}
    if row.note:
        out["note"] = row.note
    return out


def write_table(path: Path | str, rows: list[Row], about: str, sources: Mapping[str, str]) -> None:
    """Write rows sorted by key, one a line, atomically (temp file, then rename). `sources`
    describes each source a row names (the run, its versions, what was checked)."""
    path = Path(path)
    ordered = sorted(rows, key=lambda r: (r.device, OPS.index(r.op), r.dtype, r.size_class, MODES.index(r.mode)))
    used = {r.source for r in ordered}
    lines = [json.dumps(row_to_json(r)) for r in ordered]
    text = (f'{{"about": {json.dumps(about)},\n "sources": {json.dumps({k: v for k, v in sources.items() if k in used}, indent=2)},\n'
            ' "rows": [\n  ' + ",\n  ".join(lines) + "\n]}\n")
    json.loads(text)  # the hand-made layout must stay valid JSON
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def merge_rows(path: Path | str, new_rows: list[Row], about: str, sources: Mapping[str, str]) -> None:
    """Replace the rows with the same keys as `new_rows` (one device's re-measurement), keep the rest."""
    path = Path(path)
    old = load_table(path)
    merged = {**old.rows, **{r.key: r for r in new_rows}}
    write_table(path, list(merged.values()), about, {**old.sources, **sources})
