"""Compile every backward config for its chip, without a GPU.

Proves each row of the dK/dV and dQ tables fits that chip's shared memory (in both dQ modes),
that sm90 runs on wgmma (too) and older chips on mma.sync, that fp32 atomics appear only in the
default (non-deterministic) variant, and that the score hooks with their tuple argument, the
varlen layout and flex_attention's block lists (translated hooks, 64-wide mask blocks) compile.
"""

import pytest

from .compile_helpers import run_without_interpreter

CHILD = r'''
import json, re, torch
from concurrent.futures import ProcessPoolExecutor
from tileattn.arch import arch_for_capability
from tileattn.kernels import mods
from tileattn.kernels.attention import bwd as attention_bwd
from tileattn.kernels.compile import cross_compile

CAPABILITY = {"sm80": (8, 0), "sm89": (8, 9), "sm90": (9, 0)}
KERNEL_NAMES = ("preprocess", "dkdv", "finish_dq")

def flex_arguments(arch, width):
    """A flex_attention backward's hooks, block lists and tiles (ops/flex_backward.py)."""
    import dataclasses
    from torch.nn.attention.flex_attention import create_block_mask
    from tileattn.flex.block_mask import largest_tile
    from tileattn.ops import flex_backward
    doc_ids = torch.zeros(2, 256, dtype=torch.int32)
    def document_causal(b, h, q_idx, kv_idx):
        return (doc_ids[b, q_idx] == doc_ids[b, kv_idx]) & (q_idx >= kv_idx)
    def softcap(score, b, h, q_idx, kv_idx):
        return 30.0 * torch.tanh(score / 30.0)
    block_mask = create_block_mask(document_causal, 2, 1, 256, 256, device="cpu", BLOCK_SIZE=64)
    plan = flex_backward.backward_plan(softcap, block_mask, batch=2, num_q_heads=4, seqlen_q=256,
                                       seqlen_k=256, softmax_scale=0.1, device=torch.device("cpu"))
    fitted = [dataclasses.replace(t, block_m=largest_tile(64, t.block_m),
                                  block_n=largest_tile(64, t.block_n))
              for t in (attention_bwd.dkdv_config(arch, width, width),
                        attention_bwd.dq_config(arch, width, width))]
    return dict(score_mod=plan.score_mod, score_mod_grad=plan.score_mod_grad,
                mask_mod=plan.mask_mod, mod_args=plan.mod_args, block_mask=plan.block_lists,
                dkdv_tiles=fitted[0], dq_tiles=fitted[1])

def launches(name, width, deterministic, varlen=False, hooked=False, flex=False):
    arch = arch_for_capability(CAPABILITY[name])
    heads_q, heads_kv, seqlen = 4, 2, 256
    bf16 = dict(dtype=torch.bfloat16)
    if varlen:
        q, out = torch.empty(2 * seqlen, heads_q, width, **bf16), torch.empty(2 * seqlen, heads_q, width, **bf16)
        k, v = (torch.empty(2 * seqlen, heads_kv, width, **bf16) for _ in range(2))
        lse = torch.empty(heads_q, 2 * seqlen)
        cu_seqlens = torch.tensor([0, seqlen, 2 * seqlen], dtype=torch.int32)
        varlen_args = dict(cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens, max_seqlen_q=seqlen,
                           max_seqlen_k=seqlen)
    else:
        q, out = torch.empty(2, seqlen, heads_q, width, **bf16), torch.empty(2, seqlen, heads_q, width, **bf16)
        k, v = (torch.empty(2, seqlen, heads_kv, width, **bf16) for _ in range(2))
        lse = torch.empty(2, heads_q, seqlen)
        varlen_args = {}
    hooks = {}
    if hooked:
        slopes = torch.empty(heads_q)
        score_mod, score_mod_grad, mod_args = mods.builtin(30.0, slopes)
        hooks = dict(score_mod=score_mod, score_mod_grad=score_mod_grad, mod_args=mod_args)
    bounds = dict(causal=True, window_left=100, window_right=-1)
    if flex:
        hooks = flex_arguments(arch, width)
        bounds = dict(causal=False, window_left=-1, window_right=-1)
    delta, dq_accum = attention_bwd.backward_workspace(q, lse, deterministic)
    built = attention_bwd.backward_launches(
        q, k, v, out, lse, out, torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
        delta, dq_accum, softmax_scale=0.1, arch=arch, **bounds, **varlen_args, **hooks)
    return arch, dict(zip(KERNEL_NAMES, built))

def compile_case(job):
    name, width, deterministic, varlen, hooked, kernels, flex = job
    arch, built = launches(name, width, deterministic, varlen, hooked, flex)
    cap = CAPABILITY[name]
    rows = []
    for kernel in kernels:
        launch = built[kernel]
        c = cross_compile(launch, cap[0] * 10 + cap[1])
        count = lambda pattern: len(re.findall(pattern, c.ptx))
        rows.append({"arch": name, "width": width, "deterministic": deterministic,
                     "varlen": varlen, "hooked": hooked, "flex": flex, "kernel": kernel,
                     "shared": c.shared_bytes, "limit": arch.shared_memory_bytes,
                     "wgmma": count(r"wgmma\.mma_async"), "mma_sync": count(r"mma\.sync"),
                     "atomic_f32": count(r"(?:atom|red)\.global[\w.]*\.add[\w.]*\.f32")})
    return rows

def kernels_to_compile(name, deterministic):
    """Every row's default kernels and its deterministic dQ kernel; the deterministic dK/dV
    kernel (the default one without its dQ product) on sm90 only, to show where atomics go."""
    return ("finish_dq",) if deterministic and name != "sm90" else KERNEL_NAMES

jobs = [(name, width, deterministic, False, False, kernels_to_compile(name, deterministic), False)
        for (name, width) in attention_bwd.DKDV_CONFIGS if name != "cpu"
        for deterministic in (False, True)]
jobs += [("sm90", 128, deterministic, True, True, KERNEL_NAMES, False)
         for deterministic in (False, True)]
# flex_attention's backward (deterministic dQ, as ops/flex_backward.py runs it).
jobs += [(name, 128, True, False, True, ("dkdv", "finish_dq"), True) for name in ("sm80", "sm90")]
with ProcessPoolExecutor(2) as pool:
    rows = [row for case in pool.map(compile_case, jobs) for row in case]
print(json.dumps({"rows": rows}))
'''


