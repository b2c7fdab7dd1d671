"""attention() on a real GPU at real sizes: every dtype (bf16 included), every head dim, long
contexts. Skipped on machines without CUDA; run through the device tool.

Tiers (tests/conftest.py): the default run is the fast tier, which covers every dtype, every
head-dim pair, every shape and both mask settings at least once each (FAST_CASES, each dtype
with a padded and an unpadded head dim, causal and not) plus each feature test once;
`pytest --full` adds the rest of the dtype x head dims x shape x causal grid and the second
dtype of the feature tests (marked `full`).
"""

import pytest
import torch

import tileattn
from tileattn.arch import FP8_DTYPES
from tileattn.kernels import runtime
from tileattn.ops import attention as attention_op, backward_cache
from tileattn.reference import attention_reference

from ..conftest import LSE_TOLERANCES, TOLERANCES

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
full = pytest.mark.full

DTYPES = [torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2]
HEAD_DIMS = [(64, 64), (96, 96), (128, 128), (192, 128), (256, 256)]
# (batch, seqlen_q, seqlen_k, num_q_heads, num_kv_heads): GQA 4:1 and 8:1, one query over 4097
# keys, few queries over many keys and many over few (causal: most rows see no key).
SHAPES = [(2, 1000, 1000, 8, 2), (1, 4097, 4097, 4, 4), (3, 1, 4097, 8, 1), (1, 17, 3000, 4, 2),
          (1, 3000, 17, 4, 2)]
# The fast tier of test_real_sizes: (dtype, head dims, shape index, causal). Each dtype, head
# dim pair and shape appears with causal on and off.
FAST_CASES = [
    (torch.bfloat16, (64, 64), 4, False), (torch.bfloat16, (192, 128), 4, True),
    (torch.float16, (96, 96), 1, True), (torch.float16, (256, 256), 1, False),
    (torch.float16, (128, 128), 0, True), (torch.float8_e4m3fn, (128, 128), 3, False),
    (torch.float8_e4m3fn, (192, 128), 2, False), (torch.float8_e4m3fn, (64, 64), 2, True),
    (torch.float8_e5m2, (256, 256), 3, True), (torch.float8_e5m2, (96, 96), 0, False),
]


def _real_size_cases():
    fast = {(dtype, dims, SHAPES[shape], causal) for dtype, dims, shape, causal in FAST_CASES}
    for dtype in DTYPES:
        for dims in HEAD_DIMS:
            for shape in SHAPES:
                for causal in (False, True):
                    marks = () if (dtype, dims, shape, causal) in fast else (full,)
                    yield pytest.param(dtype, dims, shape, causal, marks=marks, id=(
                        f"{str(dtype).replace('torch.', '')}-D{dims[0]}-{dims[1]}-"
                        f"{'x'.join(map(str, shape))}-{'causal' if causal else 'noncausal'}"))


def run_and_check(shape, head_dims, dtype, causal, per="tensor"):
    batch, seqlen_q, seqlen_k, num_q_heads, num_kv_heads = shape
    head_dim, head_dim_v = head_dims
    gen = torch.Generator(device="cuda").manual_seed(sum(shape) + head_dim)
    q = torch.randn(batch, seqlen_q, num_q_heads, head_dim, device="cuda", generator=gen)
    k = torch.randn(batch, seqlen_k, num_kv_heads, head_dim, device="cuda", generator=gen)
    v = torch.randn(batch, seqlen_k, num_kv_heads, head_dim_v, device="cuda", generator=gen)
    descales = {}
    if dtype in FP8_DTYPES:
        (q, qd), (k, kd), (v, vd) = (tileattn.quantize_fp8(x, dtype, per=per) for x in (q, k, v))
        descales = dict(q_descale=qd, k_descale=kd, v_descale=vd)
    else:
        q, k, v = (x.to(dtype) for x in (q, k, v))
    out, lse = tileattn.attention(q, k, v, causal=causal, return_lse=True, **descales)
    ref, ref_lse = attention_reference(q, k, v, causal=causal, **descales)
    assert torch.isfinite(out).all()
    error = float((out.double() - ref).norm() / ref.norm())
    assert error < TOLERANCES[dtype], error
    finite = torch.isfinite(ref_lse)
    assert torch.equal(finite, torch.isfinite(lse))
    assert ((lse.double() - ref_lse)[finite].abs() / ref_lse[finite].abs().clamp(min=1)).max() < LSE_TOLERANCES[dtype]


