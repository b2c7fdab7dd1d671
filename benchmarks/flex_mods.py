"""tileattn.flex_attention vs torch.compile(flex_attention) on masks and score mods (H100).

B=4, H=32, D=128, N=16384 (--quick: N=4096), bf16, and FP8 e4m3 where each runs it. Cases:
causal; sliding window 1024 (causal); document masking, 16 documents per sequence (causal,
packed-training style, boundaries from a fixed seed); prefix-LM with a 2048-token prefix;
ALiBi score_mod under a causal mask. Both implementations get the same BlockMask (torch's
default 128x128 blocks) and the same functions.

Each call is first checked against an fp32 reference on 512 query rows (the first and last
256, every head of sequence 0) computed from the same (quantized) inputs; a call that fails
its check is recorded with its error and not timed. Timing: do_bench median (tileattn/bench).
FLOPs count only visible work, from the exact mask density: 4 * D * H * (number of visible
(query, key) pairs), summed over the batch; the fraction of 128x128 blocks the BlockMask
visits is recorded too.

    python benchmarks/flex_mods.py OUT.json [--quick] [--cases causal,alibi]
"""

from __future__ import annotations

import argparse
import json
import math

import torch
import torch._dynamo
from torch.nn.attention.flex_attention import create_block_mask
from torch.nn.attention.flex_attention import flex_attention as torch_flex_attention

import tileattn
from tileattn.bench.common import device_facts, spin_up, time_ms
from tileattn.flex import flex_attention

BATCH, HEADS, HEAD_DIM = 4, 32, 128
WINDOW, DOCUMENTS, PREFIX = 1024, 16, 2048
CHECK_ROWS = 256
# Relative L2 error against the fp32 reference on the same inputs (tests/conftest.py's
# TOLERANCES, which are measured against fp64).
CHECK_TOLERANCE = {"bf16": 8e-3, "fp8e4m3": 5e-2}


def masks_and_mods(case: str, context: int, device):
    """(mask_mod, score_mod, block-mask batch size) of a case. The functions broadcast, so
    the reference evaluates them on index tensors directly."""
    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx
    if case == "causal":
        return causal, None, 1
    if case == "sliding_window":
        def sliding_window(b, h, q_idx, kv_idx):
            return (q_idx >= kv_idx) & (q_idx - kv_idx < WINDOW)
        return sliding_window, None, 1
    if case == "document":
        gen = torch.Generator().manual_seed(16)
        cuts = torch.stack([torch.randperm(context - 1, generator=gen)[:DOCUMENTS - 1].sort().values
                            + 1 for _ in range(BATCH)])
        positions = torch.arange(context)
        doc_ids = torch.stack([torch.searchsorted(c, positions, right=True) for c in cuts])
        doc_ids = doc_ids.to(torch.int32).to(device)

        def document_causal(b, h, q_idx, kv_idx):
            return (doc_ids[b, q_idx] == doc_ids[b, kv_idx]) & (q_idx >= kv_idx)
        return document_causal, None, BATCH
    if case == "prefix_lm":
        def prefix_lm(b, h, q_idx, kv_idx):
            return (kv_idx < PREFIX) | (q_idx >= kv_idx)
        return prefix_lm, None, 1
    if case == "alibi":
        slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / HEADS) for i in range(HEADS)],
                              device=device)

        def alibi(score, b, h, q_idx, kv_idx):
            return score - slopes[h] * (q_idx - kv_idx)
        return causal, alibi, 1
    raise KeyError(case)


CASES = ("causal", "sliding_window", "document", "prefix_lm", "alibi")


def visible_pairs(mask_mod, context: int, device) -> int:
    """Exact number of visible (query, key) pairs over the batch (heads share the mask)."""
    total = 0
    keys = torch.arange(context, device=device)[None, :]
    for b in range(BATCH):
        batch = torch.tensor(b, device=device)
        for start in range(0, context, 2048):
            rows = torch.arange(start, min(start + 2048, context), device=device)[:, None]
            total += int(mask_mod(batch, batch * 0, rows, keys).sum())
    return total