@pytest.fixture(scope="module")
def compiled():
    return run_without_interpreter(CHILD)["rows"]


def test_every_config_fits_its_chip(compiled):
    assert len({(r["arch"], r["width"]) for r in compiled}) >= 9
    for row in compiled:
        assert row["shared"] <= row["limit"], row


def test_sm90_uses_wgmma_and_older_chips_mma_sync(compiled):
    for row in compiled:
        if row["kernel"] == "preprocess" or (row["kernel"] == "finish_dq" and not row["deterministic"]):
            continue   # the row kernels multiply nothing
        if row["arch"] == "sm90":
            # Products with fewer than 64 rows (a 16- or 32-query dQ = dS K) stay on mma.sync.
            assert row["wgmma"] > 0, row
        else:
            assert row["wgmma"] == 0 and row["mma_sync"] > 0, row


def test_fp32_atomics_only_in_the_default_dq(compiled):
    for row in compiled:
        if row["kernel"] == "dkdv" and not row["deterministic"]:
            assert row["atomic_f32"] > 0, row
        else:
            assert row["atomic_f32"] == 0, row


def test_hooks_and_varlen_compile(compiled):
    hooked = [row for row in compiled if row["hooked"] and row["varlen"]]
    assert {row["kernel"] for row in hooked} == {"preprocess", "dkdv", "finish_dq"}
    assert {row["deterministic"] for row in hooked} == {False, True}


def test_flex_block_lists_compile(compiled):
    flex = [row for row in compiled if row["flex"]]
    assert {(row["arch"], row["kernel"]) for row in flex} == {
        (arch, kernel) for arch in ("sm80", "sm90") for kernel in ("dkdv", "finish_dq")}


def test_tuple_arguments_are_specialized_element_by_element():
    """KernelLaunch's launch cache tells mod_args tuples apart as Triton's JIT does: an int
    equal to 1 or divisible by 16, a tensor's dtype and alignment, None."""
    import torch
    from tileattn.kernels.runtime import _value_key as _tuple_specialization
    slopes = torch.empty(8)
    base = _tuple_specialization((30.0, slopes, 0, 5))
    assert _tuple_specialization((20.0, torch.empty(8), 0, 7)) == base
    for changed in ((30.0, slopes, 0, 1), (30.0, slopes, 0, 32), (30.0, slopes.half(), 0, 5),
                    (30.0, slopes[1:], 0, 5), (30.0, None, 0, 5), (30.0, slopes, 0, 5, ())):
        assert _tuple_specialization(changed) != base, changed
