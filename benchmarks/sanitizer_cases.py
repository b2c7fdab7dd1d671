"""Every kernel family once on odd shapes, for compute-sanitizer (memcheck; racecheck too).

Odd lengths, GQA, Dv != D, causal or not, LSE on, for:
- the portable forward kernel (bf16 and FP8, V transposed in the call; per-tensor and block
  descales from quantize_qkv_fp8 with smoothing and rotation, whose kernels run too) and the
  Hopper one (forced, padded head dim 96 included), with sliding window, softcap and ALiBi;
- attention_varlen over packed and paged K/V (page sizes 1, 7 and 16, shuffled pages, garbage
  ids in unused table slots, empty sequences) and the split-KV paged decode, with a plan;
- the backward kernels (GQA, Dv != D, causal, deterministic dq, varlen, masks);
- on sm90, the Gluon kernels forced on odd shapes (hopper_cases): FP8 and 16-bit forward with
  every mask, packed varlen, the fused and split backward;
- flex_attention with a document block mask and a score_mod, bf16 and FP8;
- MLA decode with mixed lengths (1, 70, 300 / 2, 70, 700 keys, so that partial tiles, split
  sequences and the combine all run) on the Triton kernel (pages of 16, bf16 and e4m3 caches,
  16 and 64 heads, q_len 1 and 2) and on sm90 the Gluon kernels (pages of 64).
Nothing is timed or compared: memcheck reports any out-of-bounds or misaligned access, and the
exit status says whether it found one.

    compute-sanitizer --tool memcheck --error-exitcode 9 python benchmarks/sanitizer_cases.py [FAMILY ...]

(benchmarks/gpu.sh sanitizer runs exactly that; `racecheck` the same under racecheck). FAMILY is
one of attention, hopper, serving, backward, flex, mla; none runs them all.
"""

from __future__ import annotations

import sys

import torch

import tileattn


