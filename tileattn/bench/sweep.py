"""Tile-config sweep for the portable kernel: times candidate rows of its config table.

Used to fill attention_fwd.CONFIGS for a chip; results go to benchmarks/NOTES.md.
"""

from __future__ import annotations

import itertools

import torch

import tileattn
from tileattn.arch import arch_of
from tileattn import scheduler
from tileattn.kernels.attention import fwd as attention_fwd

from .common import time_ms
from .prefill import BATCH, HEADS, flops

# (BLOCK_M, BLOCK_N, warps, stages): one warpgroup per 64 query rows, as wgmma wants.
CANDIDATES = [attention_fwd.TileConfig(*row) for row in [
    (128, 64, 8, 2), (128, 64, 8, 3), (128, 128, 8, 2), (128, 128, 8, 3), (128, 128, 8, 4),
    (64, 64, 4, 3), (64, 128, 4, 2), (64, 128, 4, 3), (128, 64, 4, 3), (128, 128, 4, 2)]]


def _inputs(x, dtype_name, k_major_v):
    """(q, k, v), descales from fp32 tensors x: bf16, or e4m3 per tensor (V K-major if asked)."""
    if not dtype_name.startswith("fp8"):
        return tuple(t.to(torch.bfloat16) for t in x), {}
    (q, qd), (k, kd), (v, vd) = (tileattn.quantize_fp8(t, torch.float8_e4m3fn) for t in x)
    if k_major_v:
        v = tileattn.prepare_v(v)
    return (q, k, v), dict(q_descale=qd, k_descale=kd, v_descale=vd)


def run(head_dims=(64, 128, 256), dtypes=("bf16", "fp8e4m3"), context=4096, causal=False):
    device = torch.device("cuda")
    arch = arch_of(device)
    results = []
    for head_dim, dtype_name in itertools.product(head_dims, dtypes):
        is_fp8 = dtype_name.startswith("fp8")
        x = [torch.randn(BATCH, context, HEADS, head_dim, device=device) for _ in range(3)]
        (q, k, v), descales = _inputs(x, dtype_name, k_major_v=True)
        reference = None
        key = (arch.name, attention_fwd.padded_head_dim(head_dim), is_fp8)
        original = attention_fwd.CONFIGS.get(key)
        best = None
        for config in CANDIDATES:
            attention_fwd.CONFIGS[key] = config
            try:
                out = tileattn.attention(q, k, v, causal=causal, **descales)
                if reference is None:
                    reference = out.float()
                elif float((out.float() - reference).norm() / reference.norm()) > 5e-2:
                    print(f"D={head_dim} {dtype_name} {config}: wrong result")
                    continue
                ms = time_ms(lambda: tileattn.attention(q, k, v, causal=causal, **descales))
            except Exception as error:  # noqa: BLE001 - out of resources etc.
                print(f"D={head_dim} {dtype_name} {config}: {type(error).__name__}")
                continue
            tflops = flops(context, head_dim, causal) / ms / 1e9
            results.append({"D": head_dim, "dtype": dtype_name, "config": config.__dict__,
                            "tflops": tflops})
            if best is None or tflops > best[1]:
                best = (config, tflops)
        if original is not None:
            attention_fwd.CONFIGS[key] = original
        print(f"D={head_dim} {dtype_name}: best {best}, table row {original}", flush=True)
    return results


def causal_order_ab(head_dim=128, contexts=(4096, 16384), fp8_candidates=((64, 128, 4, 3), (128, 64, 4, 3), (128, 128, 8, 3))):
    """Causal A/B of the launch order (one head's tiles longest-first vs groups of heads) and,
    at the first context, of FP8 tile rows. V is row-major, so FP8 times include attention()'s
    transposition, as the foundation bar counts them."""
    device = torch.device("cuda")
    arch = arch_of(device)
    results = []
    for context in contexts:
        x = [torch.randn(BATCH, context, HEADS, head_dim, device=device) for _ in range(3)]
        for dtype_name in ("bf16", "fp8e4m3"):
            is_fp8 = dtype_name.startswith("fp8")
            (q, k, v), descales = _inputs(x, dtype_name, k_major_v=False)
            key = (arch.name, attention_fwd.padded_head_dim(head_dim), is_fp8)
            original = attention_fwd.CONFIGS[key]
            rows = [original]
            if is_fp8 and context == contexts[0]:
                rows = [attention_fwd.TileConfig(*row) for row in fp8_candidates]
            for config in rows:
                for max_heads in (1, 8):
                    attention_fwd.CONFIGS[key] = config
                    scheduler.LPT_MAX_HEADS = max_heads
                    call = lambda: tileattn.attention(q, k, v, causal=True, **descales)
                    try:
                        call()
                        ms = time_ms(call)
                    except Exception as error:  # noqa: BLE001
                        print(f"N={context} {dtype_name} {config} heads/group<={max_heads}: {type(error).__name__}")
                        continue
                    tflops = flops(context, head_dim, True) / ms / 1e9
                    results.append({"N": context, "D": head_dim, "dtype": dtype_name,
                                    "config": config.__dict__, "lpt_max_heads": max_heads,
                                    "ms": ms, "tflops": tflops})
                    print(f"N={context} {dtype_name} {tuple(config.__dict__.values())} "
                          f"heads/group<={max_heads}: {ms:.4f} ms {tflops:.0f} TFLOP/s", flush=True)
            attention_fwd.CONFIGS[key] = original
            scheduler.LPT_MAX_HEADS = 8
    return results
