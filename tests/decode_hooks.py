"""Score/mask hooks written per mods.md, for the decode tests (the library's own live in
tileattn/kernels/mods.py). A module of their own: @triton.jit needs functions defined in a
file, and the cross-compile child imports them without the test setup."""

import triton
import triton.language as tl


@triton.jit
def softcap_then_alibi(score, batch, head, q_idx, kv_idx, q_shift, mod_args):
    """mods.md's composition: cap * tanh(s / cap), then - slope[batch, head] * |distance|.
    mod_args = (cap, slopes, slopes' batch stride)."""
    cap = mod_args[0]
    capped = cap * (1.0 - 2.0 / (tl.exp(2.0 * score / cap) + 1.0))
    slope = tl.load(mod_args[1] + batch * mod_args[2] + head)
    return capped - slope * tl.abs(q_idx + q_shift - kv_idx).to(tl.float32)


@triton.jit
def softcap_only(score, batch, head, q_idx, kv_idx, q_shift, mod_args):
    cap = mod_args[0]
    return cap * (1.0 - 2.0 / (tl.exp(2.0 * score / cap) + 1.0))


@triton.jit
def keep_last_keys(batch, head, q_idx, kv_idx, q_shift, mod_args):
    """A sliding window of mod_args[0] keys behind each query, written as a mask hook."""
    return kv_idx >= q_idx + q_shift - mod_args[0]
