"""Compile the Hopper Gluon attention kernel for sm90 without a GPU, for every config row.

Proves each row fits 227 KB of shared memory, that the kernel runs on wgmma fed by TMA, that
P stays in registers (no shared-memory stores inside the key loop), that nothing spills, and
that the ping-pong consumers are separate partitions (no barrier spans both warpgroups). Also
compiles the padded head dims (96, 192), Dv != D, softcap, left windows, and sizes of 1, which Triton folds
into constants (the kernel-state aggregates then hold constexprs instead of tensors).
"""

import pytest

from .compile_helpers import run_without_interpreter

CHILD = r'''
import dataclasses, json, os, re, subprocess, tempfile, torch, triton
from tileattn.kernels.attention import sm90
from tileattn.kernels.compile import cross_compile_sm90

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
from tileattn.kernels.attention.layout import k_major_width
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "e4m3": torch.float8_e4m3fn,
          "e5m2": torch.float8_e5m2}

def key_loops(sass):
    """The SASS of the innermost loops (backward branches) that hold a wgmma (HGMMA, or QGMMA
    for FP8)."""
    lines = [(int(m.group(1), 16), m.group(2)) for m in
             re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    loops = []
    for address, text in lines:
        target = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", text)
        if target and int(target.group(1), 16) < address:
            loops.append((int(target.group(1), 16), address))
    inner = [(a, b) for a, b in loops if not any(a < c and d < b for c, d in loops)]
    bodies = ["\n".join(t for x, t in lines if a <= x <= b) for a, b in inner]
    return [body for body in bodies if "GMMA" in body]

def local_in_key_loops(sass):
    """Local-memory loads and stores (spills) inside the key loops."""
    return sum(len(re.findall(r"\b(?:LDL|STL)\b", body)) for body in key_loops(sass))

def compile_case(dtype_name, head_dim, causal, split=None, head_dim_v=None, ones=False,
                 softcap=0.0, window_left=-1, grouped=False, block_descales=False, queries=0,
                 lse=True):
    """grouped (FP8): V in grouped key order (layout.py), else natural order; block_descales
    (FP8): q's and k's per 128-row block, else per tensor; queries: the config row of a dense
    call of that many queries (sm90.config_for; 0: CONFIGS')."""
    dtype = DTYPES[dtype_name]
    fp8 = dtype_name in ("e4m3", "e5m2")
    head_dim_v = head_dim_v or head_dim
    # ones: one query, one key, one head, no lse (integer arguments folded to constants).
    sizes = (1, 1, 1, 1, 1) if ones else (2, 1000, 1024, 4, 2)
    batch, seqlen_q, seqlen_k, heads, kv_heads = sizes
    q = torch.empty(batch, seqlen_q, heads, head_dim, dtype=dtype)
    k = torch.empty(batch, seqlen_k, kv_heads, head_dim, dtype=dtype)
    v = torch.empty(batch, seqlen_k, kv_heads, head_dim_v, dtype=dtype)
    descales = {}
    if fp8:     # K-major V as fp8.k_major_copy makes it, descales per tensor
        v = torch.empty(batch, kv_heads, head_dim_v, k_major_width(seqlen_k), dtype=dtype)
        v = v[..., :seqlen_k].permute(0, 3, 1, 2)
        descales = {name: torch.ones(()) for name in ("q_descale", "k_descale", "v_descale")}
        if block_descales:
            descales["q_descale"] = torch.ones(batch, heads, -(-seqlen_q // 128))
            descales["k_descale"] = torch.ones(batch, kv_heads, -(-seqlen_k // 128))
    assert sm90.supports(q, k, v, causal)
    out = torch.empty(batch, seqlen_q, heads, head_dim_v,
                      dtype=torch.bfloat16 if fp8 else dtype)
    lse = None if ones or not lse else torch.empty(batch, heads, seqlen_q)
    config = sm90.config_for(head_dim, head_dim_v, fp8, queries)
    if split is not None:
        config = dataclasses.replace(config, split=split)
    launch = sm90.attention_sm90_launch(q, k, v, out, lse, 0.1, causal, softcap=softcap,
                                        window_left=window_left, config=config,
                                        num_programs=132, v_keys_grouped=grouped, **descales)
    c = cross_compile_sm90(launch, 90)
    ptx = c.asm["ptx"]
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(c.asm["cubin"]); f.flush()
        usage, sass = (subprocess.run([CUOBJDUMP, flag, f.name], capture_output=True,
                                      text=True).stdout for flag in ("-res-usage", "-sass"))
    return {"shared": c.metadata.shared, "wgmma": ptx.count("wgmma.mma_async"),
            "hgmma": sass.count("GMMA"), "tma": ptx.count("cp.async.bulk.tensor"),
            "stack": int(re.search(r"STACK:(\d+)", usage).group(1)),
            "local": len(re.findall(r"\b(LDL|STL)\b", sass)),
            "local_in_key_loops": local_in_key_loops(sass),
            "st_shared_in_loop": sum(len(re.findall(r"\bSTS", body))
                                     for body in key_loops(sass)),
            "partition_barriers": sorted(set(re.findall(r"bar\.sync\s+\d+, (\d+)", ptx))),
            "shfl_per_key_loop": [len(re.findall(r"\bSHFL", body)) for body in key_loops(sass)],
            "bar_sync_per_key_loop": [body.count("BAR.SYNC") for body in key_loops(sass)],
            "gmma_a_in_registers": [len(re.findall(r"GMMA\.\S+ R\d+, R\d+, gdesc", body))
                                    for body in key_loops(sass)],
            "gmma_per_key_loop": [len(re.findall(r"GMMA\.", body)) for body in key_loops(sass)],
            "row_sum_wgmma": len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n8k16", ptx)),
            "fadd_per_key_loop": [len(re.findall(r"\bFADD\b", body)) for body in key_loops(sass)],
            "q_in_registers": config.q_in_registers,
            "split": config.split, "block_m": config.block_m, "tanh": sass.count("MUFU.TANH"),
            "key_loops": len(key_loops(sass)),
            "wide_stores": sass.count("STG.E.128"), "tma_stores": sass.count("UTMASTG"),
            "consumers": config.block_m // 64 if config.split else 1,
            "padded_dim_v": max(16, 1 << (head_dim_v - 1).bit_length())}

def label(causal, split=None):
    return ("causal" if causal else "full") + ("" if split is None else
                                               "-pingpong" if split else "-lockstep")

rows = {}
for head_dim in sm90.CONFIGS:
    for name in ("bf16", "fp16"):
        for causal in (False, True):
            if name == "fp16" and head_dim != 128:
                continue  # same code as bf16 at the other widths
            rows[f"{name}-D{head_dim}-{label(causal)}"] = compile_case(name, head_dim, causal)
for split in (False, True):
    rows[f"bf16-D128-{label(True, split)}"] = compile_case("bf16", 128, True, split)
# The rows long calls take (LONG_QUERY_CONFIGS), with an lse and, causal, without.
long = {f"bf16-D{d}-{label(causal)}-long": compile_case("bf16", d, causal,
                                                       queries=sm90.LONG_QUERIES)
        for d in sm90.LONG_QUERY_CONFIGS for causal in (False, True)}
long.update({f"bf16-D{d}-causal-long-no-lse": compile_case("bf16", d, True,
                                                           queries=sm90.LONG_QUERIES, lse=False)
             for d in sm90.LONG_QUERY_CONFIGS})
# A left window on a long row: its window loop keeps the partial row sums too.
long.update({f"bf16-D{d}-causal-window-long": compile_case("bf16", d, True, window_left=1000,
                                                           queries=sm90.LONG_QUERIES)
             for d in sm90.LONG_QUERY_CONFIGS})
# The rows shorter dense calls take (SHORT_QUERY_CONFIGS).
short = {f"bf16-D{d}-{label(causal)}-short": compile_case("bf16", d, causal, queries=1000)
         for d in sm90.SHORT_QUERY_CONFIGS for causal in (False, True)}
# Head dims the tiles pad (96 -> 128, 192 -> 256) and Dv != D, on the rows config_for picks.
dims = {f"bf16-D{d}-Dv{dv}-{label(causal)}": compile_case("bf16", d, causal, head_dim_v=dv)
        for d, dv in ((192, 128), (96, 96), (192, 192), (64, 256))
        for causal in (False, True) if not (causal and (d, dv) in ((192, 192), (64, 256)))}
ones = {f"bf16-D128-ones-{label(True, split)}": compile_case("bf16", 128, True, split, ones=True)
        for split in (False, True)}
softcap = {f"bf16-D{d}-{label(causal, split)}-softcap": compile_case("bf16", d, causal, split,
                                                                      softcap=30.0)
           for d, causal, split in ((128, True, None), (128, False, False), (256, False, None))}
# Without an lse (the calls whose P row sums run on the tensor cores at D=128).
softcap.update({f"bf16-D{d}-{label(causal)}-softcap-no-lse": compile_case(
    "bf16", d, causal, softcap=30.0, lse=False) for d, causal in ((128, True), (256, False))})
# FP8: V K-major, in grouped or natural key order.
fp8 = {f"{name}-D{d}-{label(causal)}{'-block' if block else ''}-"
       f"{'grouped' if grouped else 'natural'}":
       compile_case(name, d, causal, grouped=grouped, block_descales=block)
       for name, d, causal, grouped, block in (
           ("e4m3", 128, False, True, False), ("e4m3", 128, True, True, False),
           ("e4m3", 128, False, False, False), ("e4m3", 256, True, True, False),
           ("e5m2", 128, False, True, False), ("e4m3", 128, True, True, True),
           ("e4m3", 256, False, True, True))}
window = {f"bf16-D{d}-{label(causal, split)}-window": compile_case("bf16", d, causal, split,
                                                                    window_left=1023)
          for d, causal, split in ((128, True, None), (128, True, False), (256, False, None))}

def compile_flex(head_dim, score, masked, block_size=(128, 128), document=False, bits=False):
    """flex_attention's launch on the Hopper kernel: a BlockMask's lists (masked) and/or an
    ALiBi score_mod, as ops/flex.py builds it. document: the mask is a document mask over
    captured ids instead of causal, its verdicts read as bits with bits (flex/mask_bits.py;
    their values, which a GPU computes, do not matter here)."""
    from torch.nn.attention.flex_attention import create_block_mask
    from tileattn.flex.block_mask import block_mask_tensors, largest_tile
    from tileattn.flex.tile_plan import tile_plan
    from tileattn.flex.translate import translate_mods
    batch, heads, seqlen = 2, 4, 1000
    slopes = torch.rand(heads)
    causal = lambda b, h, q, kv: q >= kv
    doc_ids = torch.arange(seqlen).repeat(batch, 1) // 300
    if document:
        causal = lambda b, h, q, kv: (doc_ids[b, q] == doc_ids[b, kv]) & (q >= kv)
    alibi = lambda s, b, h, q, kv: s - slopes[h] * (q - kv).abs()
    hooks = translate_mods(alibi if score else None, causal if masked else None,
                           device=torch.device("cpu"))
    config, plan, mask_bits = sm90.config_for(head_dim, head_dim), None, None
    if masked:
        mask = create_block_mask(causal, batch, 1, seqlen, seqlen, device="cpu",
                                 BLOCK_SIZE=block_size)
        lists = block_mask_tensors(mask, batch=batch, num_q_heads=heads, seqlen_q=seqlen,
                                   seqlen_k=seqlen, device=torch.device("cpu"))
        config = dataclasses.replace(config, block_n=largest_tile(block_size[1], config.block_n))
        plan = tile_plan(lists, batch=batch, num_q_heads=heads, seqlen_q=seqlen,
                         seqlen_k=seqlen, block_m=128, num_programs=132,
                         kv_bytes_per_key=4 * head_dim)
        if bits:
            from tileattn.flex.mask_bits import MaskBits
            mask_bits = MaskBits(torch.zeros(20, block_size[0], block_size[1] // 128, 4,
                                             dtype=torch.int32),
                                 torch.zeros(plan.tile_lists.shape[0], dtype=torch.int32))
    q = torch.empty(batch, seqlen, heads, head_dim, dtype=torch.bfloat16)
    launch = sm90.attention_sm90_launch(q, q, q, torch.empty_like(q), torch.empty(batch, heads, seqlen),
                                        0.1, False, config=config, block_plan=plan,
                                        score_mod=hooks.score_mod, mask_mod=hooks.mask_mod,
                                        mod_args=hooks.mod_args, mask_bits=mask_bits)
    c = cross_compile_sm90(launch, 90)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(c.asm["cubin"]); f.flush()
        sass = subprocess.run([CUOBJDUMP, "-sass", f.name], capture_output=True, text=True).stdout
    ptx = c.asm["ptx"]
    loops = key_loops(sass)
    return {"shared": c.metadata.shared, "wgmma": ptx.count("wgmma.mma_async"),
            "hgmma": sass.count("HGMMA"), "tma": ptx.count("cp.async.bulk.tensor"),
            "key_loops": len(loops), "loop_sizes": [b.count("\n") + 1 for b in loops],
            "loop_loads": [len(re.findall(r"\bLDG\b", b)) for b in loops],
            "local_in_key_loops": local_in_key_loops(sass)}

def compile_varlen(head_dim, causal):
    """attention_varlen's launch: packed sequences of unequal lengths."""
    from tileattn.kernels.attention import fwd
    cu = torch.tensor([0, 100, 3100, 3617], dtype=torch.int32)
    q = torch.empty(3617, 8, head_dim, dtype=torch.bfloat16)
    k = torch.empty(3617, 2, head_dim, dtype=torch.bfloat16)
    sequences = fwd.Sequences(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=3000,
                              max_seqlen_k=3000, block_table=None)
    c = cross_compile_sm90(sm90.attention_sm90_launch(
        q, k, k, torch.empty_like(q), torch.empty(8, 3617), 0.1, causal, sequences=sequences), 90)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(c.asm["cubin"]); f.flush()
        usage, sass = (subprocess.run([CUOBJDUMP, flag, f.name], capture_output=True,
                                      text=True).stdout for flag in ("-res-usage", "-sass"))
    ptx = c.asm["ptx"]
    return {"shared": c.metadata.shared, "wgmma": ptx.count("wgmma.mma_async"),
            "tma": ptx.count("cp.async.bulk.tensor"),
            "stack": int(re.search(r"STACK:(\d+)", usage).group(1)),
            "local_in_key_loops": local_in_key_loops(sass)}

varlen = {f"D{d}-{label(causal)}": compile_varlen(d, causal)
          for d, causal in ((128, True), (128, False), (256, True))}
flex = {"D128-mask": compile_flex(128, False, True), "D128-alibi": compile_flex(128, True, False),
        "D128-alibi-mask": compile_flex(128, True, True),
        "D256-mask-256x128": compile_flex(256, False, True, (256, 128)),
        "D128-mask-128x64": compile_flex(128, False, True, (128, 64)),
        "D128-document-mask": compile_flex(128, False, True, document=True),
        "D128-document-bits-mask": compile_flex(128, False, True, document=True, bits=True)}
print(json.dumps({"rows": rows, "dims": dims, "ones": ones, "softcap": softcap,
                  "window": window, "flex": flex, "varlen": varlen, "fp8": fp8, "long": long,
                  "short": short}))
'''


