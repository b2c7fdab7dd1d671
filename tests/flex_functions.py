"""score_mods and mask_mods as FlexAttention users write them, shared by the flex tests."""

import torch


def _generator(seed=0):
    return torch.Generator().manual_seed(seed)


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def sliding_window(window):
    def sliding_window_causal(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx < window)
    return sliding_window_causal


def document(doc_ids):
    def document_mask(b, h, q_idx, kv_idx):
        return doc_ids[b, q_idx] == doc_ids[b, kv_idx]
    return document_mask


def prefix_lm(prefix_length):
    def prefix_lm_mask(b, h, q_idx, kv_idx):
        return (kv_idx < prefix_length) | (q_idx >= kv_idx)
    return prefix_lm_mask


def alibi(slopes):
    def alibi_bias(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (q_idx - kv_idx).abs()
    return alibi_bias


def linear_alibi(slopes):
    """ALiBi as FlexAttention's examples write it for a causal mask: linear in q - kv, no abs
    (flex/linear.py: the Hopper kernel adds it as row and column terms)."""
    def linear_alibi_bias(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (q_idx - kv_idx)
    return linear_alibi_bias


def distance_bias(slopes, bias):
    """Linear in q - kv too, written as separate terms, with a bias per batch entry and head:
    score + d + c (q - kv) for c = slopes[h] / 2, d = bias[b, h]."""
    def distance_bias_score(score, b, h, q_idx, kv_idx):
        return score + bias[b, h] + kv_idx * (-slopes[h]) / 2 + q_idx * slopes[h] / 2.0
    return distance_bias_score


def softcap(cap):
    def softcap_score(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)
    return softcap_score


def relative_position(table, max_distance):
    def relative_bias(score, b, h, q_idx, kv_idx):
        return score + table[h, (q_idx - kv_idx).clamp(-max_distance, max_distance) + max_distance]
    return relative_bias


def doc_ids_for(batch, length, documents, seed=0):
    """Sorted document ids per sequence: [batch, length] int32."""
    ids = torch.randint(0, documents, (batch, length), generator=_generator(seed))
    return ids.sort(dim=1).values.to(torch.int32)


def softcapped_document_bias(doc_ids, table, cap):
    def combined(score, b, h, q_idx, kv_idx):
        same = doc_ids[b, q_idx] == doc_ids[b, kv_idx]
        capped = cap * torch.tanh(score / cap)
        return torch.where(same, capped + table[h][(q_idx - kv_idx).abs() % 8], capped * 0.5)
    return combined


def every_op(score, b, h, q_idx, kv_idx):
    """One of each supported op, with negative integers (floor vs C division)."""
    d = q_idx - kv_idx
    integers = (d // 3 + d % 5 - torch.div(d, 4, rounding_mode="trunc") + torch.remainder(-d, 7)
                + d.abs() * 2 - torch.fmod(d, 3) + torch.maximum(d, -d // 2)
                + torch.clamp(d, min=-4) + (h + 1) ** 2 + (b * 7).neg())
    floats = (score.clamp(-2.0, 3.0) + torch.maximum(score, torch.zeros_like(score))
              + torch.minimum(score, d.float()) + torch.sigmoid(score) + torch.exp(-score.abs())
              + torch.log(score.abs() + 1) + torch.sqrt(score.abs()) + score ** 2
              + score.abs() ** 1.5 + torch.floor(score * 0.3) + torch.remainder(score, 0.7)
              + d / 7 + torch.tanh(score) + 1 / (score.abs() + 2))
    predicate = ((q_idx % 2 == 0) & ~(kv_idx > 5)) | (h == 1) | torch.logical_not(score < 0)
    as_double = score.to(torch.float64) * 0.1 + torch.where(predicate, 1.0, 0.0)
    return torch.where(predicate, floats, -floats) + integers.float() + as_double.float()