@pytest.mark.parametrize("dtype,head_dims,shape,causal", list(_real_size_cases()))
def test_real_sizes(dtype, head_dims, shape, causal):
    run_and_check(shape, head_dims, dtype, causal)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, pytest.param(torch.float8_e5m2, marks=full)],
                         ids=str)
def test_per_head_descales(dtype):
    run_and_check((2, 2000, 2000, 8, 4), (128, 128), dtype, True, per="head")


@pytest.mark.parametrize("dtype", [pytest.param(torch.bfloat16, marks=full), torch.float8_e4m3fn],
                         ids=str)
def test_long_context_32k(dtype):
    run_and_check((1, 32768, 32768, 2, 1), (128, 128), dtype, True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, pytest.param(torch.float8_e4m3fn, marks=full)],
                         ids=str)
def test_cached_launch_matches_triton_launch(dtype):
    """KernelLaunch.run's cached fast path gives bit-identical results to Triton's own launch."""
    run_and_check((2, 300, 300, 4, 2), (128, 128), dtype, True)  # compiles, caches
    q = torch.randn(2, 300, 4, 128, device="cuda").to(torch.bfloat16)
    k, v = (torch.randn(2, 300, 2, 128, device="cuda").to(torch.bfloat16) for _ in range(2))
    fast = tileattn.attention(q, k, v, causal=True)
    saved = dict(runtime._COMPILED)
    runtime._COMPILED.clear()
    attention_op._CALLS.clear()   # else the call cache replays its bound launch
    slow = tileattn.attention(q, k, v, causal=True)  # first launch of a key: Triton's path
    runtime._COMPILED.update(saved)
    assert torch.equal(fast, slow)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=str)
def test_repeat_calls_replay_the_checked_launch(dtype):
    """A call with an earlier call's signature skips the checks and the launch setup (the
    call cache): it must still read this call's tensors, scale and descales, transpose this
    call's V, and write fresh outputs."""
    attention_op._CALLS.clear()
    qkv_shape = (2, 333, 8 + 2 + 2, 128)   # fused qkv: q strided, GQA 8 / 2

    def call(seed, softmax_scale=None, descales=True):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        qkv = torch.randn(qkv_shape, device="cuda", generator=gen)
        if dtype in FP8_DTYPES and descales:
            qkv, qkv_descale = tileattn.quantize_fp8(qkv, dtype)
            kwargs = dict(q_descale=qkv_descale, k_descale=qkv_descale, v_descale=qkv_descale)
        else:   # FP8 without descales: randn values as they are, descales 1.0
            qkv, kwargs = qkv.to(dtype), {}
        q, k, v = qkv[:, :, :8], qkv[:, :, 8:10], qkv[:, :, 10:]
        out, lse = tileattn.attention(q, k, v, causal=True, softmax_scale=softmax_scale,
                                      return_lse=True, **kwargs)
        ref, ref_lse = attention_reference(q, k, v, causal=True, softmax_scale=softmax_scale,
                                           **kwargs)
        assert float((out.double() - ref).norm() / ref.norm()) < TOLERANCES[dtype]
        assert float(((lse.double() - ref_lse).abs() / ref_lse.abs().clamp(min=1)).max()) < LSE_TOLERANCES[dtype]
        return out

    for seed in range(3):   # new data each time: each must match its own reference
        call(seed)
    assert len(attention_op._CALLS._entries) == 1, "the repeat calls did not go through the call cache"
    for seed, scale in ((3, 0.05), (4, 0.2)):   # a second signature; each call's scale is read
        call(seed, softmax_scale=scale)
    assert len(attention_op._CALLS._entries) == 2
    with pytest.raises(ValueError, match="softmax_scale"):   # checked on the replayed path too
        call(7, softmax_scale=-1.0)
    if dtype in FP8_DTYPES:
        for seed in (5, 6):   # missing descales are 1.0 on the replayed path too
            call(seed, descales=False)
        assert len(attention_op._CALLS._entries) == 3