@pytest.fixture(scope="module")
def compiled():
    return run_without_interpreter(CHILD)


# 16-bit rows: since the key loop carries P packed (Consumer.carried_p), ptxas keeps a few
# per-tile scalars on the stack in some rows (<= 24 bytes, stored once, loaded once a tile),
# outside the key loops.
TILE_SCALARS = {"stack": 24, "local": 20}


def _fits_and_runs_on_wgmma_tma(name, row, key_loops=True, stack=0, local=0):
    assert row["shared"] <= 227 * 1024, (name, row)
    assert row["wgmma"] > 0 and row["hgmma"] > 0 and row["tma"] > 0, (name, row)
    # No register spills, but for the per-tile scalars the callers allow (stack bytes, local
    # loads and stores), which SASS reading found outside the key loops.
    assert row["stack"] <= stack and row["local"] <= local, (name, {k: row[k] for k in ("stack", "local")})
    if key_loops:
        assert row["st_shared_in_loop"] == 0, (name, row)         # P stays in registers
    if row["split"]:
        # Each consumer warpgroup is its own partition: barriers span 128 threads, never
        # both warpgroups (256), so nothing forces them into lockstep.
        assert row["partition_barriers"] == ["128"], (name, row)
    else:
        assert "256" in row["partition_barriers"], (name, row)


