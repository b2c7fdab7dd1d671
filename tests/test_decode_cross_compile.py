"""Compile every paged-decode config for its chip, without a GPU.

Proves each row of kernels/decode.py's table fits that chip's shared memory with a 16-bit and
FP8 caches, page-aligned and gathered key tiles, the largest row block, hooks and an FP8 q;
that no build spills registers; and that an FP8 cache still streams through cp.async.
"""

import pytest

from .compile_helpers import run_without_interpreter

CHILD = r'''
import json, re, torch
from tileattn.scheduler import decode as split_kv
from tileattn.arch import arch_for_capability
from tileattn.kernels.attention import decode
from tileattn.kernels.compile import cross_compile
from tests.decode_hooks import keep_last_keys, softcap_only

CAPABILITY = {"sm80": (8, 0), "sm89": (8, 9), "sm90": (9, 0)}

def compile_case(name, width, kv_dtype, page_size, q_dtype=torch.bfloat16, q_len=1, group=4,
                 hooks=False, window_left=-1):
    cap = CAPABILITY[name]
    arch = arch_for_capability(cap)
    config = decode.CONFIGS[(name, width)]
    block_n, aligned = decode.key_tile(config, page_size)
    heads_kv, batch = 2, 2
    heads_q = heads_kv * group
    q = torch.empty(batch * q_len, heads_q, width, dtype=q_dtype)
    k = torch.empty(64, page_size, heads_kv, width, dtype=kv_dtype)
    v = torch.empty(64, page_size, heads_kv, width, dtype=kv_dtype)
    block_table = torch.zeros(batch, 4096 // page_size, dtype=torch.int32)
    lens = torch.tensor([3000, 1000], dtype=torch.int32)
    rows = decode.rows_per_program(config, q_len * group)
    plan = split_kv.make_decode_plan([3000, 1000], num_q_heads=heads_q, num_kv_heads=heads_kv,
        q_len=q_len, page_size=page_size, head_dim=width, head_dim_v=width, kv_dtype=kv_dtype,
        window_left=window_left, config=config, block_n=block_n, page_aligned=aligned,
        rows_per_program=rows, arch=arch, num_sms=10**4, device="cpu")
    assert plan.num_slots > 0
    out = torch.empty(batch * q_len, heads_q, width, dtype=torch.bfloat16)
    lse = torch.empty(heads_q, batch * q_len)
    fp8 = kv_dtype.itemsize == 1
    descales = dict(k_descale=torch.ones(batch, heads_kv), v_descale=torch.ones(())) if fp8 else {}
    if q_dtype.itemsize == 1:
        descales["q_descale"] = torch.ones(batch, heads_q)
    extra = (dict(score_mod=softcap_only, mask_mod=keep_last_keys, mod_args=(30.0, 100))
             if hooks else {})
    launches = decode.decode_launches(q, k, v, block_table, lens, False, None, out, lse, plan,
        softmax_scale=0.1, window_left=window_left, window_right=0, arch=arch, **descales, **extra)
    result = []
    for launch in launches:
        c = cross_compile(launch, cap[0] * 10 + cap[1])
        count = lambda pattern: len(re.findall(pattern, c.ptx))
        result.append({"arch": name, "width": width, "kv": str(kv_dtype), "q": str(q_dtype),
                       "page": page_size, "block_m": launch.constexprs.get("BLOCK_M"),
                       "block_n": launch.constexprs.get("BLOCK_N"),
                       "config_block_n": config.block_n,
                       "aligned": launch.constexprs.get("PAGE_ALIGNED"), "hooks": hooks,
                       "programs_per_sm": split_kv.programs_per_sm(
                           config, arch, rows, block_n, width, width, kv_dtype.itemsize),

                       "kernel": launch.kernel.fn.__name__ if hasattr(launch.kernel, "fn")
                                 else launch.kernel.__name__,
                       "shared": c.shared_bytes, "limit": arch.shared_memory_bytes,
                       "regs": c.num_regs, "mma_sync": count(r"mma\.sync"),
                       "wgmma": count(r"wgmma\.mma_async"), "cp_async": count(r"cp\.async\.c[ag]"),
                       "local": count(r"ld\.local|st\.local"),
                       "overlapped_waits": count(r"cp\.async\.wait_group\s+[1-9]"),
                       "ld_shared_b8": count(r"ld\.shared\.[bu]8")})
    return result

rows = []
for (name, width), config in decode.CONFIGS.items():
    if name == "cpu":
        continue
    rows += compile_case(name, width, torch.bfloat16, 64)
    rows += compile_case(name, width, torch.float8_e4m3fn, 16)
    if width == 128:   # single-key pages: each key row gathers its page
        rows += compile_case(name, width, torch.float8_e5m2, 1, q_dtype=torch.float16)
    if width == 256:   # the largest row block at the widest head: the most registers
        rows += compile_case(name, width, torch.bfloat16, 16, q_len=8, group=8)
rows += compile_case("sm90", 128, torch.bfloat16, 16, hooks=True, window_left=500)
rows += compile_case("sm90", 128, torch.float8_e4m3fn, 16, q_dtype=torch.float8_e4m3fn)
rows += compile_case("sm89", 128, torch.float8_e4m3fn, 16, q_dtype=torch.float8_e5m2)
rows += compile_case("sm89", 128, torch.float8_e5m2, 16)
print(json.dumps({"rows": rows}))
'''


