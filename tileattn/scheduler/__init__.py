"""Work plans: which program does which tile or key chunk, decided on the host in plain
Python/torch so that they are unit-tested on the CPU."""

from .mla import MLAPlan, make_mla_plan, mla_chunk_size, split_mla_work
from .prefill import (heads_per_group, prefill_tile_order_list, prefill_work_lists,
                      prefill_work_lists_python, varlen_work_lists,
                      weighted_work_lists_python)

__all__ = ["MLAPlan", "make_mla_plan", "mla_chunk_size", "split_mla_work", "heads_per_group",
           "prefill_tile_order_list", "prefill_work_lists", "prefill_work_lists_python",
           "varlen_work_lists", "weighted_work_lists_python"]