def test_every_sm90_config_compiles_fits_and_uses_wgmma_tma(compiled):
    rows = compiled["rows"]
    assert len(rows) == 10
    assert rows["bf16-D128-causal-pingpong"]["split"]
    assert not rows["bf16-D128-causal-lockstep"]["split"]
    for name, row in rows.items():
        _fits_and_runs_on_wgmma_tma(name, row, **TILE_SCALARS)
        assert row["local_in_key_loops"] == 0, (name, row)
        _stores_o_whole(name, row)


def _stores_o_whole(name, row):
    """These dense calls (1024 keys) store O by TMA, one copy a consumer partition
    (Output.TMA_STORE), on two-consumer rows whose padded head dim allows; otherwise in
    16-byte pieces (Output.WIDE_STORE), not the accumulator layout's 4-byte ones."""
    from tileattn.kernels.attention import sm90
    two_consumers = row["split"] and row["block_m"] == 128
    if two_consumers and row["padded_dim_v"] <= sm90.TMA_STORE_MAX_DIM:
        assert row["tma_stores"] == row["consumers"] and row["wide_stores"] == 0, (name, row)
    else:
        assert row["wide_stores"] > 0 and row["tma_stores"] == 0, (name, row)


def test_q_in_registers_rows_feed_every_key_loop_wgmma_from_registers(compiled):
    """Rows with q_in_registers read Q's rows into registers once a tile: in their key loops
    every wgmma (S = Q K^T and O += P V) takes its A operand from registers; without it, only
    P V does."""
    rows = {**compiled["rows"], **compiled["short"], **compiled["long"]}
    with_q = [name for name, row in rows.items() if row["q_in_registers"]]
    assert {"bf16-D128-causal", "bf16-D64-full", "bf16-D64-causal-short"} <= set(with_q)
    for name, row in rows.items():
        from_registers = row["gmma_a_in_registers"]
        total = row["gmma_per_key_loop"]
        assert total and all(t > 0 for t in total), (name, row)
        if row["q_in_registers"]:
            assert from_registers == total, (name, row)
        else:
            assert all(0 < r < t for r, t in zip(from_registers, total)), (name, row)


