"""Compile every portable-kernel config for its chip, without a GPU.

Proves each row of the config table fits that chip's shared memory, that sm90 runs on wgmma,
and that the FP8 V layout the library chooses keeps V's loads asynchronous.
"""

import pytest

from .compile_helpers import run_without_interpreter

CHILD = r'''
import json, re, torch
from tileattn.arch import arch_for_capability
from tileattn.kernels.attention.fwd import CAUSAL_CONFIGS, CONFIGS, attention_launch
from tileattn.kernels.compile import cross_compile
from tileattn.fp8 import prepare_v

CAPABILITY = {"sm80": (8, 0), "sm89": (8, 9), "sm90": (9, 0)}

def compile_case(cap, head_dim, dtype, k_major_v, causal=False, block_descales=False):
    arch = arch_for_capability(cap)
    q = torch.empty(1, 256, 2, head_dim, dtype=dtype)
    k, v = torch.empty_like(q), torch.empty_like(q)
    if k_major_v:
        v = prepare_v(v)
    out = torch.empty(1, 256, 2, head_dim, dtype=torch.bfloat16)
    lse = torch.empty(1, 2, 256)
    descale = torch.ones(()) if dtype.itemsize == 1 else None
    qk_descale = torch.ones(1, 2, 2) if block_descales else descale
    launch = attention_launch(q, k, v, out, lse, qk_descale, qk_descale, descale, 0.1, causal,
                              arch)
    c = cross_compile(launch, cap[0] * 10 + cap[1])
    count = lambda pattern: len(re.findall(pattern, c.ptx))
    return {"shared": c.shared_bytes, "limit": arch.shared_memory_bytes,
            "wgmma": count(r"wgmma\.mma_async"), "mma_sync": count(r"mma\.sync"),
            "cp_async": count(r"cp\.async\.c[ag]"), "st_shared": count(r"st\.shared"),
            "fp8_mma": count(r"mma[\w.]*\.e4m3"), "shfl": count(r"shfl\.sync"),
            "prmt": count(r"prmt\.b32"), "selp": count(r"selp\.")}

rows = []
for (name, width, is_fp8), config in CONFIGS.items():
    if name == "cpu":
        continue
    cap = CAPABILITY[name]
    dtype = torch.float8_e4m3fn if is_fp8 else torch.bfloat16
    k_major = is_fp8 and arch_for_capability(cap).fp8_v_needs_k_major
    rows.append({"arch": name, "width": width, "fp8": is_fp8, "causal": False,
                 **compile_case(cap, width, dtype, k_major)})
    if is_fp8:
        rows.append({"arch": name, "width": width, "fp8": True, "causal": False,
                     "block_descales": True,
                     **compile_case(cap, width, dtype, k_major, block_descales=True)})
for (name, width, is_fp8), config in CAUSAL_CONFIGS.items():
    cap = CAPABILITY[name]
    dtype = torch.float8_e4m3fn if is_fp8 else torch.bfloat16
    k_major = is_fp8 and arch_for_capability(cap).fp8_v_needs_k_major
    rows.append({"arch": name, "width": width, "fp8": is_fp8, "causal": True,
                 **compile_case(cap, width, dtype, k_major, causal=True)})
fp8_layouts = {str(k_major): compile_case((9, 0), 128, torch.float8_e4m3fn, k_major)
               for k_major in (True, False)}

def flex_fp8_case(cap, block_q, block_kv):
    """FP8 under a block mask of block_q x block_kv blocks (tiles of those sizes, as
    ops/flex.py picks them): keys tiles narrower than 32 are narrower than an FP8 MMA's K."""
    from tileattn.flex.block_mask import BlockMaskTensors
    from tileattn.kernels.attention.configs import TileConfig
    from tileattn.kernels.attention.fwd import Masks
    arch = arch_for_capability(cap)
    q = torch.empty(1, 256, 2, 128, dtype=torch.float8_e4m3fn)
    k, v = torch.empty_like(q), prepare_v(torch.empty_like(q))
    out = torch.empty(1, 256, 2, 128, dtype=torch.bfloat16)
    counts = torch.zeros(1, 2, 256 // block_q, dtype=torch.int32)
    indices = torch.zeros(1, 2, 256 // block_q, 256 // block_kv, dtype=torch.int32)
    masks = Masks(block_mask=BlockMaskTensors(block_q, block_kv, counts, indices, counts,
                                              indices))
    descale = torch.ones(())
    launch = attention_launch(q, k, v, out, None, descale, descale, descale, 0.1, False, arch,
                              TileConfig(block_q, block_kv, 4, 2), masks=masks)
    c = cross_compile(launch, cap[0] * 10 + cap[1])
    return {"shared": c.shared_bytes, "limit": arch.shared_memory_bytes,
            "fp8_mma": len(re.findall(r"mma[\w.]*\.e4m3", c.ptx)),
            "mma": len(re.findall(r"mma[\w.]*\.(?:e4m3|f16|bf16)", c.ptx))}

flex_fp8 = [dict(cap=list(cap), block_q=bq, block_kv=bk, **flex_fp8_case(cap, bq, bk))
            for cap in ((8, 9), (9, 0)) for bq, bk in ((16, 16), (32, 16), (64, 32))]

def packed_case(cap, dtype, *, paged, causal=False, masks=None, row_major_v=False):
    """Packed queries (two sequences of 100 and 200) over packed or paged K/V (pages of 16
    keys): the portable kernel's varlen and paged key loops, as attention_varlen() builds
    them (packed FP8 V K-major at aligned starts where the chip needs K-major V: docs/
    design.md, "Serving masks and varlen/paged prefill"; row_major_v: as it was before)."""
    from tileattn.kernels.attention.fwd import Sequences
    from tileattn.kernels.attention.layout import packed_v_width
    arch = arch_for_capability(cap)
    q = torch.empty(300, 4, 128, dtype=dtype)
    k = torch.empty((40, 16, 2, 128) if paged else (300, 2, 128), dtype=dtype)
    v = torch.empty_like(k)
    aligned = not paged and not row_major_v and dtype.itemsize == 1 and arch.fp8_v_needs_k_major
    if aligned:
        v = torch.empty(2, 128, packed_v_width(300, 2), dtype=dtype).permute(2, 0, 1)
    out = torch.empty(300, 4, 128, dtype=torch.bfloat16)
    cu_seqlens = torch.tensor([0, 100, 300], dtype=torch.int32)
    sequences = Sequences(cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens, max_seqlen_q=200,
                          max_seqlen_k=200,
                          block_table=torch.zeros(2, 20, dtype=torch.int32) if paged else None,
                          v_aligned_starts=aligned)
    descale = torch.ones(()) if dtype.itemsize == 1 else None
    launch = attention_launch(q, k, v, out, torch.empty(4, 300), descale, descale, descale, 0.1,
                              causal, arch, masks=masks, sequences=sequences)
    c = cross_compile(launch, cap[0] * 10 + cap[1])
    return {"cap": list(cap), "dtype": str(dtype), "shared": c.shared_bytes,
            "limit": arch.shared_memory_bytes, "aligned_v": aligned,
            "mma": len(re.findall(r"wgmma\.mma_async|mma\.sync", c.ptx)),
            "cp_async": len(re.findall(r"cp\.async\.c[ag]", c.ptx)),
            "st_shared": len(re.findall(r"st\.shared", c.ptx))}

from tileattn.ops.attention import masks_for
PACKED_CHIPS = (((8, 0), torch.bfloat16), ((8, 9), torch.float8_e4m3fn),
                ((9, 0), torch.bfloat16), ((9, 0), torch.float8_e4m3fn))
# Paged and causal; packed under a two-sided window, softcap and ALiBi (the score hooks).
packed = [packed_case(cap, dtype, paged=True, causal=True) for cap, dtype in PACKED_CHIPS]
packed += [packed_case(cap, dtype, paged=False, masks=masks_for(False, (64, 32), 30.0,
                                                                torch.ones(4)))
           for cap, dtype in PACKED_CHIPS]
packed_row_major = packed_case((9, 0), torch.float8_e4m3fn, paged=False, causal=True,
                               row_major_v=True)
packed_aligned = packed_case((9, 0), torch.float8_e4m3fn, paged=False, causal=True)
print(json.dumps({"rows": rows, "fp8_layouts": fp8_layouts, "flex_fp8": flex_fp8,
                  "packed": packed, "packed_fp8_v": [packed_row_major, packed_aligned]}))
'''