@pytest.fixture(scope="module")
def compiled():
    return run_without_interpreter(CHILD)


def partial_rows(compiled):
    return [row for row in compiled["rows"] if row["kernel"] == "decode_partial_kernel"]


def test_every_config_fits_its_chip(compiled):
    assert len(partial_rows(compiled)) == 9 * 2 + 3 + 3 + 4
    for row in compiled["rows"]:
        assert row["shared"] <= row["limit"], row


def test_the_programs_a_plan_aims_at_fit_an_sm(compiled):
    """Split-KV sizes its work for programs_per_sm programs on each SM (split_kv.py):
    that many must fit the SM's shared memory (1 KB of each block is reserved), or the plan
    counts on bandwidth that never arrives."""
    sm_bytes = {"sm80": 164 * 1024, "sm89": 100 * 1024, "sm90": 228 * 1024}
    for row in partial_rows(compiled):
        assert row["programs_per_sm"] * (row["shared"] + 1024) <= sm_bytes[row["arch"]], row


def test_no_register_spills(compiled):
    for row in compiled["rows"]:
        assert row["local"] == 0, row


def test_page_tiles_as_planned(compiled):
    """A page-aligned tile lies inside one page; pages of 64 keys hold whole tiles; smaller
    or single-key pages gather each key's page at the config's full tile width."""
    for row in partial_rows(compiled):
        if row["aligned"]:
            assert row["page"] % row["block_n"] == 0, row
        else:
            assert row["block_n"] == row["config_block_n"] > row["page"], row
        if row["page"] == 64:
            assert row["aligned"], row


def test_k_and_v_tiles_load_while_the_previous_ones_are_used(compiled):
    """Page ids are loaded a tile ahead (kernels/decode.py), so the pipeliner double-buffers
    K and V: some cp.async wait leaves groups in flight. (With the page-id load feeding the
    K/V addresses in the same iteration, every wait was wait_group 0: load, then compute.)"""
    for row in partial_rows(compiled):
        assert row["overlapped_waits"] > 0, row


def test_fp8_cache_streams_asynchronously(compiled):
    """An FP8 cache must reach shared memory through cp.async like a 16-bit one (not loaded to
    registers and stored by hand, which stalls every tile)."""
    for row in partial_rows(compiled):
        if row["kv"] != "torch.bfloat16" and row["arch"] != "sm80":
            assert row["cp_async"] > 0, row
        assert row["mma_sync"] > 0 or row["wgmma"] > 0, row
