"""Compile every quantization-kernel config for its chip, without a GPU.

Proves each row of tileattn/kernels/quantize.py's config table compiles for its chip with the
heaviest variant it runs (rotation + smoothing statistics, rotation + smoothing + lse offsets),
fits shared memory, does not spill, and rotates on tensor cores; and that the variants the
others take (a tile's own scale, K-major e5m2 V, fp32 input split into two bf16 parts,
a padded head dim) compile and do not spill either.
"""

import pytest

from .compile_helpers import run_without_interpreter

CHILD = r'''
import json, os, re, subprocess, tempfile, torch, triton
from tileattn import fp8
from tileattn.arch import arch_for_capability
from tileattn.kernels import quantize
from tileattn.kernels.compile import cross_compile

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
CAPABILITY = {"sm89": (8, 9), "sm90": (9, 0)}
BATCH, SEQLEN, HEADS = 2, 300, 4     # 3 tiles, the last one partial

def resources(compiled, limit):
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.cubin); f.flush()
        usage = subprocess.run([CUOBJDUMP, "-res-usage", f.name], capture_output=True, text=True).stdout
    ptx = compiled.ptx
    return {"shared": compiled.shared_bytes, "limit": limit,
            "stack": int(re.search(r"STACK:(\d+)", usage).group(1)),
            "mma": len(re.findall(r"mma\.sync|wgmma\.mma_async", ptx)),
            "fp8_cvt": len(re.findall(r"cvt\.rn\.satfinite\.e[45]m[23]x2", ptx)),
            "vector_stores": len(re.findall(r"st\.global\.v[24]", ptx))}

def compile_case(name, head_dim, in_dtype=torch.bfloat16, out_dtype=torch.float8_e4m3fn,
                 rotate=True, smooth=True, own_amax=False, k_major=False, seqlen=SEQLEN):
    cap = CAPABILITY[name]
    arch = arch_for_capability(cap)
    config = quantize.config_for(arch, head_dim)
    tiles = quantize.num_tiles(seqlen)
    x = torch.empty(BATCH, seqlen, HEADS, head_dim, dtype=in_dtype)
    rotation = fp8.rotation_operand(head_dim, in_dtype, torch.device("cpu")) if rotate else None
    tile_amax = torch.empty(BATCH, HEADS, tiles)
    columns = tuple(torch.empty(BATCH, HEADS, tiles, head_dim) for _ in range(3)) if smooth else None
    stats = cross_compile(quantize.tile_stats_launch(x, rotation, tile_amax, columns, config),
                          cap[0] * 10 + cap[1])
    if k_major:
        out = torch.empty(BATCH, HEADS, head_dim, seqlen, dtype=out_dtype).permute(0, 3, 1, 2)
    else:
        out = torch.empty(BATCH, seqlen, HEADS, head_dim, dtype=out_dtype)
    mean = torch.empty(BATCH, HEADS, head_dim) if smooth else None
    scale = None if own_amax else torch.empty(BATCH, HEADS, tiles)
    descale = torch.empty(BATCH, HEADS, tiles) if own_amax else None
    key_mean = torch.empty(BATCH, HEADS // 2, head_dim) if smooth else None
    row_dot = torch.empty(BATCH, HEADS, seqlen) if smooth else None
    cast = cross_compile(quantize.cast_launch(
        x, rotation, mean, scale, out, descale, descale, key_mean, row_dot,
        torch.finfo(out_dtype).max, 0.125, 1 / 64, config), cap[0] * 10 + cap[1])
    return {"stats": resources(stats, arch.shared_memory_bytes),
            "cast": resources(cast, arch.shared_memory_bytes)}

rows = {f"{name}-D{width}": compile_case(name, width)
        for (name, width) in quantize.CONFIGS if name != "cpu"}
variants = {
    "own-amax-sm90": compile_case("sm90", 128, rotate=False, smooth=False, own_amax=True),
    "k-major-e5m2-sm89": compile_case("sm89", 128, torch.float16, torch.float8_e5m2,
                                      rotate=False, smooth=False, k_major=True),
    "fp32-sm89": compile_case("sm89", 128, torch.float32),
    "fp32-sm90": compile_case("sm90", 64, torch.float32),
    "padded-96-sm90": compile_case("sm90", 96, own_amax=True),
    # seqlen a multiple of 16: K-major rows are 16-byte aligned
    "k-major-aligned-sm90": compile_case("sm90", 128, rotate=False, smooth=False, k_major=True,
                                         seqlen=1024),
}
print(json.dumps({"rows": rows, "variants": variants}))
'''


@pytest.fixture(scope="module")
def compiled():
    return run_without_interpreter(CHILD)


# Spill stacks measured and accepted: sm90 D=256's statistics with smoothing hold a [128, 256]
# fp32 tile beside three column reductions (40 B; 16 warps, other chunks, sub-tiles and other
# orders of the reductions spilled as much or more).
ACCEPTED_STACK = {("sm90-D256", "stats"): 40}


def _check(name, case, rotate=True):
    for kernel in ("stats", "cast"):
        row = case[kernel]
        assert row["shared"] <= row["limit"], (name, kernel, row)
        assert row["stack"] <= ACCEPTED_STACK.get((name, kernel), 0), (name, kernel, row)
        if rotate:
            assert row["mma"] > 0, (name, kernel, row)      # the rotation runs on tensor cores
    assert case["cast"]["fp8_cvt"] > 0, (name, case)         # hardware FP8 conversion


def test_every_quantize_config_compiles_fits_and_does_not_spill(compiled):
    assert len(compiled["rows"]) == 6
    for name, case in compiled["rows"].items():
        _check(name, case)


def test_quantize_variants_compile(compiled):
    variants = compiled["variants"]
    for name, case in variants.items():
        _check(name, case, rotate=not name.startswith(("own-amax", "k-major")))
    assert variants["own-amax-sm90"]["cast"]["mma"] == 0
    # The cast kernel writes K-major V in 16-byte vectors where rows are aligned (the layout is
    # converted through shared memory), not byte by byte.
    assert variants["k-major-aligned-sm90"]["cast"]["vector_stores"] > 0
