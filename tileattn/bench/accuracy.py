"""The accuracy table: error of each dtype against fp64, on normal inputs and with outliers.

Two yardsticks per row: the fp64 reference on the *same quantized inputs* (the kernel's own
error) and on the unquantized fp32 inputs (what a user sees, quantization included).
On a GPU the grid also holds the FP8 scale choices of quantize_qkv_fp8 (rows with a "scales"
field, measured as fp8_scales.py says: against the unquantized inputs, emulated and by the
kernel).
"""

from __future__ import annotations

import torch

import tileattn
from tileattn.reference import attention_reference

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16,
          "fp8e4m3": torch.float8_e4m3fn, "fp8e5m2": torch.float8_e5m2}
HEAD_DIMS = (64, 128, 256)


def _inputs(shape, outliers: bool, device, seed: int):
    gen = torch.Generator(device=device).manual_seed(seed)
    q, k, v = (torch.randn(shape, device=device, generator=gen) for _ in range(3))
    if outliers:
        # A few loud channels, as in real activations: 4 of D channels scaled by 20.
        for x in (q, k, v):
            x[..., :4] *= 20.0
    return q, k, v


def _errors(out, ref):
    diff = out.double() - ref
    return float(diff.pow(2).mean().sqrt()), float(diff.norm() / ref.norm())


def run(device=None, shape=None, dtypes=tuple(DTYPES), head_dims=HEAD_DIMS,
        scales=None) -> list[dict]:
    """One row per (head dim, outliers, dtype), causal. Default shape: B=2 N=1024 H=8 on a GPU,
    B=1 N=64 H=2 on the CPU (Triton's interpreter). scales (default: on a GPU) adds the FP8
    scale rows at fp8_scales.GPU_SHAPE."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    rows = _dtype_rows(device, shape, dtypes, head_dims)
    if scales is None:
        scales = device.type == "cuda"
    if scales:
        from . import fp8_scales
        rows += fp8_scales.run(device=device.type, **fp8_scales.GPU_SHAPE)
    return rows


def _dtype_rows(device, shape, dtypes, head_dims) -> list[dict]:
    rows = []
    for head_dim in head_dims:
        batch, seqlen, heads = shape or ((2, 1024, 8) if device.type == "cuda" else (1, 64, 2))
        for outliers in (False, True):
            q, k, v = _inputs((batch, seqlen, heads, head_dim), outliers, device, head_dim)
            exact, _ = attention_reference(q, k, v, causal=True)
            for name in dtypes:
                dtype = DTYPES[name]
                if dtype.itemsize == 1:
                    (q_, qd), (k_, kd), (v_, vd) = (tileattn.quantize_fp8(x, dtype) for x in (q, k, v))
                    descales = dict(q_descale=qd, k_descale=kd, v_descale=vd)
                else:
                    q_, k_, v_ = (x.to(dtype) for x in (q, k, v))
                    descales = {}
                out = tileattn.attention(q_, k_, v_, causal=True, **descales)
                same_inputs, _ = attention_reference(q_, k_, v_, causal=True, **descales)
                rmse_q, rel_q = _errors(out, same_inputs)
                rmse_x, rel_x = _errors(out, exact)
                rows.append({"dtype": name, "D": head_dim, "outliers": outliers,
                             "rmse_vs_quantized": rmse_q, "rel_vs_quantized": rel_q,
                             "rmse_vs_fp32_inputs": rmse_x, "rel_vs_fp32_inputs": rel_x})
    return rows


def format_table(rows: list[dict]) -> str:
    """The dtype table, then (where the rows hold them) the FP8 scales table."""
    scale_rows = [r for r in rows if "scales" in r]
    lines = [f"{'dtype':<9}{'D':>5}{'outliers':>10}{'RMSE(same in)':>15}{'rel(same in)':>14}"
             f"{'RMSE(fp32 in)':>15}{'rel(fp32 in)':>14}"]
    if scale_rows:
        from . import fp8_scales
        return "\n".join([format_table([r for r in rows if "scales" not in r]),
                          "FP8 scales (e4m3, relative L2 vs fp64 on the unquantized inputs):",
                          fp8_scales.format_table(scale_rows)])
    for r in rows:
        lines.append(f"{r['dtype']:<9}{r['D']:>5}{str(r['outliers']):>10}"
                     f"{r['rmse_vs_quantized']:>15.2e}{r['rel_vs_quantized']:>14.2e}"
                     f"{r['rmse_vs_fp32_inputs']:>15.2e}{r['rel_vs_fp32_inputs']:>14.2e}")
    return "\n".join(lines)
