"""Cases for tests/gpu/test_distributed_gpu.py: rank r on GPU r, NCCL, real sizes. The checks
are tests/distributed_cases.py's, run with CUDA tensors."""

from __future__ import annotations

import torch
import torch.distributed as dist

import tileattn.distributed as td

from ..distributed_cases import (check_backward, check_forward, check_per_rank_descales,
                                 check_shard_round_trip, expect_error, full_inputs,
                                 relative_error)

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


def check_torch_context_parallel(rank, world_size, *, chunk=300, heads=4, head_dim=128):
    """torch's own context_parallel (its ring over SDPA, head-tail shards = tileattn's zigzag)
    with tileattn in SDPA's flash slot: every block's forward and backward runs tileattn, and
    this rank's rows of out, dq, dk, dv are as close to fp64 as with torch's flash kernel in
    the slot (the SDPA tests' yardstick)."""
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import tileattn
    from tileattn.integrations import sdpa
    from tileattn.ops import backward as backward_ops

    from ..integration_helpers import ROUNDING_UNIT, counting

    seqlen = chunk * 2 * world_size
    generator = torch.Generator(device="cuda").manual_seed(11)
    full = [torch.randn(1, heads, seqlen, head_dim, device="cuda", generator=generator,
                        dtype=BF16) for _ in range(4)]  # q, k, v, grad of out: [B, H, S, D]
    leaves = [x.double().requires_grad_() for x in full[:3]]
    reference = F.scaled_dot_product_attention(*leaves, is_causal=True)
    reference.backward(full[3].double())
    expected = [td.shard(x, seq_dim=2) for x in (reference.detach(), *(x.grad for x in leaves))]
    mesh = init_device_mesh("cuda", (world_size,))

    def ring_over_sdpa():
        buffers = [x.clone() for x in full]
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]), context_parallel(
                mesh, buffers=buffers, buffer_seq_dims=[2] * 4):
            q, k, v = (x.detach().requires_grad_() for x in buffers[:3])
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            out.backward(buffers[3])
            return [x.detach().clone() for x in (out, q.grad, k.grad, v.grad)]

    torchs = ring_over_sdpa()
    forward, backward = tileattn.attention, backward_ops.attention_backward
    tileattn.attention = counting(forward)
    backward_ops.attention_backward = counting(backward)
    sdpa.activate()
    try:
        ours = ring_over_sdpa()
        calls = (len(tileattn.attention.calls), len(backward_ops.attention_backward.calls))
    finally:
        sdpa.restore()
        tileattn.attention, backward_ops.attention_backward = forward, backward
    # Causal zigzag: W blocks a rank, the diagonal one causal, each run forward and backward.
    assert calls[0] >= world_size and calls[1] >= world_size, f"tileattn calls {calls}"
    errors = []
    for name, got, theirs, ref in zip(("out", "dq", "dk", "dv"), ours, torchs, expected):
        assert got.shape == ref.shape and torch.isfinite(got).all(), name
        errors.append((relative_error(got, ref), relative_error(theirs, ref)))
        assert errors[-1][0] <= 2 * errors[-1][1] + ROUNDING_UNIT[BF16], (name, errors)
    return (f"tileattn calls fwd {calls[0]} bwd {calls[1]}; errors (tileattn, torch's flash) "
            + ", ".join(f"{n} {a:.2e}/{b:.2e}" for n, (a, b) in zip(("out", "dq", "dk", "dv"),
                                                                 errors)))


def _run(check, settings):
    return lambda rank, world_size: check(rank, world_size, **settings)


CASES = {**{name: _run(check_forward, settings) for name, settings in FORWARD.items()},
         **{name: _run(check_backward, settings) for name, settings in BACKWARD.items()},
         "fwd-e4m3-per-rank-descales": _run(check_per_rank_descales,
                                             dict(chunk=513, device="cuda")),
         "shard-round-trip": _run(check_shard_round_trip, dict(device="cuda")),
         "rejections": check_rejections,
         "torch-context-parallel-over-tileattn": check_torch_context_parallel}
