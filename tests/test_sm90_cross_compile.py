"""Compile the Hopper Gluon kernel for sm90 without a GPU, for every config row.

Proves each row fits 227 KB of shared memory, that the kernel runs on wgmma fed by TMA, that
P stays in registers (no shared-memory stores inside the key loop) and that no row spills.
"""

import pytest

from .compile_helpers import run_without_interpreter

CHILD = r'''
import dataclasses, json, re, subprocess, tempfile, torch
from tileattn.kernels.attention import sm90
supports = sm90.supports
from tileattn.kernels.compile import cross_compile_sm90
from tileattn.fp8 import prepare_v
import triton, os

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "e4m3": torch.float8_e4m3fn,
          "e5m2": torch.float8_e5m2}

def compile_case(dtype_name, head_dim, causal, split=None, head_dim_v=None):
    dtype = DTYPES[dtype_name]
    head_dim_v = head_dim_v or head_dim
    # seqlen_k a multiple of 16: K-major FP8 V has seqlen_k as a TMA stride.
    q = torch.empty(2, 1000, 4, head_dim, dtype=dtype)
    k = torch.empty(2, 1024, 2, head_dim, dtype=dtype)
    v = torch.empty(2, 1024, 2, head_dim_v, dtype=dtype)
    assert supports(q, k, v, causal)
    out = torch.empty(2, 1000, 4, head_dim_v, dtype=torch.bfloat16)
    lse = torch.empty(2, 4, 1000)
    descale = torch.ones(()) if dtype.itemsize == 1 else None
    config = sm90.config_for(head_dim, head_dim_v, dtype.itemsize == 1)
    if split is not None:
        config = dataclasses.replace(config, split=split)
    launch = sm90.attention_sm90_launch(q, k, v, out, lse, descale, descale, descale, 0.1, causal,
                                        config=config, num_programs=132)
    c = cross_compile_sm90(launch, 90)
    ptx = c.asm["ptx"]
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(c.asm["cubin"]); f.flush()
        usage = subprocess.run([CUOBJDUMP, "-res-usage", f.name], capture_output=True, text=True).stdout
    stack = int(re.search(r"STACK:(\d+)", usage).group(1))
    # The key loops: between the first and last wgmma of the consumer.
    first, last = ptx.find("wgmma.mma_async"), ptx.rfind("wgmma.mma_async")
    return {"shared": c.metadata.shared, "wgmma": ptx.count("wgmma.mma_async"),
            "tma": ptx.count("cp.async.bulk.tensor"), "stack": stack,
            "st_shared_in_loop": len(re.findall(r"st\.shared", ptx[first:last])),
            "mixed_fp8": ptx.count(".e4m3.e5m2"), "shfl": ptx.count("shfl.sync"),
            "prmt": ptx.count("prmt.b32"), "bytes_to_regs": ptx.count("cvt.u32.u16"),
            "partition_barriers": sorted(set(re.findall(r"bar\.sync\s+\d+, (\d+)", ptx)))}

rows = {}
for (head_dim, is_fp8) in sm90.CONFIGS:
    if is_fp8:
        continue  # FP8 runs the portable kernel (docs/design.md, "Kernel choice")
    for name in ("bf16", "fp16"):
        for causal in (False, True):
            if name in ("fp16", "e5m2") and head_dim != 128:
                continue  # same code as bf16 / e4m3 at the other widths
            rows[f"{name}-D{head_dim}-{'causal' if causal else 'full'}"] = compile_case(name, head_dim, causal)
for name in ("bf16",):
    for split in (False, True):
        rows[f"{name}-D128-causal-{'pingpong' if split else 'lockstep'}"] = compile_case(name, 128, True, split)
# Head dims the tiles pad (96 -> 128, 192 -> 256) and Dv != D, on the rows config_for picks.
dims = {f"{name}-D{d}-Dv{dv}-{'causal' if causal else 'full'}": compile_case(name, d, causal, head_dim_v=dv)
        for name in ("bf16",) for d, dv in ((192, 128), (96, 96), (192, 192), (64, 256))
        for causal in (False, True) if not (causal and (d, dv) in ((192, 192), (64, 256)))}
print(json.dumps({"rows": rows, "dims": dims}))
'''


@pytest.fixture(scope="module")
def compiled():
    return run_without_interpreter(CHILD)


def test_every_sm90_config_compiles_fits_and_uses_wgmma_tma(compiled):
    rows = compiled["rows"]
    assert len(rows) == 10
    for name, row in rows.items():
        assert row["shared"] <= 227 * 1024, (name, row)
        assert row["wgmma"] > 0 and row["tma"] > 0, (name, row)
        assert row["stack"] == 0, (name, row)              # no register spills
        assert row["st_shared_in_loop"] == 0, (name, row)  # P stays in registers
        if name.endswith("pingpong"):
            # Each consumer warpgroup is its own partition: barriers span 128 threads, never
            # both warpgroups (256), so nothing forces them into lockstep.
            assert row["partition_barriers"] == ["128"], (name, row)
        if name.endswith("lockstep"):
            assert "256" in row["partition_barriers"], (name, row)
        if name.startswith("e5m2"):
            assert row["mixed_fp8"] > 0, (name, row)       # P rounded to e4m3 against e5m2 V
        if name.startswith("e"):
            # FP8 P is packed where it is made and consumed in the same key-loop iteration: no
            # byte of it is widened to a register of its own to be repacked (a loop-carried
            # FP8 P was: 192 cvt.u32.u16 + 384 prmt at D=128; _attend_tile).
            assert row["bytes_to_regs"] == 0, (name, row)


def test_padded_and_unequal_head_dims_compile_and_fit(compiled):
    """96/192 (padded to 128/256 by TMA zero-fill) and Dv != D: each fits 227 KB on the config
    row of its larger padded dim, runs on wgmma fed by TMA and does not spill."""
    dims = compiled["dims"]
    assert len(dims) == 6
    for name, row in dims.items():
        assert row["shared"] <= 227 * 1024, (name, row)
        assert row["wgmma"] > 0 and row["tma"] > 0, (name, row)
        assert row["stack"] == 0 and row["st_shared_in_loop"] == 0, (name, row)
