"""tileattn.flex_attention: torch's FlexAttention interface on tileattn's kernels (the face;
checks in tileattn/checks.py, the translation in translate.py, the op in tileattn/ops/flex.py).
"""

from __future__ import annotations

from ..ops import flex as flex_op


def flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None,
                   enable_gqa=False, return_lse=False, *, q_descale=None, k_descale=None,
                   v_descale=None):
    """Attention with a user score_mod and a BlockMask, as
    torch.nn.attention.flex_attention.flex_attention (same arguments, same layout).

    query [B, Hq, Sq, D], key [B or 1, Hkv, Sk, D], value [B or 1, Hkv, Sk, Dv]; fp16, bf16,
    float8_e4m3fn or float8_e5m2 (FP8: q_descale/k_descale/v_descale float32 [] or [B, heads]
    as tileattn.attention takes them); D and Dv in {64, 96, 128, 192, 256}. Hkv < Hq only
    with enable_gqa=True (Hq a multiple of Hkv). score_mod(score, b, h, q_idx, kv_idx) and
    the block mask's mask_mod(b, h, q_idx, kv_idx) are translated into kernel code
    (tileattn/flex/translate.py: the ops they may use, and the errors for others).
    scale defaults to 1/sqrt(D).

    Returns out [B, Hq, Sq, Dv] (bf16 for FP8 inputs, else the input dtype), and with
    return_lse=True also lse float32 [B, Hq, Sq], natural log. Rows that see no key give 0
    and lse -inf, as torch's flex_attention does.

    Differentiable for fp16/bf16 inputs (query, key, value; lse too): the backward visits the
    blocks the BlockMask lists, with score_mod's derivative translated as the functions are;
    key/value of batch 1 get gradients summed over the batch. FP8 inputs that require grad,
    and tensors captured by score_mod / mask_mod that require grad, are refused by name.
    """
    return flex_op.forward(query, key, value, score_mod=score_mod, block_mask=block_mask,
                           scale=scale, enable_gqa=enable_gqa, return_lse=return_lse,
                           q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