def test_long_call_rows_compile_on_three_consumer_warpgroups(compiled):
    """LONG_QUERY_CONFIGS (head dim 64, 192-query tiles): three ping-pong consumer partitions of
    128 threads each (three copies of the key loops), 160 registers each without a spill in a
    key loop; per-tile scalars wait on the stack (at most 32 bytes, 28 loads and stores).
    Causal calls without an lse sum P's rows on the tensor cores (causal_row_sums: m64n8
    wgmmas, no key loop adds P up on FADDs); the others keep partial row sums
    (partial_row_sums): their key loops shuffle for the row max only, 2 a row, where the
    128-query rows' reduce the sums too."""
    rows = compiled["long"]
    assert len(rows) == 4
    two_consumers = compiled["rows"]["bf16-D64-causal"]
    for name, row in rows.items():
        assert row["block_m"] == 192 and row["split"], (name, row)
        _fits_and_runs_on_wgmma_tma(name, row, stack=32, local=28)
        assert row["local_in_key_loops"] == 0, (name, row)
        _stores_o_whole(name, row)
        if name.endswith("-no-lse"):
            assert row["row_sum_wgmma"] > 0, name
            assert max(row["fadd_per_key_loop"]) < 16, (name, row["fadd_per_key_loop"])
        else:
            assert row["row_sum_wgmma"] == 0, name
            assert set(row["shfl_per_key_loop"]) == {4}, (name, row["shfl_per_key_loop"])
    assert set(two_consumers["shfl_per_key_loop"]) == {8}, two_consumers["shfl_per_key_loop"]
    assert rows["bf16-D64-causal-long"]["key_loops"] == 3 * two_consumers["key_loops"] // 2


