"""FP8 scale choices (tileattn.quantize_qkv_fp8) against fp64 attention of the unquantized
inputs: the table behind issue 19's accuracy bar.

Every error is the relative L2 error of the output against fp64 attention of the fp32 inputs
before quantization. Attention of the quantized inputs is emulated in fp64 (dequantized q, k,
v), so that the quantization error and P's rounding are seen apart, three ways:
    exact        fp64 softmax and P @ V: the quantization error alone
    P e4m3       the portable kernel's P: per key tile (BLOCK_N keys, running max m),
                 p = exp2(s - m) in [0, 1] rounded to e4m3 before P @ V, the row sum l taken
                 from the unrounded p (tileattn/kernels/attention/fwd.py)
    P e4m3 +8    FA3's offset: p = exp2(s - m + 8) in [0, 256], in e4m3's normal range
                 (e4m3 flushes p below 2^-10 to zero and keeps fewer bits below 2^-6)
and, where attention() runs a kernel (CUDA, or the interpreter), the kernel itself.

Rows are the accuracy grid's "scales" rows (dtype fp8e4m3, D, scales = the setting, inputs =
the kind, seed, shape, one error per P rounding, and rel_vs_fp32_inputs = the kernel's).
GPU_SHAPE is the shape `python -m tileattn accuracy` measures them at on a GPU.

Inputs (q, k, v [B, N, H, D], N(0, 1) entries, causal):
    plain     as drawn
    outliers  channels 0-3 of q and k times 20 (the README's accuracy table), and one offset
              vector per head, 5 * N(0, 1) per channel, added to every key
    offset    the shared key offset alone
    sink      every query carries 2 u (u a random unit vector per head) and key 0 is
              SINK_LOGIT * sqrt(D) / 2 * u: every query's logit for key 0 is about
              SINK_LOGIT = 8 above its mean
"""

from __future__ import annotations

import math

import torch

import tileattn
from tileattn.fp8 import dequantize
from tileattn.kernels.runtime import interpreter_active
from tileattn.reference import attention_reference

SETTINGS = {
    "tensor": dict(per="tensor"),
    "head": dict(per="head"),
    "block": dict(per="block"),
    "block+smooth": dict(per="block", smooth_k=True),
    "block+smooth+rotate": dict(per="block", smooth_k=True, rotate=True),
    "tensor+rotate": dict(per="tensor", rotate=True),
}
INPUT_KINDS = ("plain", "outliers", "offset", "sink")
P_ROUNDINGS = ("exact", "e4m3", "e4m3+offset")
OUTLIER_CHANNELS, OUTLIER_FACTOR, KEY_OFFSET = 4, 20.0, 5.0
SINK_LOGIT = 8.0
FA3_P_OFFSET = 8.0   # log2 units: P spans [0, 2^8]
GPU_SHAPE = dict(batch=2, seqlen=4096, heads=8, head_dim=128, seeds=(0, 1, 2))