def reference_rows(q, k, v, scale, mask_mod, score_mod, rows):
    """fp32 attention of sequence 0's query rows `rows` (all heads): [H, len(rows), D]."""
    q, k, v = (x[0].float() for x in (q, k, v))
    scores = torch.einsum("hqd,hkd->hqk", q[:, rows], k) * scale
    heads = torch.arange(HEADS, device=q.device)[:, None, None]
    q_idx = rows[None, :, None]
    kv_idx = torch.arange(k.shape[1], device=q.device)[None, None, :]
    batch = torch.tensor(0, device=q.device)
    if score_mod is not None:
        scores = score_mod(scores, batch, heads, q_idx, kv_idx)
    scores = scores.masked_fill(~mask_mod(batch, heads, q_idx, kv_idx), float("-inf"))
    return torch.einsum("hqk,hkd->hqd", torch.softmax(scores, dim=-1), v)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="results JSON path")
    parser.add_argument("--quick", action="store_true", help="N=4096 instead of 16384")
    parser.add_argument("--cases", default=",".join(CASES))
    arguments = parser.parse_args()
    context = 4096 if arguments.quick else 16384
    device = torch.device("cuda")
    # The default recompile limit of 8 silently falls back to an unfused path.
    torch._dynamo.config.cache_size_limit = 1000
    compiled_flex = torch.compile(torch_flex_attention, dynamic=False)
    scale = 1.0 / math.sqrt(HEAD_DIM)
    gen = torch.Generator(device=device).manual_seed(0)
    inputs = [torch.randn(BATCH, HEADS, context, HEAD_DIM, device=device, generator=gen)
              for _ in range(3)]
    bf16 = [x.bfloat16() for x in inputs]
    quantized = [tileattn.quantize_fp8(x) for x in inputs]
    fp8 = [x for x, _ in quantized]
    qd, kd, vd = (d for _, d in quantized)
    check_rows = torch.cat([torch.arange(CHECK_ROWS), torch.arange(context - CHECK_ROWS, context)]
                           ).to(device)
    spin_up()
    rows = []
    for case in arguments.cases.split(","):
        mask_mod, score_mod, mask_batch = masks_and_mods(case, context, device)
        block_mask = create_block_mask(mask_mod, mask_batch, 1, context, context, device=device)
        pairs = visible_pairs(mask_mod, context, device)
        flop = 4 * HEAD_DIM * HEADS * pairs
        visited = int(block_mask.kv_num_blocks.sum()) + int(block_mask.full_kv_num_blocks.sum())
        block_density = visited / (mask_batch * block_mask.kv_num_blocks.shape[-1] ** 2)
        calls = {
            ("tileattn", "bf16"): (bf16, lambda: flex_attention(
                *bf16, score_mod=score_mod, block_mask=block_mask)),
            ("flex", "bf16"): (bf16, lambda: compiled_flex(
                *bf16, score_mod=score_mod, block_mask=block_mask)),
            ("tileattn", "fp8e4m3"): (fp8, lambda: flex_attention(
                *fp8, score_mod=score_mod, block_mask=block_mask, q_descale=qd, k_descale=kd,
                v_descale=vd)),
            # torch's flex takes no descales: q's and k's go into the scale, v's onto the output.
            ("flex", "fp8e4m3"): (fp8, lambda: compiled_flex(
                *fp8, score_mod=score_mod, block_mask=block_mask,
                scale=scale * float(qd) * float(kd)).float() * float(vd)),
        }
        for (impl, dtype), (operands, call) in calls.items():
            row = {"case": case, "impl": impl, "dtype": dtype, "N": context,
                   "density": pairs / (BATCH * context * context),
                   "block_density": block_density}
            try:
                out = call()
                descaled = operands if dtype == "bf16" else [
                    x.float() * d for x, d in zip(operands, (qd, kd, vd))]
                want = reference_rows(*descaled, scale, mask_mod, score_mod, check_rows)
                got = out[0][:, check_rows].float()
                row["check_error"] = float((got - want).norm() / want.norm())
                if row["check_error"] <= CHECK_TOLERANCE[dtype]:
                    ms = time_ms(call)
                    row.update(ms=ms, tflops=flop / ms / 1e9)
                else:
                    row["tflops"] = None
            except Exception as error:  # noqa: BLE001 - record and go on with the other rows
                row.update(tflops=None, error=f"{type(error).__name__}: {str(error)[:300]}")
            rows.append(row)
            print(json.dumps(row), flush=True)
    payload = {**device_facts(device), "batch": BATCH, "heads": HEADS, "head_dim": HEAD_DIM,
               "flop_count": "4 * D * H * visible (query, key) pairs (exact mask density)",
               "rows": rows}
    with open(arguments.out, "w") as f:
        json.dump(payload, f, indent=1)


if __name__ == "__main__":
    main()