def test_short_dense_call_rows_compile_fit_and_do_not_spill(compiled):
    """SHORT_QUERY_CONFIGS fit, run on wgmma and TMA and do not spill; its causal calls keep
    partial row sums (partial_row_sums="causal": the key loops shuffle for the row max only, 2
    a row), the others reduce the sums at every step too."""
    rows = compiled["short"]
    assert len(rows) == 2
    for name, row in rows.items():
        _fits_and_runs_on_wgmma_tma(name, row, **TILE_SCALARS)
        assert row["local_in_key_loops"] == 0, (name, row)
        _stores_o_whole(name, row)
    assert set(rows["bf16-D64-causal-short"]["shfl_per_key_loop"]) == {4}, rows
    assert set(rows["bf16-D64-full-short"]["shfl_per_key_loop"]) == {8}, rows


def test_dense_calls_take_the_long_and_short_rows_where_there_is_one():
    from tileattn.kernels.attention import sm90
    long = sm90.LONG_QUERIES
    assert sm90.config_for(64, 64, False, long) is sm90.LONG_QUERY_CONFIGS[64]
    assert sm90.config_for(64, 64, False, long - 1) is sm90.SHORT_QUERY_CONFIGS[64]
    assert sm90.config_for(64, 64, False, 1) is sm90.SHORT_QUERY_CONFIGS[64]
    assert sm90.config_for(128, 128, False, long - 1) is sm90.CONFIGS[128]
    assert sm90.config_for(64, 64, True, 1) is sm90.FP8_CONFIGS[64]
    assert sm90.config_for(64, 64, False) is sm90.CONFIGS[64]     # packed, block lists
    assert sm90.config_for(64, 64, True, long) is sm90.FP8_CONFIGS[64]
    assert sm90.config_for(128, 128, False, long) is sm90.CONFIGS[128]
    assert sm90.config_for(64, 64, False, long).block_m % 64 == 0