def make_inputs(kind: str, batch: int, seqlen: int, heads: int, head_dim: int, seed: int,
                device="cpu"):
    """(q, k, v) float32 [batch, seqlen, heads, head_dim] of the named kind."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, seqlen, heads, head_dim, generator=gen) for _ in range(3))
    if kind == "outliers":
        q[..., :OUTLIER_CHANNELS] *= OUTLIER_FACTOR
        k[..., :OUTLIER_CHANNELS] *= OUTLIER_FACTOR
    if kind in ("outliers", "offset"):
        k += KEY_OFFSET * torch.randn(heads, head_dim, generator=gen)
    elif kind == "sink":
        direction = torch.randn(heads, head_dim, generator=gen)
        direction /= direction.norm(dim=-1, keepdim=True)
        q += 2.0 * direction
        k[:, 0] = SINK_LOGIT * math.sqrt(head_dim) / 2.0 * direction
    elif kind not in ("plain", "outliers", "offset"):
        raise ValueError(f"kind must be one of {INPUT_KINDS}, got {kind!r}")
    return tuple(x.to(device) for x in (q, k, v))


def emulated_attention(q, k, v, *, causal: bool, p_rounding: str, block_n: int = 128,
                       softmax_scale: float | None = None) -> torch.Tensor:
    """fp64 attention of q [B, Sq, H, D], k, v [B, Sk, H, *] (same heads), with P rounded as
    p_rounding says (module docstring). Returns out [B, Sq, H, Dv] float64."""
    if p_rounding == "exact":
        return attention_reference(q, k, v, causal=causal, softmax_scale=softmax_scale)[0]
    q, k, v = (x.to(torch.float64) for x in (q, k, v))
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    scale = (softmax_scale or 1.0 / math.sqrt(q.shape[3])) * math.log2(math.e)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if causal:
        hidden = (torch.arange(seqlen_k, device=q.device)[None, :]
                  > torch.arange(seqlen_q, device=q.device)[:, None] + seqlen_k - seqlen_q)
        scores = scores.masked_fill(hidden, float("-inf"))
    offset = FA3_P_OFFSET if p_rounding == "e4m3+offset" else 0.0
    row_max = torch.full(scores.shape[:-1], float("-inf"), dtype=torch.float64, device=q.device)
    row_sum = torch.zeros_like(row_max)
    acc = torch.zeros(*scores.shape[:-1], v.shape[3], dtype=torch.float64, device=q.device)
    for start in range(0, seqlen_k, block_n):
        tile = scores[..., start:start + block_n]
        new_max = torch.maximum(row_max, tile.amax(dim=-1))
        safe_max = torch.where(torch.isinf(new_max), 0.0, new_max)
        p = torch.exp2(tile - safe_max[..., None] + offset)
        alpha = torch.exp2(row_max - safe_max)
        row_sum = row_sum * alpha + p.sum(dim=-1)
        p_fp8 = p.to(torch.float32).to(torch.float8_e4m3fn).to(torch.float64)
        acc = acc * alpha[..., None] + torch.einsum("bhqk,bkhd->bhqd", p_fp8,
                                                     v[:, start:start + block_n])
        row_max = new_max
    out = acc / torch.where(row_sum == 0, 1.0, row_sum)[..., None]
    return out.permute(0, 2, 1, 3)


def relative_error(out: torch.Tensor, exact: torch.Tensor) -> float:
    return float((out.to(torch.float64) - exact).norm() / exact.norm())


def _kernel_error(q8, k8, v8, scales, exact) -> float | None:
    """attention()'s error on the quantized inputs; None where no kernel runs (CPU without
    the interpreter runs the fp64 reference)."""
    if q8.device.type != "cuda" and not interpreter_active():
        return None
    out = tileattn.attention(q8, k8, v8, causal=True, **scales)
    return relative_error(out, exact)


def measure(kind: str, setting: str, *, batch=1, seqlen=256, heads=2, head_dim=128, seed=0,
            device="cpu", p_roundings=P_ROUNDINGS, kernel=True, block_n=128) -> dict:
    """One row of the accuracy grid (its "scales" rows): the errors of one scale setting on
    one kind of input (causal), emulated (one key per P rounding) and of the kernel
    ("rel_vs_fp32_inputs", None where no kernel runs)."""
    q, k, v = make_inputs(kind, batch, seqlen, heads, head_dim, seed, device)
    exact = attention_reference(q, k, v, causal=True)[0]
    q8, k8, v8, scales = tileattn.quantize_qkv_fp8(q, k, v, **SETTINGS[setting])
    dequantized = [dequantize(x, scales[name], torch.float64)
                   for x, name in ((q8, "q_descale"), (k8, "k_descale"), (v8, "v_descale"))]
    row = {"dtype": "fp8e4m3", "D": head_dim, "scales": setting, "inputs": kind, "seed": seed,
           "batch": batch, "seqlen": seqlen, "heads": heads}
    for rounding in p_roundings:
        out = emulated_attention(*dequantized, causal=True, p_rounding=rounding, block_n=block_n)
        row[rounding] = relative_error(out, exact)
    row["rel_vs_fp32_inputs"] = _kernel_error(q8, k8, v8, scales, exact) if kernel else None
    return row


def run(*, batch=1, seqlen=256, heads=2, head_dim=128, seeds=(0,), device="cpu",
        kinds=INPUT_KINDS, settings=tuple(SETTINGS), kernel=True) -> list[dict]:
    return [measure(kind, setting, batch=batch, seqlen=seqlen, heads=heads, head_dim=head_dim,
                    seed=seed, device=device, kernel=kernel)
            for kind in kinds for setting in settings for seed in seeds]


def format_table(rows: list[dict]) -> str:
    """Mean over seeds of each (kind, setting), and each setting's ratio to per-tensor in the
    P e4m3 column (the portable kernel's arithmetic)."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["inputs"], row["scales"]), []).append(row)

    def mean(rows_, key):
        values = [r[key] for r in rows_ if r.get(key) is not None]
        return sum(values) / len(values) if values else None

    lines = [f"{'inputs':<9}{'setting':<21}{'exact P':>10}{'P e4m3':>10}{'P e4m3+8':>10}"
             f"{'kernel':>10}{'e4m3 vs tensor':>16}"]
    for (kind, setting), group in groups.items():
        values = [mean(group, key) for key in (*P_ROUNDINGS, "rel_vs_fp32_inputs")]
        baseline = groups.get((kind, "tensor"))
        ratio = values[1] / mean(baseline, "e4m3") if baseline and values[1] is not None else None
        cells = "".join(f"{v:>10.2e}" if v is not None else f"{'-':>10}" for v in values)
        lines.append(f"{kind:<9}{setting:<21}{cells}"
                     + (f"{ratio:>15.2f}x" if ratio is not None else f"{'-':>16}"))
    return "\n".join(lines)
