"""Cases for tests/gpu/test_distributed_gpu.py: rank r on GPU r, NCCL, real sizes. The checks
are tests/distributed_cases.py's, run with CUDA tensors."""

from __future__ import annotations

import torch
import torch.distributed as dist

import tileattn.distributed as td

from ..distributed_cases import (check_backward, check_forward, check_per_rank_descales,
                                 check_shard_round_trip, expect_error, full_inputs)

BF16, F16 = torch.bfloat16, torch.float16
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
# An odd chunk (777 positions) so that no block is a whole number of tiles; GQA 8:2, B=2.
SHAPE = dict(chunk=777, batch=2, num_q_heads=8, num_kv_heads=2, head_dim=128, head_dim_v=128,
             device="cuda")

FORWARD = {}
for dtype in (BF16, F16, E4M3, E5M2):
    for layout in ("zigzag", "contiguous"):
        for causal in (False, True):
            name = f"fwd-{str(dtype)[6:]}-{layout}{'-causal' if causal else ''}"
            FORWARD[name] = dict(SHAPE, layout=layout, causal=causal, dtype=dtype)
for head_dim, head_dim_v in ((64, 64), (256, 256), (192, 128)):
    FORWARD[f"fwd-bfloat16-zigzag-causal-d{head_dim}-dv{head_dim_v}"] = dict(
        SHAPE, layout="zigzag", causal=True, dtype=BF16, head_dim=head_dim, head_dim_v=head_dim_v)
FORWARD["fwd-e4m3-zigzag-causal-per-head"] = dict(SHAPE, layout="zigzag", causal=True,
                                                  dtype=E4M3, per="head")
# V already K-major (tileattn.prepare_v): it travels in that layout.
FORWARD["fwd-e4m3-zigzag-causal-prepared-v"] = dict(SHAPE, layout="zigzag", causal=True,
                                                    dtype=E4M3, prepared_v=True)
# 8k positions per rank.
FORWARD["fwd-bfloat16-zigzag-causal-8k-per-rank"] = dict(
    chunk=4096, batch=1, num_q_heads=8, num_kv_heads=8, head_dim=128, head_dim_v=128,
    device="cuda", layout="zigzag", causal=True, dtype=BF16)

BACKWARD = {
    "bwd-bfloat16-zigzag-causal-gqa": dict(layout="zigzag", causal=True, dtype=BF16, chunk=257,
                                           num_q_heads=8, num_kv_heads=2, head_dim=128,
                                           head_dim_v=128, device="cuda"),
    "bwd-float16-contiguous": dict(layout="contiguous", causal=False, dtype=F16, chunk=300,
                                   num_q_heads=4, num_kv_heads=4, device="cuda"),
    "bwd-float16-contiguous-causal": dict(layout="contiguous", causal=True, dtype=F16, chunk=300,
                                          num_q_heads=4, num_kv_heads=4, device="cuda"),
}


def check_rejections(rank, world_size):
    """Bad input on GPUs raises on every rank, and the group still works afterwards."""
    q, k, v, _ = full_inputs(3, 2 * 64 * world_size, device="cuda")
    shards = [td.shard(x) for x in (q, k, v)]
    on_host = [x.cpu() for x in shards]
    expect_error(lambda: td.attention(*on_host), ValueError, "(nccl) cannot send cpu tensors")
    expect_error(lambda: td.unshard(on_host[0]), ValueError, "no collectives for cpu tensors")
    last = world_size - 1
    mixed = [x.cpu() if rank == last else x for x in shards]
    expect_error(lambda: td.attention(*mixed), ValueError, "cannot send cpu tensors")
    gloo = dist.new_group(backend="gloo")
    expect_error(lambda: td.attention(*shards, group=gloo), ValueError, "host memory only")
    uneven = [torch.cat([x, x[:, :2]], dim=1) if rank == last else x for x in shards]
    expect_error(lambda: td.attention(*uneven), ValueError, "q's shape must be the same")
    return check_forward(rank, world_size, **dict(SHAPE, layout="zigzag", causal=True, dtype=BF16))


def _run(check, settings):
    return lambda rank, world_size: check(rank, world_size, **settings)


CASES = {**{name: _run(check_forward, settings) for name, settings in FORWARD.items()},
         **{name: _run(check_backward, settings) for name, settings in BACKWARD.items()},
         "fwd-e4m3-per-rank-descales": _run(check_per_rank_descales,
                                             dict(chunk=513, device="cuda")),
         "shard-round-trip": _run(check_shard_round_trip, dict(device="cuda")),
         "rejections": check_rejections}
