"""Compile the Hopper Gluon backward kernels (kernels/attention/sm90_bwd.py: dK/dV and dQ) for
sm90 without a GPU and check which calls the backward sends to them.

Proves every table row fits the SM's shared memory with its TMA ring, runs its products on
wgmma (HGMMA in the SASS) fed by TMA, and spills at most a few bytes (ptxas: no local
memory beyond a handful of loads and stores), for causal and not, fp16, a padded head dim (96)
and Dv != D. The dispatch half runs in the test's own process: dispatch asks for the Gluon
kernels on Hopper, and the backward runs them exactly where gluon_applies() and their
tables say.
"""

import pytest
import torch

from tileattn import dispatch
from tileattn.arch import arch_for_capability
from tileattn.kernels.attention import bwd, sm90_bwd, sm90_bwd_fused

from .compile_helpers import run_without_interpreter

CHILD = r'''
import json, os, re, subprocess, tempfile, torch, triton
from tileattn.kernels.attention import sm90_bwd, sm90_bwd_fused
from tileattn.kernels.compile import cross_compile_sm90

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")

def compile_case(kernel, head_dim, head_dim_v, causal, dtype):
    q = torch.empty(2, 1000, 4, head_dim, dtype=dtype)
    k = torch.empty(2, 1100, 2, head_dim, dtype=dtype)
    v = torch.empty(2, 1100, 2, head_dim_v, dtype=dtype)
    dout = torch.empty(2, 1000, 4, head_dim_v, dtype=dtype)
    lse, delta = torch.empty(2, 4, 1000), torch.empty(2, 4, 1000)
    assert sm90_bwd.supports(q, k, v, dout)
    if kernel == "dkdv":
        launch = sm90_bwd.dkdv_sm90_launch(q, k, v, dout, lse, delta, torch.empty_like(k),
                                           torch.empty_like(v), causal=causal, softmax_scale=0.1)
    else:
        launch = sm90_bwd.dq_sm90_launch(q, k, v, dout, lse, delta, torch.empty_like(q),
                                         causal=causal, softmax_scale=0.1)
    c = cross_compile_sm90(launch, 90)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(c.asm["cubin"]); f.flush()
        sass = subprocess.run([CUOBJDUMP, "-sass", f.name], capture_output=True, text=True).stdout
    return {"shared": c.metadata.shared, "hgmma": sass.count("HGMMA"),
            "tma": c.asm["ptx"].count("cp.async.bulk.tensor"),
            "local": len(re.findall(r"\b(?:LDL|STL)\b", sass))}

rows, fused = {}, {}
for kernel in ("dkdv", "dq"):
    for d, dv in ((128, 128), (96, 96), (128, 64)):
        for causal in (False, True):
            rows[f"{kernel}-bf16-D{d}-Dv{dv}-{'causal' if causal else 'full'}"] = compile_case(
                kernel, d, dv, causal, torch.bfloat16)
    rows[f"{kernel}-fp16-D128-Dv128-causal"] = compile_case(kernel, 128, 128, True, torch.float16)
for d, causal in ((128, False), (128, True), (96, True), (64, True), (64, False)):
    q = torch.empty(2, 1000, 4, d, dtype=torch.bfloat16)
    k = torch.empty(2, 1100, 2, d, dtype=torch.bfloat16)
    lse = torch.empty(2, 4, 1000)
    c = cross_compile_sm90(sm90_bwd_fused.fused_sm90_launch(
        q, k, k, q, lse, lse, torch.empty(q.shape), k, k, causal=causal, softmax_scale=0.1), 90)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(c.asm["cubin"]); f.flush()
        sass = subprocess.run([CUOBJDUMP, "-sass", f.name], capture_output=True, text=True).stdout
    fused[f"D{d}-{'causal' if causal else 'full'}"] = {
        "shared": c.metadata.shared, "hgmma": sass.count("HGMMA"),
        "reductions": c.asm["ptx"].count("cp.reduce.async.bulk.tensor"),
        "local": len(re.findall(r"\b(?:LDL|STL)\b", sass)),
        "setmaxnreg": c.asm["ptx"].count("setmaxnreg"),
        "thread_arrives": c.asm["ptx"].count("cp.async.mbarrier.arrive.noinc"),
        "register_a": len(re.findall(r"wgmma\.mma_async[^;]*\}, \{", c.asm["ptx"])),
        "dq_widths": sorted({int(n) for n in re.findall(
            r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k16", c.asm["ptx"])})}
q, k = torch.empty(2000, 4, 128, dtype=torch.bfloat16), torch.empty(2200, 2, 128, dtype=torch.bfloat16)
lse, cu = torch.empty(4, 2000), torch.tensor([0, 1000, 2000], dtype=torch.int32)
c = cross_compile_sm90(sm90_bwd_fused.fused_sm90_launch(
    q, k, k, q, lse, lse, torch.empty(q.shape), k, k, causal=True, softmax_scale=0.1,
    cu_seqlens_q=cu, cu_seqlens_k=cu + torch.tensor([0, 100, 200], dtype=torch.int32),
    max_seqlen_q=1000, max_seqlen_k=1100), 90)
with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
    f.write(c.asm["cubin"]); f.flush()
    sass = subprocess.run([CUOBJDUMP, "-sass", f.name], capture_output=True, text=True).stdout
fused["D128-packed"] = {
    "shared": c.metadata.shared, "hgmma": sass.count("HGMMA"),
    "reductions": c.asm["ptx"].count("cp.reduce.async.bulk.tensor"),
    "local": len(re.findall(r"\b(?:LDL|STL)\b", sass)), "setmaxnreg": c.asm["ptx"].count("setmaxnreg"),
    "thread_arrives": c.asm["ptx"].count("cp.async.mbarrier.arrive.noinc")}
# Dense calls run key block 0 first, storing its dQ tiles, then the rest adding to them.
parts = {}
for d, causal in ((128, False), (64, False)):
    q = torch.empty(2, 1000, 4, d, dtype=torch.bfloat16)
    k = torch.empty(2, 1100, 2, d, dtype=torch.bfloat16)
    lse = torch.empty(2, 4, 1000)
    c = cross_compile_sm90(sm90_bwd_fused.fused_sm90_launch(
        q, k, k, q, lse, lse, torch.empty(q.shape), k, k, causal=causal, softmax_scale=0.1,
        part="first"), 90)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(c.asm["cubin"]); f.flush()
        sass = subprocess.run([CUOBJDUMP, "-sass", f.name], capture_output=True, text=True).stdout
    parts[f"D{d}-{'causal' if causal else 'full'}-first"] = {
        "shared": c.metadata.shared, "local": len(re.findall(r"\b(?:LDL|STL)\b", sass)),
        "reductions": c.asm["ptx"].count("cp.reduce.async.bulk.tensor"),
        "stores": c.asm["ptx"].count("cp.async.bulk.tensor.4d.global.shared")}
# dQ alone has rows at 256 (and head dims that pad to it).
for d, dv in ((256, 256), (192, 128)):
    rows[f"dq-bf16-D{d}-Dv{dv}-causal"] = compile_case("dq", d, dv, True, torch.bfloat16)
print(json.dumps({"rows": rows, "fused": fused, "parts": parts}))
'''

