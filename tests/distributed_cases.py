"""Cases that run on every rank of a spawned group (tests/distributed_harness.py). Each takes
(rank, world_size), raises on failure and may return a note (errors measured, on rank 0).

Every rank builds the same full tensors from one seed, works on its shard, and rank 0 compares
the gathered result with single-process tileattn.attention() and the fp64 reference.
"""

from __future__ import annotations

import torch

import tileattn
import tileattn.distributed as td
from tileattn.arch import FP8_DTYPES
from tileattn.distributed.layout import chunks_per_rank
from tileattn.reference import attention_reference

from .conftest import LSE_TOLERANCES, TOLERANCES

# The distributed result may be this much further from fp64 than single-process attention():
# partial outputs stay fp32 and the merge is fp32, so 16-bit results are no worse; FP8 rounds P
# to e4m3 against each block's running row max instead of the whole row's, which moves the
# error either way by a few percent.
MERGE_SLACK = {torch.float16: 1.05, torch.bfloat16: 1.05, torch.float8_e4m3fn: 1.25,
               torch.float8_e5m2: 1.25}


def relative_error(out, ref) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def full_inputs(seed, seqlen, *, batch=1, num_q_heads=2, num_kv_heads=2, head_dim=64,
                head_dim_v=64, dtype=torch.float16, per="tensor", device="cpu"):
    """(q, k, v, descales): the same random full tensors on every rank."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seqlen, num_q_heads, head_dim, generator=generator)
    k = torch.randn(batch, seqlen, num_kv_heads, head_dim, generator=generator)
    v = torch.randn(batch, seqlen, num_kv_heads, head_dim_v, generator=generator)
    q, k, v = (x.to(device) for x in (q, k, v))
    if dtype in FP8_DTYPES:
        (q, qd), (k, kd), (v, vd) = (tileattn.quantize_fp8(x, dtype, per=per) for x in (q, k, v))
        return q, k, v, dict(q_descale=qd, k_descale=kd, v_descale=vd)
    return q.to(dtype), k.to(dtype), v.to(dtype), {}


def check_forward(rank, world_size, *, layout, causal, dtype, chunk=13, softmax_scale=None,
                  seed=0, prepared_v=False, **shape):
    """prepared_v: pass V K-major (tileattn.prepare_v), so that it travels in that layout."""
    seqlen = chunk * world_size * chunks_per_rank(layout)
    q, k, v, descales = full_inputs(seed, seqlen, dtype=dtype, **shape)
    local_len = seqlen // world_size
    q_local, k_local, v_local = (td.shard(x, layout=layout) for x in (q, k, v))
    if prepared_v:
        v_local = tileattn.prepare_v(v_local)
    out, lse = td.attention(q_local, k_local, v_local, layout=layout, causal=causal,
                            softmax_scale=softmax_scale, return_lse=True, **descales)
    out_dtype = torch.bfloat16 if dtype in FP8_DTYPES else dtype
    assert out.dtype == out_dtype and out.shape == (q.shape[0], local_len, q.shape[2], v.shape[3])
    assert lse.dtype == torch.float32 and lse.shape == (q.shape[0], q.shape[2], local_len)
    full_out = td.unshard(out, layout=layout)
    full_lse = td.unshard(lse, layout=layout, seq_dim=2)
    if rank != 0:
        return None
    single = tileattn.attention(q, k, v, causal=causal, softmax_scale=softmax_scale, **descales)
    ref_out, ref_lse = attention_reference(q, k, v, causal=causal, softmax_scale=softmax_scale,
                                           **descales)
    assert torch.isfinite(full_out).all() and torch.isfinite(full_lse).all()
    error, single_error = relative_error(full_out, ref_out), relative_error(single, ref_out)
    assert error < TOLERANCES[dtype], (error, single_error)
    assert error <= MERGE_SLACK[dtype] * single_error, (error, single_error)
    lse_error = float(((full_lse.double() - ref_lse).abs() / ref_lse.abs().clamp(min=1)).max())
    assert lse_error < LSE_TOLERANCES[dtype], lse_error
    return f"error {error:.2e} (single-process {single_error:.2e}), lse {lse_error:.1e}"


def check_backward(rank, world_size, *, layout, causal, dtype, chunk=13, seed=1, **shape):
    """Gradients through the ring (block backward: the fp64 stand-in) against fp64 autograd of
    the reference on the full tensors."""
    seqlen = chunk * world_size * chunks_per_rank(layout)
    q, k, v, _ = full_inputs(seed, seqlen, dtype=dtype, **shape)
    dout = torch.randn(q.shape[:3] + v.shape[3:], generator=torch.Generator().manual_seed(seed + 7))
    dout = dout.to(q.device)
    leaves = [td.shard(x, layout=layout).requires_grad_() for x in (q, k, v)]
    out = td.attention(*leaves, layout=layout, causal=causal)
    (out.float() * td.shard(dout, layout=layout)).sum().backward()
    grads = [td.unshard(x.grad, layout=layout) for x in leaves]
    if rank != 0:
        return None
    full = [x.double().requires_grad_() for x in (q, k, v)]
    ref_out, _ = attention_reference(*full, causal=causal)
    (ref_out * dout.double()).sum().backward()
    errors = []
    for name, got, leaf in zip("qkv", grads, full):
        assert got.dtype == dtype and torch.isfinite(got).all(), name
        errors.append(relative_error(got, leaf.grad))
        assert errors[-1] < TOLERANCES[dtype], (name, errors)
    return "d{q,k,v} errors " + ", ".join(f"{e:.2e}" for e in errors)


def check_shard_round_trip(rank, world_size, device="cpu"):
    """Shards hold the positions the layouts define (written out here independently of
    tileattn.distributed.layout), and unshard inverts shard, for FP8 and bf16, any seq_dim."""
    for layout in ("zigzag", "contiguous"):
        chunk = 3
        seqlen = chunk * world_size * chunks_per_rank(layout)
        positions = torch.arange(seqlen)
        if layout == "zigzag":
            mine = torch.cat([positions[rank * chunk:(rank + 1) * chunk],
                              positions[(2 * world_size - 1 - rank) * chunk:][:chunk]])
        else:
            mine = positions[rank * chunk:(rank + 1) * chunk]
        numbered = positions.float()[None, :, None, None].expand(2, seqlen, 3, 4).to(device)
        assert torch.equal(td.shard(numbered, layout=layout)[0, :, 0, 0].cpu(), mine.float())
        generator = torch.Generator().manual_seed(5)
        for dtype, seq_dim in ((torch.float8_e4m3fn, 1), (torch.bfloat16, 2), (torch.float32, -1)):
            shape = [2, 3, 4]
            shape.insert(seq_dim % 4, seqlen)
            full = torch.randn(shape, generator=generator).to(device=device, dtype=dtype)
            part = td.shard(full, layout=layout, seq_dim=seq_dim)
            assert part.shape[seq_dim] == seqlen // world_size and part.is_contiguous()
            back = td.unshard(part, layout=layout, seq_dim=seq_dim)
            assert back.dtype == dtype and torch.equal(back.view(torch.uint8), full.view(torch.uint8))


def check_per_rank_descales(rank, world_size, chunk=13, device="cpu"):
    """FP8 shards quantized on each rank with their own per-head descales: each K/V block
    travels with its descales, so the result is attention over the dequantized sequence."""
    seqlen = chunk * 2 * world_size
    full = full_inputs(4, seqlen, batch=2, num_q_heads=4, num_kv_heads=2, dtype=torch.float32,
                       device=device)[:3]
    quantized = [tileattn.quantize_fp8(td.shard(x), per="head") for x in full]
    (q, q_descale), (k, k_descale), (v, v_descale) = quantized
    out, lse = td.attention(q, k, v, causal=True, q_descale=q_descale, k_descale=k_descale,
                            v_descale=v_descale, return_lse=True)
    dequantized = [td.unshard(x.float() * descale[:, None, :, None]) for x, descale in quantized]
    full_out, full_lse = td.unshard(out), td.unshard(lse, seq_dim=2)
    if rank != 0:
        return None
    ref_out, ref_lse = attention_reference(*dequantized, causal=True)
    error = relative_error(full_out, ref_out)
    assert error < TOLERANCES[torch.float8_e4m3fn], error
    lse_error = float(((full_lse.double() - ref_lse).abs() / ref_lse.abs().clamp(min=1)).max())
    assert lse_error < LSE_TOLERANCES[torch.float8_e4m3fn], lse_error
    return f"error {error:.2e}, lse {lse_error:.1e}"


def expect_error(call, error_type, *phrases) -> None:
    try:
        call()
    except error_type as raised:
        message = str(raised)
        missing = [p for p in phrases if p not in message]
        assert not missing, f"{missing} not in {message!r}"
        return
    raise AssertionError(f"no {error_type.__name__} raised")


def check_rejections(rank, world_size):
    """Bad input raises on every rank (never a hang), and the group still works afterwards."""
    last = world_size - 1
    q, k, v, _ = full_inputs(3, 13 * 2 * world_size)
    shards = [td.shard(x) for x in (q, k, v)]
    # Shard lengths that differ across ranks: the last rank holds two extra positions.
    uneven = [torch.cat([x, x[:, :2]], dim=1) if rank == last else x for x in shards]
    expect_error(lambda: td.attention(*uneven), ValueError,
                 "q's shape must be the same on every rank", f"rank {last} has (1, 28, 2, 64)")
    # dtypes that differ across ranks.
    mixed = [x.to(torch.bfloat16) if rank == last else x for x in shards]
    expect_error(lambda: td.attention(*mixed, causal=True), ValueError, "q's dtype", "bfloat16")
    # Sequences that do not split into the layout's chunks.
    expect_error(lambda: td.shard(q[:, :-1]), ValueError,
                 f"multiple of {2 * world_size}", f"got {13 * 2 * world_size - 1}")
    expect_error(lambda: td.shard(q[:, :13 * world_size + 1], layout="contiguous"), ValueError,
                 f"multiple of {world_size}")
    odd = [td.shard(x, layout="contiguous") for x in (q[:, :13 * world_size],) * 3]
    expect_error(lambda: td.attention(*odd, causal=True), ValueError, "zigzag shard holds 2",
                 "got 13")
    # q and k/v local lengths that differ on every rank.
    expect_error(lambda: td.attention(shards[0], shards[1][:, :24], shards[2][:, :24]), ValueError,
                 "same number of local positions")
    # An error on one rank only (a head dim tileattn.attention refuses) reaches every rank.
    bad_q = shards[0][..., :48] if rank == last else shards[0]
    phrases = ["k must have q's head_dim"] + ([f"raised on rank {last}"] if rank != last else [])
    expect_error(lambda: td.attention(bad_q, *shards[1:]), ValueError, *phrases)
    # A device the group's backend cannot send (gloo: host memory) on one rank.
    on_meta = [x.to("meta") if rank == last else x for x in shards]
    expect_error(lambda: td.attention(*on_meta), ValueError, "(gloo) cannot send meta tensors")
    expect_error(lambda: td.attention(*shards, layout="striped"), ValueError, "layout must be one of")
    grad_out = shards[0].float().requires_grad_()
    expect_error(lambda: td.unshard(grad_out), ValueError, "x_local requires grad")
    fp8 = [x.to(torch.float8_e4m3fn) for x in shards]
    expect_error(lambda: td.attention(*fp8, q_descale=torch.ones(3)), ValueError,
                 "q_descale must have shape")
    expect_error(lambda: td.attention(*fp8, q_descale=torch.ones((), requires_grad=True)),
                 ValueError, "q_descale requires grad")
    expect_error(lambda: td.attention(*(x.float().requires_grad_() for x in fp8)), TypeError,
                 "must be float16, bfloat16")
    expect_error(lambda: td.attention(*(x.clone().requires_grad_() for x in fp8)), ValueError,
                 "no backward pass for torch.float8_e4m3fn")
    # The group is still in step: a valid call after all of that gives the right answer.
    return check_forward(rank, world_size, layout="zigzag", causal=True, dtype=torch.float16)


F16, BF16, E4M3 = torch.float16, torch.bfloat16, torch.float8_e4m3fn
GQA = dict(num_q_heads=4, num_kv_heads=2)
FORWARD = {
    "fwd-f16-zigzag": dict(layout="zigzag", causal=False, dtype=F16),
    "fwd-f16-zigzag-causal-gqa-b2": dict(layout="zigzag", causal=True, dtype=F16, batch=2, **GQA),
    "fwd-bf16-contiguous-causal-mqa": dict(layout="contiguous", causal=True, dtype=BF16,
                                           num_q_heads=4, num_kv_heads=1),
    "fwd-bf16-contiguous-d192-dv128-scale": dict(layout="contiguous", causal=False, dtype=BF16,
                                                 head_dim=192, head_dim_v=128, softmax_scale=0.3,
                                                 chunk=9),
    "fwd-e4m3-zigzag-causal": dict(layout="zigzag", causal=True, dtype=E4M3),
    "fwd-e4m3-contiguous-causal-per-head-gqa": dict(layout="contiguous", causal=True, dtype=E4M3,
                                                    per="head", batch=2, **GQA),
    # V passed K-major (tileattn.prepare_v) travels in that layout.
    "fwd-e4m3-zigzag-causal-prepared-v": dict(layout="zigzag", causal=True, dtype=E4M3, chunk=5,
                                              prepared_v=True),
}
BACKWARD = {
    "bwd-f16-zigzag-causal-gqa": dict(layout="zigzag", causal=True, dtype=F16, **GQA),
    "bwd-bf16-contiguous-causal": dict(layout="contiguous", causal=True, dtype=BF16),
    "bwd-f16-zigzag": dict(layout="zigzag", causal=False, dtype=F16, chunk=7),
}
OTHERS = {
    "fwd-e4m3-per-rank-descales": check_per_rank_descales,
    "shard-round-trip": check_shard_round_trip,
    "rejections": check_rejections,
}
TWO_RANKS = [*FORWARD, *BACKWARD, *OTHERS]
# Four ranks share two cores: fewer cases, with a shorter odd chunk (5).
for name in ("fwd-f16-zigzag-causal-gqa-b2", "fwd-bf16-contiguous-causal-mqa",
             "fwd-e4m3-zigzag-causal"):
    FORWARD[f"{name.removesuffix('-b2')}-chunk5"] = dict(FORWARD[name], chunk=5, batch=1)
for name in ("bwd-f16-zigzag-causal-gqa", "bwd-bf16-contiguous-causal"):
    BACKWARD[f"{name}-chunk5"] = dict(BACKWARD[name], chunk=5)
FOUR_RANKS = [name for name in (*FORWARD, *BACKWARD) if name.endswith("-chunk5")]
FOUR_RANKS += ["shard-round-trip", "rejections"]


def _run(check, settings):
    return lambda rank, world_size: check(rank, world_size, **settings)


CASES = {**{name: _run(check_forward, settings) for name, settings in FORWARD.items()},
         **{name: _run(check_backward, settings) for name, settings in BACKWARD.items()},
         **OTHERS}