def test_row_sums_mode_per_call():
    """Tensor-core row sums for 16-bit calls without an lse that softcap at
    SOFTCAP_ROW_SUM_DIMS or are causal on a causal_row_sums row; partial sums for the others
    that their row's partial_row_sums takes; FP8 and every other call reduce the sums at each
    step."""
    from tileattn.kernels.attention import sm90
    from tileattn.kernels.attention.sm90_state import (ROW_SUMS_MMA, ROW_SUMS_PARTIAL,
                                                       ROW_SUMS_REDUCED)
    mma, partial, reduced = ROW_SUMS_MMA.value, ROW_SUMS_PARTIAL.value, ROW_SUMS_REDUCED.value
    mode = sm90.row_sums_mode
    long, d128, d256 = sm90.LONG_QUERY_CONFIGS[64], sm90.CONFIGS[128], sm90.CONFIGS[256]
    # (config, 16-bit, lse, causal, softcap, padded dim) -> mode
    assert mode(long, True, False, True, False, 64) == mma
    assert mode(long, True, True, True, False, 64) == partial
    assert mode(long, True, False, False, False, 64) == partial
    assert mode(long, True, False, False, True, 64) == partial
    short = sm90.SHORT_QUERY_CONFIGS[64]        # partial sums for causal calls only
    assert mode(short, True, False, True, False, 64) == partial
    assert mode(short, True, True, True, False, 64) == partial
    assert mode(short, True, False, False, False, 64) == reduced
    assert mode(sm90.CONFIGS[64], True, False, True, False, 64) == reduced
    assert mode(d128, True, False, False, True, 128) == mma
    assert mode(d128, True, True, False, True, 128) == reduced
    assert mode(d128, True, False, True, False, 128) == reduced
    assert mode(d256, True, False, True, True, 256) == reduced
    assert mode(sm90.FP8_CONFIGS[128], False, False, True, True, 128) == reduced
    assert len({mma, partial, reduced}) == 3


def test_padded_and_unequal_head_dims_compile_and_fit(compiled):
    """96/192 (padded to 128/256 by TMA zero-fill) and Dv != D: each fits 227 KB on the config
    row of its larger padded dim, runs on wgmma fed by TMA and does not spill."""
    dims = compiled["dims"]
    assert len(dims) == 6
    for name, row in dims.items():
        _fits_and_runs_on_wgmma_tma(name, row, **TILE_SCALARS)
        assert row["local_in_key_loops"] == 0, (name, row)