def test_training_forwards_replay_the_call_cache():
    """attention() on tensors that require grad (eager autograd) goes through the call cache
    too, and the replayed call's outputs and gradients equal the checked call's."""
    gen = torch.Generator(device="cuda").manual_seed(11)
    q, k, v = (torch.randn(2, 333, 8, 128, device="cuda", generator=gen).bfloat16()
               .requires_grad_() for _ in range(3))
    dout = torch.randn(2, 333, 8, 128, device="cuda", generator=gen).bfloat16()

    def step():
        out = tileattn.attention(q, k, v, causal=True)
        return (out, *torch.autograd.grad(out, (q, k, v), dout))

    attention_op._CALLS.clear()
    checked = step()
    replayed = step()
    assert len(attention_op._CALLS._entries) == 1, "the training forward did not replay"
    for a, b in zip(checked, replayed):
        assert torch.equal(a, b)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="needs an sm90 GPU")
def test_hopper_repeat_calls_replay_with_rebased_descriptors():
    """On the Hopper kernel, a repeated signature runs the bound launch with its TMA
    descriptors re-based on the new call's tensors (sm90.bind_attention): strided q/k/v of a
    fused buffer, new data, a new scale, softcap and ALiBi, each against its own reference."""
    attention_op._CALLS.clear()
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625, 0.03, 0.02, 0.01, 0.005], device="cuda")

    def call(seed, **options):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        qkv = torch.randn(2, 333, 12, 128, device="cuda", generator=gen).bfloat16()
        q, k, v = qkv[:, :, :8], qkv[:, :, 8:10], qkv[:, :, 10:]
        with tileattn.use_kernels(attention="sm90"):
            out = tileattn.attention(q, k, v, causal=True, **options)
        ref, _ = attention_reference(q, k, v, causal=True, **options)
        assert float((out.double() - ref).norm() / ref.norm()) < TOLERANCES[torch.bfloat16]

    for seed in range(3):
        call(seed)
    assert len(attention_op._CALLS._entries) == 1
    for seed, scale in ((3, 0.05), (4, 0.2)):
        call(seed, softmax_scale=scale)
    for seed in (5, 6):
        call(seed, softcap=20.0, alibi_slopes=slopes)
    assert len(attention_op._CALLS._entries) == 3


@pytest.mark.parametrize("head_dim,kv_heads,with_lse,hooks", [
    (128, 2, False, None), (64, 8, True, None), (256, 4, False, None), (96, 2, True, None),
    (128, 2, False, "softcap"), (64, 8, True, "softcap-alibi")])