@pytest.fixture(scope="module")
def compiled():
    return run_without_interpreter(CHILD)


def test_every_config_fits_its_chip(compiled):
    assert len(compiled["rows"]) >= 16
    assert any(row["causal"] for row in compiled["rows"])
    for row in compiled["rows"]:
        assert row["shared"] <= row["limit"], row


def test_sm90_uses_wgmma_and_older_chips_mma_sync(compiled):
    for row in compiled["rows"]:
        if row["arch"] == "sm90":
            assert row["wgmma"] > 0 and row["mma_sync"] == 0, row
        else:
            assert row["wgmma"] == 0 and row["mma_sync"] > 0, row
        if row["fp8"]:
            assert row["fp8_mma"] > 0, f"FP8 config fell back to 16-bit MMA: {row}"


def test_block_descales_keep_the_pipeline(compiled):
    """Block descales (one k descale load per key block) keep each FP8 row within its chip and
    its asynchronous copies and FP8 MMAs: the scalar load must not break the K/V pipeline
    (the compiler pipelines it too, through shared memory: a few hundred bytes, more copies)."""
    plain = {(r["arch"], r["width"]): r for r in compiled["rows"]
             if r["fp8"] and not r["causal"] and not r.get("block_descales")}
    blocked = [r for r in compiled["rows"] if r.get("block_descales")]
    assert {(r["arch"], r["width"]) for r in blocked} == set(plain)
    for row in blocked:
        base = plain[row["arch"], row["width"]]
        assert row["shared"] <= base["shared"] + 1024 and row["shared"] <= row["limit"], row
        assert row["cp_async"] >= base["cp_async"] and row["fp8_mma"] == base["fp8_mma"], row


