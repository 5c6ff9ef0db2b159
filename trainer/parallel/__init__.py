"""Process groups (`groups`) and Megatron tensor parallelism (`mappings`, `tensor_parallel`,
`cross_entropy`). Pipeline and data parallelism are DeepSpeed's; they get the same topology.

Typical multi-rank setup:

    torch.distributed.init_process_group(...)
    layout = ParallelLayout.from_config(cfg, world_size=dist.get_world_size())
    initialize_model_parallel(layout)          # TP/DP/PP/embedding groups, Megatron rank order
    module = trainer.model.build_pipeline_module(cfg, layout)

Single process (tp = pp = dp = 1) needs none of this: the layers work without torch.distributed.
"""

from trainer.parallel.cross_entropy import vocab_parallel_cross_entropy
from trainer.parallel.groups import (
    LayoutError,
    ParallelLayout,
    destroy_model_parallel,
    get_dp_group,
    get_dp_rank,
    get_dp_world_size,
    get_embedding_group,
    get_layout,
    get_pp_group,
    get_pp_rank,
    get_pp_world_size,
    get_tp_group,
    get_tp_rank,
    get_tp_src_rank,
    get_tp_world_size,
    groups_from_topology,
    initialize_model_parallel,
    model_parallel_is_initialized,
)
from trainer.parallel.mappings import (
    copy_to_tp_region,
    gather_from_tp_region,
    reduce_from_tp_region,
    scatter_to_tp_region,
)
from trainer.parallel.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    broadcast_replicated_params,
    parallel_lm_logits,
    replicated_params_max_diff,
    sync_replicated_params_grads,
    tp_replicated_parameters,
)

__all__ = [
    "ColumnParallelLinear", "LayoutError", "ParallelLayout", "RowParallelLinear", "VocabParallelEmbedding",
    "broadcast_replicated_params", "copy_to_tp_region", "destroy_model_parallel", "gather_from_tp_region",
    "get_dp_group", "get_dp_rank", "get_dp_world_size", "get_embedding_group", "get_layout", "get_pp_group",
    "get_pp_rank", "get_pp_world_size", "get_tp_group", "get_tp_rank", "get_tp_src_rank", "get_tp_world_size",
    "groups_from_topology", "initialize_model_parallel", "model_parallel_is_initialized", "parallel_lm_logits",
    "reduce_from_tp_region", "replicated_params_max_diff", "scatter_to_tp_region", "sync_replicated_params_grads",
    "tp_replicated_parameters", "vocab_parallel_cross_entropy",
]