def test_backwards_replay_the_backward_call_cache(head_dim, kv_heads, with_lse, hooks):
    """A repeated backward signature replays its bound launches (ops/backward_cache.py) on the
    new call's tensors: its gradients equal, bit for bit, those of the same inputs through the
    uncached path (Gluon descriptors re-based, portable launches, dlse; softcap and ALiBi
    with another cap and other slopes than the recorded call's)."""
    gen = torch.Generator(device="cuda").manual_seed(head_dim)

    def inputs(softcap):
        q = torch.randn(2, 333, 8, head_dim, device="cuda", generator=gen).bfloat16()
        k, v = (torch.randn(2, 301, kv_heads, head_dim, device="cuda", generator=gen).bfloat16()
                for _ in range(2))
        grads = [torch.randn(2, 333, 8, head_dim, device="cuda", generator=gen).bfloat16(),
                 torch.randn(2, 8, 333, device="cuda", generator=gen)]
        options = dict(softcap=softcap) if hooks else {}
        if hooks == "softcap-alibi":
            options["alibi_slopes"] = torch.rand(8, device="cuda", generator=gen)
        return [x.requires_grad_() for x in (q, k, v)], grads, options

    def step(leaves, grads, options):
        out, lse = tileattn.attention(*leaves, causal=True, return_lse=True, **options)
        outputs, grads = ((out, lse), grads) if with_lse else ((out,), grads[:1])
        return torch.autograd.grad(outputs, leaves, grads)

    first, second = inputs(10.0), inputs(25.0)
    backward_cache.CALLS.clear()
    step(*first)
    assert len(backward_cache.CALLS._entries) == 1
    (key, replay), = backward_cache.CALLS._entries.items()
    replays = []
    backward_cache.CALLS._entries[key] = lambda *args: replays.append(1) or replay(*args)
    replayed = step(*second)
    assert replays, "the second backward did not replay"
    backward_cache.CALLS.clear()
    backward_cache.CALLS.put = lambda *args: None          # the reference: uncached
    try:
        checked = step(*second)
    finally:
        del backward_cache.CALLS.put
    for a, b in zip(replayed, checked):
        assert torch.equal(a, b)


def test_packed_backwards_replay_the_backward_call_cache():
    """attention_varlen's backward replays too (portable kernels, cu_seqlens by name): a call
    with other sequences (same shapes and max lengths) gives, bit for bit, the gradients of
    the uncached path."""
    lengths = [(300, 350), (17, 17), (683, 600), (0, 33)]

    def step(order, seed):
        lq, lk = ([lengths[i][j] for i in order] for j in (0, 1))
        cu_q, cu_k = (torch.tensor([0] + l, device="cuda").cumsum(0).to(torch.int32)
                      for l in (lq, lk))
        gen = torch.Generator(device="cuda").manual_seed(seed)
        q = torch.randn(sum(lq), 8, 128, device="cuda", generator=gen).bfloat16().requires_grad_()
        k, v = (torch.randn(sum(lk), 2, 128, device="cuda", generator=gen).bfloat16()
                .requires_grad_() for _ in range(2))
        out = tileattn.attention_varlen(q, k, v, cu_q, cu_k, 683, 600, causal=True)
        grad = torch.randn(out.shape, device="cuda", generator=gen).bfloat16()
        return torch.autograd.grad(out, (q, k, v), grad)

    backward_cache.CALLS.clear()
    step([0, 1, 2, 3], 0)
    assert len(backward_cache.CALLS._entries) == 1
    (key, replay), = backward_cache.CALLS._entries.items()
    replays = []
    backward_cache.CALLS._entries[key] = lambda *args: replays.append(1) or replay(*args)
    replayed = step([2, 0, 3, 1], 1)
    assert replays, "the second backward did not replay"
    backward_cache.CALLS.clear()
    backward_cache.CALLS.put = lambda *args: None          # the reference: uncached
    try:
        checked = step([2, 0, 3, 1], 1)
    finally:
        del backward_cache.CALLS.put
    for a, b in zip(replayed, checked):
        assert torch.equal(a, b)


def test_cuda_graph_capture_and_replay():
    q, k, v = (torch.randn(2, 500, 4, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    tileattn.attention(q, k, v, causal=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = tileattn.attention(q, k, v, causal=True)
    for _ in range(2):
        for x in (q, k, v):
            x.copy_(torch.randn_like(x))
        graph.replay()
        ref, _ = attention_reference(q, k, v, causal=True)
        assert float((out.double() - ref).norm() / ref.norm()) < TOLERANCES[torch.float16]
