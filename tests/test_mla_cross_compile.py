"""Compile every MLA decode config for its chip, without a GPU.

Proves each row of the config table fits that chip's shared memory with a 16-bit and an FP8
cache, and that sm90 runs QK^T and P@V on wgmma (older chips on mma.sync).
"""

import pytest

from .compile_helpers import run_without_interpreter

CHILD = r'''
import json, re, torch
from tileattn import scheduler
from tileattn.arch import arch_for_capability
from tileattn.kernels.mla import decode as mla
from tileattn.kernels.compile import cross_compile

CAPABILITY = {"sm80": (8, 0), "sm89": (8, 9), "sm90": (9, 0)}

def compile_case(cap, schedule, kv_dtype, num_heads, page_size=64):
    arch = arch_for_capability(cap)
    config = mla.config_for(arch, schedule, num_heads)
    batch, q_len = 2, 1
    q = torch.empty(batch, q_len, num_heads, 576, dtype=torch.bfloat16)
    kv = torch.empty(8, page_size, 576, dtype=kv_dtype)
    page_table = torch.zeros(batch, 4, dtype=torch.int32)
    seq_lens = torch.tensor([200, 100], dtype=torch.int32)
    rows = q_len * num_heads
    plan = scheduler.make_mla_plan([200, 100], num_heads=num_heads, q_len=q_len,
        page_size=page_size, kv_dtype=kv_dtype, head_dim_v=512,
        programs_per_item=mla.programs_per_work_item(config, rows), num_sms=132,
        block_n=config.block_n, min_chunk=32, device="cpu", config=config)
    out = torch.empty(batch, q_len, num_heads, 512, dtype=torch.bfloat16)
    lse = torch.empty(batch, q_len, num_heads)
    descale = torch.ones(()) if kv_dtype.itemsize == 1 else None
    launches = mla.mla_decode_launches(q, kv, page_table, seq_lens, descale, out, lse, plan, 0.1, arch)
    result = []
    for launch in launches:
        c = cross_compile(launch, cap[0] * 10 + cap[1])
        count = lambda pattern: len(re.findall(pattern, c.ptx))
        result.append({"kernel": launch.kernel.fn.__name__ if hasattr(launch.kernel, "fn") else launch.kernel.__name__,
                       "shared": c.shared_bytes, "limit": arch.shared_memory_bytes,
                       "regs": c.num_regs, "wgmma": count(r"wgmma\.mma_async"),
                       "mma_sync": count(r"mma\.sync"), "cp_async": count(r"cp\.async\.c[ag]"),
                       "local": count(r"ld\.local|st\.local"),
                       "ld_shared_b8": count(r"ld\.shared\.[bu]8")})
    return result

rows = []
for (name, schedule), config in mla.CONFIGS.items():
    if name == "cpu":
        continue
    for kv_dtype in (torch.bfloat16, torch.float8_e4m3fn):
        for num_heads in (16, 128):   # a small-block row (where the chip has one) and the main row
            for kernel_row in compile_case(CAPABILITY[name], schedule, kv_dtype, num_heads):
                rows.append({"arch": name, "schedule": schedule, "kv": str(kv_dtype),
                             "heads": num_heads, **kernel_row})
print(json.dumps({"rows": rows}))
'''


@pytest.fixture(scope="module")
def compiled():
    return run_without_interpreter(CHILD)


def test_every_config_fits_its_chip(compiled):
    partial = [row for row in compiled["rows"] if row["kernel"] == "mla_decode_partial_kernel"]
    assert len(partial) == 24   # 3 chips x 2 schedules x 2 cache dtypes x 2 head counts
    for row in compiled["rows"]:
        assert row["shared"] <= row["limit"], row


def test_sm90_uses_wgmma_and_older_chips_mma_sync(compiled):
    for row in compiled["rows"]:
        if row["kernel"] != "mla_decode_partial_kernel":
            continue
        if row["arch"] == "sm90" and row["heads"] >= 64:
            assert row["wgmma"] > 0 and row["mma_sync"] == 0, row
        elif row["arch"] == "sm90":   # 16 rows: below wgmma's M of 64 per warpgroup
            assert row["mma_sync"] > 0, row
        else:
            assert row["wgmma"] == 0 and row["mma_sync"] > 0, row


def test_fp8_cache_streams_asynchronously(compiled):
    """An FP8 cache must reach shared memory through cp.async like a 16-bit one: a tile loaded
    to registers and stored by hand stalls on every KV tile (sm90 PTX once had 4 cp.async for
    FP8 against 72 for bf16, and FP8 ran slower than bf16 on H100)."""
    partial = {(row["arch"], row["schedule"], row["kv"], row["heads"]): row
               for row in compiled["rows"] if row["kernel"] == "mla_decode_partial_kernel"}
    for (arch, schedule, kv, heads), row in partial.items():
        if kv != "torch.float8_e4m3fn" or arch == "sm80":   # sm80 decodes FP8 bytes by hand
            continue
        bf16 = partial[(arch, schedule, "torch.bfloat16", heads)]
        assert row["cp_async"] >= bf16["cp_async"] // 2, (row, bf16)


def test_sm90_small_block_fp8_reads_v_without_byte_loads(compiled):
    """sm90's 16-row FP8 build widens V by inline PTX (fp8_v_asm_rows): the FP8 tile is read
    from shared memory in wide rows and V reaches the MMA through an fp16 tile and
    ldmatrix.trans, not as 512 single-byte loads. Its fp16 staging buffer is one of 4 V column
    chunks, so that two programs still fit an SM (228 KB, 1 KB reserved for each)."""
    row = next(row for row in compiled["rows"] if row["kernel"] == "mla_decode_partial_kernel"
               and row["arch"] == "sm90" and row["schedule"] == "split_dv"
               and row["kv"] == "torch.float8_e4m3fn" and row["heads"] == 16)
    assert row["ld_shared_b8"] == 0, row
    assert 2 * (row["shared"] + 1024) <= 228 * 1024, row