def test_fp8_under_narrow_mask_blocks_compiles(compiled):
    """FlexAttention block masks of 16 keys make key tiles narrower than an FP8 MMA's K (32):
    such tiles multiply P @ V in fp16 and still compile for every FP8 chip (on sm90 Triton
    also widens Q @ K^T to fp16 below 64-row tiles, where wgmma does not apply)."""
    assert len(compiled["flex_fp8"]) == 6
    for row in compiled["flex_fp8"]:
        assert row["shared"] <= row["limit"] and row["mma"] > 0, row


def test_k_major_fp8_v_is_loaded_asynchronously(compiled):
    """K-major V: V tiles ride cp.async like K's. Row-major V: the compiler loads V into
    registers and transposes it through shared memory, losing the pipeline (the FP8 cliff)."""
    k_major, row_major = compiled["fp8_layouts"]["True"], compiled["fp8_layouts"]["False"]
    assert k_major["cp_async"] >= 2 * row_major["cp_async"] - 8
    assert k_major["st_shared"] * 4 < row_major["st_shared"]


def test_packed_and_paged_prefill_compile_for_every_chip(compiled):
    """The varlen and paged key loops share their loop with contiguous and listed keys
    (fwd_loops.py); paged prefill, and packed sequences under a two-sided window, softcap and
    ALiBi, must keep compiling for the chips they run on (the interpreter does not type
    loop-carried values, so only a compile catches a clash there)."""
    assert len(compiled["packed"]) == 8
    for row in compiled["packed"]:
        assert row["shared"] <= row["limit"] and row["mma"] > 0, row


def test_packed_fp8_v_at_aligned_starts_is_loaded_asynchronously(compiled):
    """Packed FP8 V copied K-major with each sequence at an aligned row (what attention_varlen
    does on sm89/sm90): its tiles ride cp.async as dense K-major V's do; row-major, the compiler
    transposes them through registers and shared memory."""
    row_major, aligned = compiled["packed_fp8_v"]
    assert aligned["aligned_v"] and not row_major["aligned_v"]
    assert aligned["cp_async"] > row_major["cp_async"]
    assert aligned["st_shared"] * 4 < row_major["st_shared"]
    assert aligned["shared"] <= aligned["limit"]
