"""The built-in score hooks (softcap, ALiBi, both) in the form of the hook interface that every
attention kernel shares (see the kernels' docstrings: SCORE_MOD / SCORE_MOD_GRAD / MASK_MOD and
the mod_args tuple).

mod_args for every hook here is one tuple (the same layout whichever hook is chosen, so a
kernel's tuple argument keeps one type signature):
    (softcap_value,          fp32 scalar c > 0: s -> c * tanh(s / c) (unused by `alibi`)
     slopes_ptr,             fp32 ALiBi slopes, read at batch * stride + head * stride
                             (None for `softcap`, which never reads it)
     stride_slopes_batch,    0 for slopes shared by every sequence ([num_q_heads] slopes)
     stride_slopes_head)
Hooks are elementwise: score, q_idx and kv_idx broadcast against each other (the dK/dV kernel
passes a transposed tile, q_idx [1, BLOCK_M] and kv_idx [BLOCK_N, 1]).

Softcap comes first, then ALiBi, as FlashAttention does; ALiBi's penalty uses the bottom-right
aligned query position q_idx + q_shift, so it is the same whether or not the call is causal.
"""

import triton
import triton.language as tl


@triton.jit
def _tanh(x):
    # tanh from exp2 (libdevice.tanh does not run in the Triton interpreter); exact at ±inf:
    # exp2 -> inf gives 1, exp2 -> 0 gives -1.
    return 1.0 - 2.0 / (tl.math.exp2(x * 2.8853900817779268) + 1.0)   # 2 * log2(e)


@triton.jit
def _alibi_penalty(batch, head, q_idx, kv_idx, q_shift, mod_args):
    slope = tl.load(mod_args[1] + batch * mod_args[2] + head * mod_args[3])
    return slope * tl.abs(q_idx + q_shift - kv_idx).to(tl.float32)


@triton.jit
def softcap(score, batch, head, q_idx, kv_idx, q_shift, mod_args):
    cap = mod_args[0]
    return cap * _tanh(score / cap)


@triton.jit
def softcap_grad(score, batch, head, q_idx, kv_idx, q_shift, mod_args):
    tanh = _tanh(score / mod_args[0])
    return 1.0 - tanh * tanh


@triton.jit
def alibi(score, batch, head, q_idx, kv_idx, q_shift, mod_args):
    return score - _alibi_penalty(batch, head, q_idx, kv_idx, q_shift, mod_args)


@triton.jit
def alibi_grad(score, batch, head, q_idx, kv_idx, q_shift, mod_args):
    return tl.full(score.shape, 1.0, tl.float32)


@triton.jit
def softcap_alibi(score, batch, head, q_idx, kv_idx, q_shift, mod_args):
    capped = softcap(score, batch, head, q_idx, kv_idx, q_shift, mod_args)
    return capped - _alibi_penalty(batch, head, q_idx, kv_idx, q_shift, mod_args)


@triton.jit
def softcap_alibi_grad(score, batch, head, q_idx, kv_idx, q_shift, mod_args):
    return softcap_grad(score, batch, head, q_idx, kv_idx, q_shift, mod_args)