def test_softcap_compiles_fits_and_does_not_spill(compiled):
    """softcap > 0 adds a tanh (the hardware's tanh.approx) per score before the masks: every
    row still fits, runs on wgmma and TMA, keeps P in registers and does not spill. Without an
    lse at padded head dim 128 its P's row sums are P @ 1 on the tensor cores
    (sm90.SOFTCAP_ROW_SUM_DIMS): m64n8 wgmmas, and no key loop adds P up on FADDs (a 128-key
    block has 64 scores a thread); with an lse, or at 256, they stay on FADDs."""
    assert len(compiled["softcap"]) == 5
    for name, row in compiled["softcap"].items():
        _fits_and_runs_on_wgmma_tma(name, row)
        assert row["tanh"] > 0, name
        if "-D128-" in name and name.endswith("-no-lse"):
            assert row["row_sum_wgmma"] > 0, name
            assert max(row["fadd_per_key_loop"]) < 16, (name, row["fadd_per_key_loop"])
        else:
            assert row["row_sum_wgmma"] == 0, name
    # Without softcap the sums stay on FADDs (the small wgmma measured slower there).
    for name, row in compiled["rows"].items():
        assert row["row_sum_wgmma"] == 0, name


def test_fp8_compiles_fits_and_grouped_v_keys_leave_p_unshuffled(compiled):
    """FP8 (K-major V, QGMMA; descales per tensor or per 128-row block): every row fits, runs
    on wgmma and TMA and keeps P in registers. Nothing spills at D=128; at D=256 (128-key
    blocks: S, the carried fp32 P and O fill the registers) per-tile scalars wait on the stack
    (at most 96 bytes, 64 loads and stores, with block descales), none inside a key loop. With V in grouped key
    order, P's conversion to the 8-bit A operand is a
    register renaming: a key loop's only shuffles are the row max and sum reductions (2 a
    row, over the 4 threads of a quad: 8), where natural order needs more."""
    rows = compiled["fp8"]
    assert len(rows) == 7
    for name, row in rows.items():
        stack, local = (96, 64) if "-D256-" in name else (0, 0)
        _fits_and_runs_on_wgmma_tma(name, row, stack=stack, local=local)
        assert row["local_in_key_loops"] == 0, (name, row)
        _stores_o_whole(name, row)      # O is bf16
        if name.endswith("grouped"):
            assert row["shfl_per_key_loop"] and set(row["shfl_per_key_loop"]) == {8}, (name, row)
    natural = rows["e4m3-D128-full-natural"]["shfl_per_key_loop"]
    assert natural and min(natural) > 8, natural


def test_left_window_compiles_fits_and_does_not_spill(compiled):
    """A left window (window_size[0] >= 0: a third key loop for the blocks crossing its bound,
    the bound in the masks): every row fits, runs on wgmma and TMA and keeps P in registers.
    Per-tile scalars wait on the stack (at most 32 bytes, 26 loads and stores, D=256 with the
    16-byte epilogue; all outside the key loops in the SASS)."""
    assert len(compiled["window"]) == 3
    for name, row in compiled["window"].items():
        _fits_and_runs_on_wgmma_tma(name, row, stack=32, local=26)


def test_sizes_of_one_compile(compiled):
    """Every integer argument 1 and no lse: Triton folds them into constants, which the
    kernel-state aggregates must hold as constexprs (gluon_common.Scalar). (The first-to-last
    wgmma span of this PTX also holds a warp-specialization store, so the P-in-registers check
    is left to the other rows, whose key loops are the same code.)"""
    for name, row in compiled["ones"].items():
        _fits_and_runs_on_wgmma_tma(name, row, key_loops=False)


def test_flex_block_lists_and_hooks_compile_and_fit(compiled):
    """flex_attention on the Hopper kernel: block lists (partial steps with the mask hook, full
    ones without), a score hook, both, a 256-query mask block at D=256 and 64-key mask blocks
    at D=128. Each fits and runs on wgmma and TMA.
    Spills inside key loops: none with the mask hook alone; the ALiBi score hook keeps
    per-tile scalars on the stack in one loop (since the 16-byte epilogue a load and a store,
    with Q in registers two of each), with block lists a few in two loops (L1 hits, bounded).
    The document mask over captured ids, as a hook and as bits."""
    flex = compiled["flex"]
    assert len(flex) == 7
    for name, row in flex.items():
        assert row["shared"] <= 227 * 1024, (name, row)
        assert row["wgmma"] > 0 and row["hgmma"] > 0 and row["tma"] > 0, (name, row)
        # Two key loops per consumer without block lists, three with them.
        assert row["key_loops"] == (6 if "mask" in name else 4), (name, row)
        # The document hook (ids loaded for 32 columns and 2 rows a block) spills in its
        # partial-block loops; read as bits it does not.
        allowed = {"D128-alibi-mask": 12, "D128-alibi": 4, "D128-document-mask": 80}.get(name, 0)
        assert row["local_in_key_loops"] <= allowed, (name, row)