def attention_cases() -> None:
    for dtype in (torch.bfloat16, torch.float8_e4m3fn):
        q = torch.randn(2, 77, 4, 96, device="cuda")
        k = torch.randn(2, 131, 2, 96, device="cuda")
        v = torch.randn(2, 131, 2, 64, device="cuda")
        if dtype.itemsize == 1:
            (q, qd), (k, kd), (v, vd) = (tileattn.quantize_fp8(x, dtype) for x in (q, k, v))
            descales = dict(q_descale=qd, k_descale=kd, v_descale=vd)
        else:
            (q, k, v), descales = (x.to(dtype) for x in (q, k, v)), {}
        for causal in (False, True):
            tileattn.attention(q, k, v, causal=causal, return_lse=True, **descales)
        tileattn.attention(q, k, v, window_size=(50, 3), softcap=20.0, return_lse=True,
                           alibi_slopes=torch.rand(4, device="cuda"), **descales)
    q, k, v = (torch.randn(2, n, h, 128, device="cuda") for n, h in ((300, 4), (259, 2), (259, 2)))
    for setting in (dict(per="tensor"), dict(per="block", smooth_k=True, rotate=True)):
        q8, k8, v8, scales = tileattn.quantize_qkv_fp8(q, k, v, **setting)
        tileattn.attention(q8, k8, v8, causal=True, return_lse=True, **scales)
    if torch.cuda.get_device_capability() == (9, 0):
        for dim in (128, 96):
            q = torch.randn(2, 333, 8, dim, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(2, 1001, 2, dim, device="cuda", dtype=torch.bfloat16)
            with tileattn.use_kernels(attention="sm90"):
                for causal in (False, True):
                    tileattn.attention(q, k, k, causal=causal, return_lse=True)


def _cu_seqlens(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32,
                        device="cuda")


def hopper_cases() -> None:
    """sm90: the Gluon kernels that the dispatch keeps for longer calls, forced on odd shapes:
    the FP8 forward (V's grouped K-major copy, per-tensor and block descales), the 16-bit one
    with every mask and Dv != D, packed varlen (its work-list kernels too), and the backward's
    fused kernel (dense and packed), its dK/dV and dQ kernels (deterministic) and D=256's dQ."""
    if torch.cuda.get_device_capability() != (9, 0):
        return
    masks = dict(window_size=(50, 0), softcap=20.0, alibi_slopes=torch.rand(4, device="cuda"))
    with tileattn.use_kernels(attention="sm90"):
        for dim in (64, 128, 256):
            q = torch.randn(2, 333, 4, dim, device="cuda")
            k, v = (torch.randn(2, 517, 2, dim, device="cuda") for _ in range(2))
            (q8, qd), (k8, kd), (v8, vd) = (tileattn.quantize_fp8(x, torch.float8_e4m3fn)
                                            for x in (q, k, v))
            per_tensor = dict(q_descale=qd, k_descale=kd, v_descale=vd)
            for causal in (False, True):
                tileattn.attention(q8, k8, v8, causal=causal, return_lse=True, **per_tensor)
            tileattn.attention(q8, k8, v8, causal=True, **masks, **per_tensor)
            q8, k8, v8, scales = tileattn.quantize_qkv_fp8(q, k, v, per="block")
            tileattn.attention(q8, k8, v8, causal=True, return_lse=True, **scales)
            qb, kb, vb = (x.bfloat16() for x in (q, k, v))
            tileattn.attention(qb, kb, vb, causal=True, return_lse=True, **masks)
        q = torch.randn(2, 333, 4, 192, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(2, 517, 2, 192, device="cuda", dtype=torch.bfloat16)
        tileattn.attention(q, k, k[..., :128], causal=True, return_lse=True)
        # Long calls at head dim 64: 192-query tiles (sm90.LONG_QUERY_CONFIGS).
        q = torch.randn(1, 4099, 2, 64, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, 4111, 1, 64, device="cuda", dtype=torch.bfloat16)
        tileattn.attention(q, k, k, return_lse=True)
        tileattn.attention(q, k, k, causal=True, window_size=(500, 0), softcap=20.0,
                           return_lse=True)
        lengths = [3, 0, 150, 41, 300]
        cu = _cu_seqlens(lengths)
        # Packed backward at both fused head dims (64 without a mask: dQ in turns).
        for dim in (64, 128):
            q, k, v = (torch.randn(sum(lengths), h, dim, device="cuda", dtype=torch.bfloat16,
                                   requires_grad=True) for h in (8, 2, 2))
            for causal in (False, True):
                out = tileattn.attention_varlen(q, k, v, cu, cu, max(lengths), max(lengths),
                                                causal=causal, return_lse=True)[0]
                torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
        # Dense backward: seqlen_q 332 (a multiple of 4, the fused kernel's lse rows) and 333.
        for dim, seqlen_q, causal, deterministic in (
                (64, 332, False, False), (64, 332, True, False), (128, 332, False, False),
                (128, 332, True, False), (128, 333, True, False), (128, 332, True, True),
                (256, 332, True, True)):
            q = torch.randn(2, seqlen_q, 4, dim, device="cuda", dtype=torch.bfloat16,
                            requires_grad=True)
            k, v = (torch.randn(2, 517, 2, dim, device="cuda", dtype=torch.bfloat16,
                                requires_grad=True) for _ in range(2))
            out = tileattn.attention(q, k, v, causal=causal, deterministic=deterministic)
            torch.autograd.grad(out, (q, k, v), torch.randn_like(out))


def _paged(k, v, lengths, page_size):
    """k/v [total, H, D] packed as lengths -> (caches, block_table): shuffled pages, 10**6 in
    the unused table slots (never read)."""
    pages = [-(-n // page_size) for n in lengths]
    num_pages = sum(pages) + 3
    order = torch.randperm(num_pages).tolist()
    table = torch.full((len(lengths), max(pages) + 2), 10**6, dtype=torch.int32)
    caches = [torch.randn(num_pages, page_size, *x.shape[1:], device="cuda").to(x.dtype)
              for x in (k, v)]
    start = 0
    for b, n in enumerate(lengths):
        for p in range(pages[b]):
            table[b, p] = page = order.pop()
            rows = min(page_size, n - p * page_size)
            for cache, x in zip(caches, (k, v)):
                cache[page, :rows] = x[start + p * page_size:start + p * page_size + rows]
        start += n
    return caches, table.to("cuda")


def serving_cases() -> None:
    lengths_q, lengths_k = [0, 5, 77, 1, 130], [3, 40, 200, 130, 130]
    for dtype in (torch.bfloat16, torch.float8_e4m3fn):
        q = torch.randn(1, sum(lengths_q), 8, 128, device="cuda")
        k = torch.randn(1, sum(lengths_k), 2, 128, device="cuda")
        v = torch.randn(1, sum(lengths_k), 2, 64, device="cuda")
        if dtype.itemsize == 1:
            (q, qd), (k, kd), (v, vd) = (tileattn.quantize_fp8(x, dtype) for x in (q, k, v))
            descales = dict(q_descale=qd, k_descale=kd, v_descale=vd)
        else:
            (q, k, v), descales = (x.to(dtype) for x in (q, k, v)), {}
        q, k, v = q[0], k[0], v[0]
        args = (_cu_seqlens(lengths_q), _cu_seqlens(lengths_k), max(lengths_q), max(lengths_k))
        tileattn.attention_varlen(q, k, v, *args, causal=True, return_lse=True, **descales)
        tileattn.attention_varlen(q, k, v, *args, window_size=(31, 2), softcap=10.0,
                                  alibi_slopes=torch.rand(8, device="cuda"), **descales)
        for page_size in (1, 7, 16):
            (k_cache, v_cache), table = _paged(k, v, lengths_k, page_size)
            tileattn.attention_varlen(q, k_cache, v_cache, *args, causal=True, block_table=table,
                                      return_lse=True, **descales)
        # Decode: one query per sequence over the paged cache, planned (graph-capturable path).
        (k_cache, v_cache), table = _paged(k, v, lengths_k, 16)
        ones = [1] * len(lengths_k)
        plan = tileattn.decode_plan(cu_seqlens_k=_cu_seqlens(lengths_k), num_q_heads=8,
                                    num_kv_heads=2, page_size=16, head_dim=128, head_dim_v=64,
                                    kv_dtype=k_cache.dtype, device="cuda")
        tileattn.attention_varlen(q[:len(ones)], k_cache, v_cache, _cu_seqlens(ones),
                                  _cu_seqlens(lengths_k), 1, max(lengths_k), block_table=table,
                                  plan=plan, return_lse=True, **descales)


def backward_cases() -> None:
    for causal, deterministic in ((False, False), (True, True)):
        q = torch.randn(2, 77, 4, 96, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(2, 131, 2, 96, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(2, 131, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        out = tileattn.attention(q, k, v, causal=causal, window_size=(40, -1), softcap=15.0,
                                 deterministic=deterministic)
        torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    lengths = [3, 0, 150, 41]
    cu = _cu_seqlens(lengths)
    q, k, v = (torch.randn(sum(lengths), h, 128, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for h in (4, 2, 2))
    out = tileattn.attention_varlen(q, k, v, cu, cu, max(lengths), max(lengths), causal=True)
    torch.autograd.grad(out, (q, k, v), torch.randn_like(out))


def flex_cases() -> None:
    from torch.nn.attention.flex_attention import create_block_mask

    doc_ids = torch.randint(0, 4, (333,), device="cuda").sort().values
    mask = create_block_mask(lambda b, h, q, kv: doc_ids[q] == doc_ids[kv], None, None, 333, 333,
                             device="cuda")
    bias = torch.randn(4, device="cuda")
    score_mod = lambda score, b, h, q, kv: score + bias[h]
    for dtype in (torch.bfloat16, torch.float8_e4m3fn):
        q, k, v = (torch.randn(1, 4, 333, 128, device="cuda") for _ in range(3))
        descales = {}
        if dtype.itemsize == 1:
            (q, qd), (k, kd), (v, vd) = (tileattn.quantize_fp8(x, dtype) for x in (q, k, v))
            descales = dict(q_descale=qd, k_descale=kd, v_descale=vd)
        else:
            q, k, v = (x.to(dtype) for x in (q, k, v))
        tileattn.flex_attention(q, k, v, score_mod=score_mod, block_mask=mask, return_lse=True,
                                **descales)


def mla_case(heads, q_len, kv_dtype, lengths, page_size, kernel) -> None:
    max_pages = max(-(-n // page_size) for n in lengths)
    num_pages = len(lengths) * max_pages + 4
    kv = torch.randn(num_pages, page_size, 576, device="cuda", dtype=torch.bfloat16).to(kv_dtype)
    page_table = torch.randperm(num_pages, device="cuda").to(torch.int32)
    page_table = page_table[: len(lengths) * max_pages].reshape(len(lengths), max_pages)
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device="cuda").clamp(min=q_len)
    q = torch.randn(len(lengths), q_len, heads, 576, device="cuda", dtype=torch.bfloat16)
    plan = tileattn.mla_plan(seq_lens, num_heads=heads, q_len=q_len, page_size=page_size,
                             kv_dtype=kv.dtype, device="cuda", kernel=kernel)
    assert plan.kernel == kernel, (plan.kernel, kernel)
    tileattn.mla_decode(q, kv, page_table, seq_lens, softmax_scale=0.07, plan=plan,
                        kv_descale=torch.tensor(0.02, device="cuda")
                        if kv_dtype == torch.float8_e4m3fn else None)


def mla_cases() -> None:
    for heads, q_len, kv_dtype in ((16, 1, torch.bfloat16), (16, 2, torch.bfloat16),
                                   (64, 1, torch.bfloat16), (16, 2, torch.float8_e4m3fn),
                                   (64, 1, torch.float8_e4m3fn)):
        mla_case(heads, q_len, kv_dtype, [1, 70, 300], 16, "triton")
    if torch.cuda.get_device_capability() == (9, 0):
        for heads, q_len, kv_dtype in ((64, 1, torch.bfloat16), (128, 2, torch.bfloat16),
                                       (64, 1, torch.float8_e4m3fn),
                                       (128, 2, torch.float8_e4m3fn)):
            mla_case(heads, q_len, kv_dtype, [2, 70, 700], 64, "gluon")


FAMILIES = {"attention": attention_cases, "hopper": hopper_cases, "serving": serving_cases,
            "backward": backward_cases, "flex": flex_cases, "mla": mla_cases}


def main(argv: list[str] | None = None) -> None:
    names = sys.argv[1:] if argv is None else argv
    unknown = [name for name in names if name not in FAMILIES]
    if unknown:
        raise SystemExit(f"unknown case families {unknown}; known: {', '.join(FAMILIES)}")
    for name in names or FAMILIES:
        FAMILIES[name]()
    torch.cuda.synchronize()
    print("sanitizer cases ran")


if __name__ == "__main__":
    main()
