"""The built-in score hooks: softcap and ALiBi, written as the hooks of docs/design.md ("Mods")
that FlexAttention's translated functions also are, so one mechanism runs both.

Their mod_args tuple is BUILTIN_ARGS: (softcap: fp32 c, slopes: fp32 pointer or None,
stride_slopes_b, stride_slopes_h); slopes [B, Hq] or [Hq] (stride_slopes_b = 0).
Scores arrive in natural-log units. FlashAttention's order: softcap first, then ALiBi.
"""

import triton
import triton.language as tl


@triton.jit
def _tanh(x):
    # 1 - 2 / (e^2x + 1): exact at both saturations (e^2x overflowing to inf gives 1), one
    # exp2 and one division, and it runs in Triton's interpreter (no inline PTX).
    return 1.0 - 2.0 / (tl.math.exp2(x * 2.8853900817779268) + 1.0)


@triton.jit
def _alibi_bias(batch, head, q_idx, kv_idx, q_shift, mod_args):
    slope = tl.load(mod_args[1] + batch * mod_args[2] + head * mod_args[3])
    # Positions converted per row and per column, not per score (int-to-float conversions
    # share the special-function unit with exp2); exact below 2^24 (docs/design.md, "Mods").
    distance = (q_idx + q_shift).to(tl.float32) - kv_idx.to(tl.float32)
    return slope * tl.abs(distance)


@triton.jit
def softcap(score, batch, head, q_idx, kv_idx, q_shift, mod_args):
    cap = mod_args[0]
    return cap * _tanh(score / cap)


@triton.jit
def softcap_grad(score, batch, head, q_idx, kv_idx, q_shift, mod_args):
    t = _tanh(score / mod_args[0])
    return 1.0 - t * t


@triton.jit
def alibi(score, batch, head, q_idx, kv_idx, q_shift, mod_args):
    return score - _alibi_bias(batch, head, q_idx, kv_idx, q_shift, mod_args)


@triton.jit
def alibi_grad(score, batch, head, q_idx, kv_idx, q_shift, mod_args):
    return tl.full(score.shape, 1.0, tl.float32)


@triton.jit
def softcap_alibi(score, batch, head, q_idx, kv_idx, q_shift, mod_args):
    cap = mod_args[0]
    return cap * _tanh(score / cap) - _alibi_bias(batch, head, q_idx, kv_idx, q_shift, mod_args)


def is_linear(score_mod, causal: bool, proven: bool) -> bool:
    """Whether the kernels may add score_mod as a term per row and one per key column: it is
    score + c (q_idx - kv_idx) + d on every key a row sees. proven: flex/linear.py's proof for
    a translated hook; the built-in ALiBi, -slope |p - kv|, is so under causal (p >= kv)."""
    return score_mod is not None and (proven or causal and score_mod is alibi)


def builtin(softcap_value: float, alibi_slopes):
    """(score_mod, score_mod_grad, mod_args) for attention()'s softcap and alibi_slopes
    arguments (softcap 0.0 and slopes None: no hook)."""
    slopes_args = (None, 0, 0)
    if alibi_slopes is not None:
        strides = (0, alibi_slopes.stride(0)) if alibi_slopes.dim() == 1 else alibi_slopes.stride()
        slopes_args = (alibi_slopes, *strides)
    mod_args = (float(softcap_value), *slopes_args)
    if softcap_value > 0 and alibi_slopes is not None:
        return softcap_alibi, softcap_grad, mod_args
    if softcap_value > 0:
        return softcap, softcap_grad, mod_args
    if alibi_slopes is not None:
        return alibi, alibi_grad, mod_args
    return None, None, ()