SM90_SHARED_BYTES = 232448


@pytest.fixture(scope="module")
def compiled_all():
    return run_without_interpreter(CHILD)


@pytest.fixture(scope="module")
def compiled(compiled_all):
    return compiled_all["rows"]


def test_the_first_key_blocks_launch_stores_dq(compiled_all):
    """Key block 0's launch (part="first") stores its dQ tiles by TMA where the others reduce;
    it fits and does not spill."""
    assert len(compiled_all["parts"]) == 2
    for name, row in compiled_all["parts"].items():
        assert row["shared"] <= SM90_SHARED_BYTES and row["local"] == 0, (name, row)
        assert row["stores"] > 0 and row["reductions"] == 0, (name, row)
    for name, row in compiled_all["fused"].items():
        assert row["reductions"] > 0, (name, row)


def test_the_fused_kernel_fits_and_runs_five_products_and_reductions(compiled_all):
    # Each compute warpgroup: sᵀ, dPᵀ (D/16 k-steps each, D padded), dV, dK (4: 64 queries),
    # dS K (8: 128 keys); dQ leaves by TMA reductions; the workers give registers back.
    assert len(compiled_all["fused"]) == 6
    for name, row in compiled_all["fused"].items():
        d = 1 << (int(name.split("-")[0][1:]) - 1).bit_length()
        assert row["shared"] <= SM90_SHARED_BYTES, (name, row)
        assert row["hgmma"] == 2 * (d // 16 * 2 + 4 + 4 + 8), (name, row)
        assert row["local"] == 0, (name, row)
        assert row["reductions"] >= 1 and row["setmaxnreg"] >= 2, (name, row)
        # The Q/dO stage and dSᵀ's buffer released by every thread only where that was chosen.
        causal = not name.endswith("full")
        assert (row["thread_arrives"] > 0) == ((d, causal) in sm90_bwd_fused.PER_THREAD_RELEASE), (
            name, row)
    assert len({row["thread_arrives"] > 0 for row in compiled_all["fused"].values()}) == 2
    # Register A operands: Pᵀ of dV and dSᵀ of dK (4 k-steps each: 64 queries), and sᵀ's and
    # dPᵀ's K and V rows (D/16 each) where KV_IN_REGISTERS holds them in registers.
    for name, row in compiled_all["fused"].items():
        if "register_a" in row:
            d = 1 << (int(name.split("-")[0][1:]) - 1).bit_length()
            kv_regs = (d, not name.endswith("full")) in sm90_bwd_fused.KV_IN_REGISTERS
            assert row["register_a"] == 2 * (8 + (2 * d // 16 if kv_regs else 0)), (name, row)

    # dS K: N = D/2 a warpgroup every step, or with ALTERNATE_DQ N = D on alternate steps (at
    # D=64 the other wgmmas are N = 64 too: a D/2 = 32-wide one is the split's dQ).
    for name, row in compiled_all["fused"].items():
        if name.startswith("D64-"):
            whole = (64, not name.endswith("full")) in sm90_bwd_fused.ALTERNATE_DQ
            assert (32 in row["dq_widths"]) != whole, (name, row)


def test_every_row_fits_and_runs_on_wgmma_fed_by_tma(compiled):
    assert len(compiled) == 16
    for name, row in compiled.items():
        assert row["shared"] <= SM90_SHARED_BYTES, (name, row)
        kernel, _, d_text, dv_text, _ = name.split("-")
        d, dv = (1 << (int(text) - 1).bit_length() for text in (d_text[1:], dv_text[2:]))
        if kernel == "dkdv":   # sᵀ, dPᵀ: D/16 and Dv/16 k-steps; dV, dK: BLOCK_M/16 each
            steps = (d + dv) // 16 + 2 * sm90_bwd.DKDV_CONFIGS[128][1] // 16
        else:                  # S, dP: D/16 and Dv/16 k-steps; dQ: BLOCK_N/16
            steps = (d + dv) // 16 + sm90_bwd.DQ_CONFIGS[max(d, dv)][1] // 16
        assert row["hgmma"] == steps, (name, row)
        assert row["tma"] >= 2, (name, row)
        assert row["local"] <= 8, (name, row)   # ptxas: at most an 8-byte spill (causal dK/dV)


def _launch_kernels(arch_name, head_dim=128, causal=True, kernel="sm90", seqlen_q=300,
                    **options):
    arch = arch_for_capability({"sm90": (9, 0), "sm80": (8, 0)}[arch_name])
    q = torch.empty(2, seqlen_q, 4, head_dim, dtype=torch.bfloat16)
    k = torch.empty(2, 300, 2, head_dim, dtype=torch.bfloat16)
    lse = torch.empty(2, 4, seqlen_q)
    delta, dq_accum = bwd.backward_workspace(q, lse, options.pop("deterministic", True))
    launches = bwd.backward_launches(
        q, k, k, q, lse, q, q, k, k, delta, dq_accum, causal=causal, softmax_scale=0.1,
        window_left=options.pop("window_left", -1), window_right=-1, arch=arch,
        kernel=kernel, **options)
    return [launch.kernel for launch in launches]


def test_the_sm90_backward_runs_the_gluon_kernels_where_they_apply():
    assert {sm90_bwd.attention_bwd_dkdv_sm90_kernel,
            sm90_bwd.attention_bwd_dq_sm90_kernel} <= set(_launch_kernels("sm90"))
    gluon = sm90_bwd.attention_bwd_dkdv_sm90_kernel
    assert sm90_bwd.attention_bwd_dq_sm90_kernel not in _launch_kernels(
        "sm90", dq_tiles=bwd.dq_config(arch_for_capability((9, 0)), 128, 128))
    assert gluon in _launch_kernels("sm90", head_dim=96, causal=False)
    at_256 = _launch_kernels("sm90", head_dim=256)   # dQ only: fp32 dK, dV would not fit
    assert sm90_bwd.attention_bwd_dq_sm90_kernel in at_256 and gluon not in at_256
    assert gluon not in _launch_kernels("sm80")
    assert gluon not in _launch_kernels("sm90", head_dim=64)      # no row: portable wins there
    assert gluon not in _launch_kernels("sm90", window_left=100)
    assert gluon not in _launch_kernels("sm90", deterministic=False)   # dQ added by the kernel
    fused = sm90_bwd_fused.attention_bwd_fused_sm90_kernel
    assert fused in _launch_kernels("sm90", deterministic=False)
    assert fused in _launch_kernels("sm90", head_dim=96, deterministic=False)
    assert fused in _launch_kernels("sm90", head_dim=64, deterministic=False)
    assert fused not in _launch_kernels("sm90", head_dim=256, deterministic=False)
    assert fused not in _launch_kernels("sm90", seqlen_q=301, deterministic=False)  # lse by TMA
    assert fused not in _launch_kernels("sm90", kernel="portable", deterministic=False)
    assert fused not in _launch_kernels("sm90")
    assert gluon not in _launch_kernels("sm90", kernel="portable")
    assert gluon not in _launch_kernels("sm90", dkdv_tiles=bwd.dkdv_config(
        arch_for_capability((9, 0)), 128, 128))


def test_dispatch_asks_for_the_gluon_kernel_on_hopper_unless_portable_is_forced():
    sm90, sm80 = arch_for_capability((9, 0)), arch_for_capability((8, 0))
    assert dispatch.backward_kernel(sm90, dispatch.current()) == "sm90"
    assert dispatch.backward_kernel(sm80, dispatch.current()) == "portable"
    with dispatch.use_kernels(attention="portable") as settings:
        assert dispatch.backward_kernel(sm90, settings) == "portable"
