"""The 3D layout (tp, pp, dp) and its process groups, in Megatron's rank order.

Rank order: tensor parallel fastest, then data parallel, then pipeline parallel:

    rank = pp_rank * (dp * tp) + dp_rank * tp + tp_rank

so that the tp ranks of one model replica are neighbours (the same node: TP needs the fastest
links), and a pipeline stage's dp replicas follow. This is exactly DeepSpeed's
`PipeModelDataParallelTopology(num_pp, num_mp, num_dp)` (axes ['pipe', 'data', 'model'], the last
axis fastest), which `build_pipeline_module` hands to `PipelineModule`. We build our groups FROM
that topology object, so our TP groups and DeepSpeed's pipeline/data groups are the same rank
lists by construction (and `ParallelLayout.rank_of` checks the arithmetic against it).

Single process: with tp = pp = dp = 1 nothing needs torch.distributed. Until
`initialize_model_parallel` runs, the getters below describe that trivial layout (tp size 1, no
group), and every tensor-parallel collective is the identity; building a layer with tp > 1 before
the groups exist is an error that says so. Multi-rank code (and the gloo tests) call
`initialize_model_parallel(layout)` once, after `torch.distributed.init_process_group`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

import torch.distributed as dist

from orchestrator.plan.config import check_layout


class LayoutError(ValueError):
    """A layout that cannot work: the message names each factor and what to change."""


@dataclass(frozen=True)
class ParallelLayout:
    """tp * pp * dp == world_size, validated once. Pure arithmetic: no process groups here."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    world_size: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "world_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise LayoutError(f"{name} must be a positive integer, got {value!r}")
        problems = check_layout(self.tp, self.pp, self.dp, self.world_size)
        if problems:
            raise LayoutError("; ".join(problems) + ": change parallel.tp/pp/dp or the number of processes")

    @classmethod
    def from_config(cls, cfg, world_size: int | None = None) -> ParallelLayout:
        """The layout of a RunConfig; `world_size` defaults to tp*pp*dp of the config."""
        tp, pp, dp = cfg.parallel.tp, cfg.parallel.pp, cfg.dp
        return cls(tp=tp, pp=pp, dp=dp, world_size=world_size if world_size is not None else tp * pp * dp)

    def check_model(self, num_attention_heads: int, ffn_size: int, padded_vocab_size: int) -> None:
        """The divisibility rules tensor parallelism needs, with a message naming each factor."""
        problems = []
        if num_attention_heads % self.tp:
            problems.append(f"num_attention_heads = {num_attention_heads} is not divisible by tp = {self.tp}")
        if ffn_size % self.tp:
            problems.append(f"ffn size = {ffn_size} is not divisible by tp = {self.tp}")
        if padded_vocab_size % self.tp:
            problems.append(f"padded vocab size = {padded_vocab_size} is not divisible by tp = {self.tp}")
        if problems:
            raise LayoutError("; ".join(problems) + ": each tensor-parallel rank must hold an equal slice")

    # --- rank arithmetic (Megatron order) -------------------------------------------------------
    def rank_of(self, tp_rank: int, dp_rank: int, pp_rank: int) -> int:
        return pp_rank * self.dp * self.tp + dp_rank * self.tp + tp_rank

    def coords_of(self, rank: int) -> tuple[int, int, int]:
        """rank -> (tp_rank, dp_rank, pp_rank)."""
        return rank % self.tp, (rank // self.tp) % self.dp, rank // (self.tp * self.dp)

    def tp_groups(self) -> list[list[int]]:
        return [[self.rank_of(t, d, p) for t in range(self.tp)] for p in range(self.pp) for d in range(self.dp)]

    def dp_groups(self) -> list[list[int]]:
        return [[self.rank_of(t, d, p) for d in range(self.dp)] for p in range(self.pp) for t in range(self.tp)]

    def pp_groups(self) -> list[list[int]]:
        return [[self.rank_of(t, d, p) for p in range(self.pp)] for d in range(self.dp) for t in range(self.tp)]

    def embedding_groups(self) -> list[list[int]]:
        """First and last stage of each pipeline (they hold the tied embedding); one rank if pp == 1."""
        return [sorted({g[0], g[-1]}) for g in self.pp_groups()]

    def deepspeed_topology(self):
        """DeepSpeed's topology object for this layout (imports deepspeed, so only in trainer code)."""
        from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

        return PipeModelDataParallelTopology(num_pp=self.pp, num_mp=self.tp, num_dp=self.dp)

    def replace(self, **changes) -> ParallelLayout:
        return dataclasses.replace(self, **changes)


def groups_from_topology(topology) -> dict[str, list[list[int]]]:
    """Rank lists per axis of a DeepSpeed topology: {'tp': ..., 'dp': ..., 'pp': ...}."""
    return {
        "tp": [sorted(g) for g in topology.get_axis_comm_lists("model")],
        "dp": [sorted(g) for g in topology.get_axis_comm_lists("data")],
        "pp": [sorted(g) for g in topology.get_axis_comm_lists("pipe")],
    }


@dataclass
class _State:
    layout: ParallelLayout
    rank: int
    tp_group: object = None
    dp_group: object = None
    pp_group: object = None
    embedding_group: object = None
    tp_ranks: tuple[int, ...] = (0,)
    dp_ranks: tuple[int, ...] = (0,)
    pp_ranks: tuple[int, ...] = (0,)
    embedding_ranks: tuple[int, ...] = (0,)


_state: _State | None = None


def initialize_model_parallel(layout: ParallelLayout) -> None:
    """Create the TP, DP, PP and embedding groups (collective: every rank calls it, same layout).

    Every rank creates every group in the same order (torch.distributed requires it), keeps the
    ones it belongs to. The rank lists come from DeepSpeed's topology, so they are DeepSpeed's.
    """
    global _state
    if not dist.is_initialized():
        if layout.world_size == 1:
            _state = _State(layout=layout, rank=0)
            return
        raise RuntimeError(
            f"initialize_model_parallel({layout}) needs torch.distributed: call "
            "torch.distributed.init_process_group first"
        )
    if dist.get_world_size() != layout.world_size:
        raise LayoutError(
            f"the layout says world_size = {layout.world_size} (tp*pp*dp = {layout.tp}*{layout.pp}*{layout.dp}) "
            f"but torch.distributed has {dist.get_world_size()} processes"
        )
    rank = dist.get_rank()
    by_axis = groups_from_topology(layout.deepspeed_topology())
    ours = {"tp": layout.tp_groups(), "dp": layout.dp_groups(), "pp": layout.pp_groups()}
    for axis in ("tp", "dp", "pp"):
        if sorted(by_axis[axis]) != sorted(ours[axis]):  # would mean DeepSpeed changed its axis order
            raise RuntimeError(f"{axis} groups of DeepSpeed's topology {by_axis[axis]} != Megatron order {ours[axis]}")
    state = _State(layout=layout, rank=rank)
    for axis in ("tp", "dp", "pp"):
        for ranks in sorted(by_axis[axis]):
            group = dist.new_group(ranks=ranks)
            if rank in ranks:
                setattr(state, f"{axis}_group", group)
                setattr(state, f"{axis}_ranks", tuple(ranks))
    for ranks in layout.embedding_groups():
        group = dist.new_group(ranks=ranks)
        if rank in ranks:
            state.embedding_group, state.embedding_ranks = group, tuple(ranks)
    _state = state


def destroy_model_parallel() -> None:
    global _state
    _state = None


@contextlib.contextmanager
def building_as(layout: ParallelLayout, rank: int):
    """Build layers as `rank` of `layout` before any process group exists (the warm standby,
    trainer/prepared_start.py): a layer reads only its TP rank and size when built; its collectives
    look their groups up when they run, after initialize_model_parallel."""
    global _state
    if _state is not None:
        raise RuntimeError("building_as: the model-parallel groups exist already; build the layers with them")
    _state = _State(layout=layout, rank=rank)
    try:
        yield
    finally:
        _state = None


def model_parallel_is_initialized() -> bool:
    return _state is not None


def get_layout() -> ParallelLayout:
    return _state.layout if _state is not None else ParallelLayout()


def get_tp_group():
    return _state.tp_group if _state is not None else None


def get_tp_world_size() -> int:
    return _state.layout.tp if _state is not None else 1


def get_tp_rank() -> int:
    if _state is None:
        return 0
    return _state.layout.coords_of(_state.rank)[0]


def get_tp_src_rank() -> int:
    """Global rank of tp rank 0 of this rank's TP group (the source of broadcasts)."""
    return _state.tp_ranks[0] if _state is not None else 0


def get_dp_group():
    return _state.dp_group if _state is not None else None


def get_dp_rank() -> int:
    return _state.layout.coords_of(_state.rank)[1] if _state is not None else 0


def get_dp_world_size() -> int:
    return _state.layout.dp if _state is not None else 1


def get_pp_group():
    return _state.pp_group if _state is not None else None


def get_pp_rank() -> int:
    return _state.layout.coords_of(_state.rank)[2] if _state is not None else 0


def get_pp_world_size() -> int:
    return _state.layout.pp if _state is not None else 1


def get_embedding_group():
    """First + last pipeline stage of this rank's pipeline (None if this rank is in neither)."""
    if _state is None or _state.rank not in _state.embedding_ranks:
        return None
    return _state.embedding_group


def require_tp_group(tp_size: int) -> None:
    """Layers call this when built: tp > 1 needs initialize_model_parallel first."""
    if tp_size > 1 and (_state is None or _state.layout.tp != tp_size):
        have = "no groups" if _state is None else f"groups for tp = {_state.layout.tp}"
        raise RuntimeError(
            f"a tensor-parallel layer for tp = {tp_size} was built with {have}: call "
            "trainer.parallel.initialize_model_parallel(layout) after torch.distributed.init_process_group"
        )
