"""Every kernel family once on odd shapes, for compute-sanitizer's memcheck.

Odd lengths, GQA, Dv != D, causal or not, LSE on, for the portable forward kernel (bf16 and
FP8, V transposed in the call) and the Hopper one (forced); MLA decode with mixed lengths
(1, 70, 300 / 2, 70, 700 keys, so that partial tiles, split sequences and the combine all run)
on the Triton kernel (pages of 16, bf16 and e4m3 caches, 16 and 64 heads, q_len 1 and 2) and
on sm90 the Gluon kernels (pages of 64). Nothing is timed or compared: memcheck reports any
out-of-bounds or misaligned access, and the exit status says whether it found one.

    compute-sanitizer --tool memcheck --error-exitcode 9 python benchmarks/sanitizer_cases.py

(benchmarks/gpu.sh sanitizer runs exactly that).
"""

from __future__ import annotations

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
    if torch.cuda.get_device_capability() == (9, 0):
        q = torch.randn(2, 333, 8, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(2, 1001, 2, 128, device="cuda", dtype=torch.bfloat16)
        with tileattn.use_kernels(attention="sm90"):
            for causal in (False, True):
                tileattn.attention(q, k, k, causal=causal, return_lse=True)


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


def main() -> None:
    attention_cases()
    mla_cases()
    torch.cuda.synchronize()
    print("sanitizer cases ran")


if __name__ == "__main__":
    main()
