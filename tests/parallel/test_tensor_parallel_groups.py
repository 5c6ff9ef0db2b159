"""Rank order and layout validation (no processes needed: the groups are rank lists)."""

from __future__ import annotations

import pytest

from trainer.parallel import LayoutError, ParallelLayout, groups_from_topology
from trainer.parallel.groups import destroy_model_parallel, get_tp_world_size, initialize_model_parallel


def test_megatron_rank_order_for_dp2_tp2_pp2():
    layout = ParallelLayout(tp=2, pp=2, dp=2, world_size=8)
    assert layout.tp_groups() == [[0, 1], [2, 3], [4, 5], [6, 7]]  # TP fastest: neighbours, one node
    assert layout.dp_groups() == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert layout.pp_groups() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert layout.embedding_groups() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    for rank in range(8):
        tp_rank, dp_rank, pp_rank = layout.coords_of(rank)
        assert rank == pp_rank * 4 + dp_rank * 2 + tp_rank == layout.rank_of(tp_rank, dp_rank, pp_rank)


@pytest.mark.parametrize("tp, pp, dp", [(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2), (2, 2, 1), (1, 2, 2),
                                        (2, 2, 2), (4, 12, 8)])
def test_groups_equal_deepspeed_topology(tp, pp, dp):
    pytest.importorskip("deepspeed")
    layout = ParallelLayout(tp=tp, pp=pp, dp=dp, world_size=tp * pp * dp)
    topo = layout.deepspeed_topology()
    ds = groups_from_topology(topo)
    assert sorted(ds["tp"]) == sorted(layout.tp_groups())
    assert sorted(ds["dp"]) == sorted(layout.dp_groups())
    assert sorted(ds["pp"]) == sorted(layout.pp_groups())
    for rank in range(layout.world_size):
        coord = topo.get_coord(rank)
        assert layout.coords_of(rank) == (coord.model, coord.data, coord.pipe)


def test_layout_errors_name_each_factor():
    with pytest.raises(LayoutError, match=r"tp\*pp\*dp = 4\*12\*8 = 384, but the world size is 192"):
        ParallelLayout(tp=4, pp=12, dp=8, world_size=192)
    with pytest.raises(LayoutError, match="num_attention_heads = 6 is not divisible by tp = 4"):
        ParallelLayout(tp=4, world_size=4).check_model(6, 64, 256)
    with pytest.raises(LayoutError, match="tp must be a positive integer"):
        ParallelLayout(tp=0)


def test_single_process_needs_no_distributed():
    from trainer.parallel import ColumnParallelLinear

    initialize_model_parallel(ParallelLayout())  # world 1 without torch.distributed: allowed
    assert get_tp_world_size() == 1
    destroy_model_parallel()
    ColumnParallelLinear(4, 4)  # tp = 1 layers work with no groups at all
    with pytest.raises(RuntimeError, match="initialize_model_parallel"):
        initialize_model_parallel(ParallelLayout(tp=2, world_size=2))