def test_document_mask_read_as_bits_costs_a_bit_test_a_score(compiled):
    """A mask_mod over captured ids (the document mask) read as bits (flex/mask_bits.py): each
    partial-block loop loads one word a row a thread (2 loads: the hook loads the ids of its
    32 columns and 2 rows) and comes out shorter than the hook's loop; the other loops grow
    none."""
    hook, bits = (compiled["flex"][name] for name in ("D128-document-mask",
                                                      "D128-document-bits-mask"))
    # Loops per consumer: partial blocks, full blocks, the full block crossing the end.
    partial = [0, 3]
    assert [bits["loop_loads"][i] for i in partial] == [2, 2], bits
    assert all(hook["loop_loads"][i] > 8 for i in partial), hook
    assert all(bits["loop_sizes"][i] < 0.8 * hook["loop_sizes"][i] for i in partial), (hook, bits)
    assert all(bits["loop_sizes"][i] <= hook["loop_sizes"][i] for i in (1, 2, 4, 5)), (hook, bits)


def test_varlen_compiles_fits_and_does_not_spill(compiled):
    """Packed sequences (per-tile offsets and lengths from cu_seqlens, tiles past a sequence's
    end skipped): fits, runs on wgmma fed by TMA, spills nothing inside the key loops (per-tile
    scalars on the stack: TILE_SCALARS)."""
    assert len(compiled["varlen"]) == 3
    for name, row in compiled["varlen"].items():
        assert row["shared"] <= 227 * 1024 and row["wgmma"] > 0 and row["tma"] > 0, (name, row)
        assert row["stack"] <= TILE_SCALARS["stack"], (name, row)
        assert row["local_in_key_loops"] == 0, (name, row)


def test_o_leaves_by_tma_on_short_dense_16_bit_calls_only():
    """Output.TMA_STORE's descriptor (sm90._out_descriptor): dense calls of at most
    TMA_STORE_MAX_KEYS keys, 16-bit out, two-consumer rows, padded head dims up to
    TMA_STORE_MAX_DIM, strides TMA can take; every other call stores from registers."""
    import torch
    from tileattn.kernels.attention import sm90

    def o_desc(head_dim=128, seqlen_k=1024, out_dtype=torch.bfloat16, out=None, queries=1000):
        q = torch.empty(2, queries, 4, head_dim, dtype=torch.bfloat16)
        k = torch.empty(2, seqlen_k, 2, head_dim, dtype=torch.bfloat16)
        out = torch.empty(2, queries, 4, head_dim, dtype=out_dtype) if out is None else out
        launch = sm90.attention_sm90_launch(q, k, k, out, None, 0.1, True, num_programs=132)
        return launch.args["o_desc"]

    limit = sm90.TMA_STORE_MAX_KEYS
    desc = o_desc()
    assert desc is not None and list(desc.block_shape) == [1, 1, 64, 128]
    assert list(desc.shape) == [2, 4, 1000, 128]          # rows and columns past out clip
    assert o_desc(head_dim=96) is not None                # padded to 128; stores clip at 96
    assert o_desc(seqlen_k=limit) is not None and o_desc(seqlen_k=limit + 1) is None
    assert o_desc(out_dtype=torch.float32) is None
    assert o_desc(head_dim=256) is None
    assert o_desc(queries=sm90.LONG_QUERIES, head_dim=64) is None   # three consumers
    # A head stride TMA cannot take (not a multiple of 16 bytes).
    odd = torch.empty(2, 1000, 4 * 128 + 1, dtype=torch.bfloat16)[..., :512].view(2, 1000, 4, 128)
    assert o_desc(out=odd) is None
