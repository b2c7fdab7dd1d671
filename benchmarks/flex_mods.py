"""The mods grid: benchmarks/flex_mods.py writes results/<gpu>/mods.json, tileattn.flex_attention
beside torch.compile(flex_attention) on the same masks and score mods.

    python benchmarks/flex_mods.py --quick          # N=4096, bf16: ~1.5 min on an H100 (partial)
    python benchmarks/flex_mods.py                  # N=16384, bf16 and fp8e4m3 (~4 min)
    python benchmarks/flex_mods.py --cases causal alibi   # part of the grid
    python benchmarks/flex_mods.py --merge A.json B.json  # parts -> mods.json when complete

B=4, H=32, D=128. Cases: causal; sliding window 1024 (causal, tileattn/bench/flex_peer.py's
mask); document masking, 16 documents per sequence (causal, packed-training style, boundaries
from a fixed seed); prefix-LM with a 2048-token prefix; ALiBi score_mod under a causal mask.
Both implementations get the same BlockMask (torch's default 128x128 blocks) and the same
functions; FP8 (e4m3, per-tensor descales) where each runs it: torch's flex takes no descales,
so q's and k's go into its scale and v's onto its output.

Each call is first checked against an fp32 reference on 512 query rows (the first and last
256, every head of sequence 0) computed from the same (quantized) inputs; a call that fails its
check is recorded with its error and not timed. Timing: common.time_ms, the two implementations
interleaved for common.ROUNDS rounds (common.time_interleaved); "ms" is the median of the rounds'
medians, "ms_rounds" all of them. FLOPs count only the
visible work (flex_peer.mask_flops: the exact mask density); the fraction of 128x128 blocks the
BlockMask visits is recorded too. Rows: {"case", "impl" (tileattn | flex), "dtype", "N", "ms",
"ms_rounds", "tflops", "density", "block_density", "check_error"}.
"""

from __future__ import annotations

import argparse
import math
import statistics

import torch

from tileattn.bench import flex_peer, runs
from tileattn.bench.common import device_facts, spin_up, time_interleaved

GRID = "mods"
POINT_FIELDS = ("case", "dtype", "N")
BATCH, HEADS, HEAD_DIM = 4, 32, 128
CONTEXT, QUICK_CONTEXT = 16384, 4096
DTYPES = ("bf16", "fp8e4m3")
WINDOW, DOCUMENTS, PREFIX = 1024, 16, 2048
CASES = ("causal", "sliding_window", "document", "prefix_lm", "alibi")
CHECK_ROWS = 256
# Relative L2 error against the fp32 reference on the same inputs (tests/conftest.py's
# TOLERANCES, which are measured against fp64).
CHECK_TOLERANCE = {"bf16": 8e-3, "fp8e4m3": 5e-2}


def grid_points(quick: bool = False, cases=CASES) -> list[dict]:
    context, dtypes = (QUICK_CONTEXT, ("bf16",)) if quick else (CONTEXT, DTYPES)
    return [dict(case=c, dtype=d, N=context) for c in cases for d in dtypes]


def masks_and_mods(case: str, context: int, device):
    """(mask_mod, score_mod, block-mask batch size) of a case. The functions broadcast, so
    the reference evaluates them on index tensors directly."""
    if case == "causal":
        return flex_peer.causal, None, 1
    if case == "sliding_window":
        return flex_peer.sliding_window(WINDOW), None, 1
    if case == "document":
        gen = torch.Generator().manual_seed(16)
        cuts = torch.stack([torch.randperm(context - 1, generator=gen)[:DOCUMENTS - 1].sort().values
                            + 1 for _ in range(BATCH)])
        positions = torch.arange(context)
        document_ids = torch.stack([torch.searchsorted(c, positions, right=True) for c in cuts])
        return flex_peer.document_causal(document_ids.to(torch.int32).to(device)), None, BATCH
    if case == "prefix_lm":
        prefix = PREFIX   # a closure value, not a global: torch.compile need not import this file

        def prefix_lm(b, h, q_idx, kv_idx):
            return (kv_idx < prefix) | (q_idx >= kv_idx)
        return prefix_lm, None, 1
    if case == "alibi":
        slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / HEADS) for i in range(HEADS)],
                              device=device)

        def alibi(score, b, h, q_idx, kv_idx):
            return score - slopes[h] * (q_idx - kv_idx)
        return flex_peer.causal, alibi, 1
    raise KeyError(case)


def reference_rows(q, k, v, scale, mask_mod, score_mod, rows):
    """fp32 attention of sequence 0's query rows `rows` (all heads): [H, len(rows), D]. The
    fp64 tileattn.reference has no user mask functions; these rows apply the case's own."""
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


def make_inputs(context: int, device) -> dict:
    """dtype -> (q, k, v [B, H, N, D], descales) from one draw of fp32 normal values."""
    import tileattn
    gen = torch.Generator(device=device).manual_seed(0)
    inputs = [torch.randn(BATCH, HEADS, context, HEAD_DIM, device=device, generator=gen)
              for _ in range(3)]
    quantized = [tileattn.quantize_fp8(x) for x in inputs]
    return {"bf16": ([x.bfloat16() for x in inputs], (None, None, None)),
            "fp8e4m3": ([x for x, _ in quantized], tuple(d for _, d in quantized))}


def measure(point: dict, inputs: dict, device) -> list[dict]:
    """tileattn and flex rows of one (case, dtype, N)."""
    from torch.nn.attention.flex_attention import create_block_mask

    from tileattn.flex import flex_attention
    case, dtype, context = point["case"], point["dtype"], point["N"]
    compiled_flex = flex_peer.compiled_flex_attention()
    scale = 1.0 / math.sqrt(HEAD_DIM)
    operands, (qd, kd, vd) = inputs[dtype]
    mask_mod, score_mod, mask_batch = masks_and_mods(case, context, device)
    block_mask = create_block_mask(mask_mod, mask_batch, 1, context, context, device=device)
    flops = flex_peer.mask_flops(mask_mod, BATCH, HEADS, HEAD_DIM, context, context, device)
    visited = int(block_mask.kv_num_blocks.sum()) + int(block_mask.full_kv_num_blocks.sum())
    block_density = visited / (mask_batch * block_mask.kv_num_blocks.shape[-1] ** 2)
    rows_checked = torch.cat([torch.arange(CHECK_ROWS),
                              torch.arange(context - CHECK_ROWS, context)]).to(device)
    descaled = (operands if dtype == "bf16"
                else [x.float() * d for x, d in zip(operands, (qd, kd, vd))])
    want = reference_rows(*descaled, scale, mask_mod, score_mod, rows_checked)
    if dtype == "bf16":
        calls = {"tileattn": lambda: flex_attention(*operands, score_mod=score_mod,
                                                    block_mask=block_mask),
                 "flex": lambda: compiled_flex(*operands, score_mod=score_mod,
                                               block_mask=block_mask)}
    else:
        calls = {"tileattn": lambda: flex_attention(
                    *operands, score_mod=score_mod, block_mask=block_mask, q_descale=qd,
                    k_descale=kd, v_descale=vd),
                 "flex": lambda: compiled_flex(
                    *operands, score_mod=score_mod, block_mask=block_mask,
                    scale=scale * float(qd) * float(kd)).float() * float(vd)}
    rows, timed = {}, {}
    for impl, call in calls.items():
        row = rows[impl] = {**point, "impl": impl, "flops": flops,
                            "density": flops / (4.0 * HEAD_DIM * HEADS * BATCH * context * context),
                            "block_density": block_density, "tflops": None}
        try:
            got = call()[0][:, rows_checked].float()
            row["check_error"] = float((got - want).norm() / want.norm())
            if row["check_error"] <= CHECK_TOLERANCE[dtype]:
                timed[impl] = call
        except Exception as error:  # noqa: BLE001 - record and go on with the other rows
            row["error"] = f"{type(error).__name__}: {str(error)[:300]}"
    for impl, times in time_interleaved(timed).items():
        rows[impl].update(ms=statistics.median(times), ms_rounds=times,
                          tflops=flops / statistics.median(times) / 1e9)
    return list(rows.values())


def format_table(rows: list[dict]) -> str:
    lines = [f"{'case':<16}{'dtype':<9}{'N':>7}{'tileattn':>10}{'flex':>10}  TFLOP/s, ratio"]
    for key in dict.fromkeys(runs.point_key(r, POINT_FIELDS) for r in rows):
        cell = {r["impl"]: r.get("tflops") for r in rows if runs.point_key(r, POINT_FIELDS) == key}
        ours, theirs = cell.get("tileattn"), cell.get("flex")
        text = "".join(f"{v:>10.0f}" if v else f"{'-':>10}" for v in (ours, theirs))
        ratio = f"  {ours / theirs:.2f}x" if ours and theirs else ""
        lines.append(f"{key[0]:<16}{key[1]:<9}{key[2]:>7}{text}{ratio}")
    return "\n".join(lines)


def run(args) -> None:
    device = torch.device("cuda")
    points = grid_points(args.quick, args.cases)
    grid = runs.GridRun(GRID, device_facts(device), points, grid_points(), POINT_FIELDS,
                        args.out, args.budget_s, batch=BATCH, heads=HEADS, head_dim=HEAD_DIM,
                        flop_count="4 * D * H * visible (query, key) pairs (exact mask density)")
    inputs = make_inputs(points[0]["N"], device) if points else {}
    spin_up()
    for point in grid:
        grid.add(point, measure(point, inputs, device))
    path = grid.finish()
    print("\n" + format_table(grid.rows))
    print(f"results: {path}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python benchmarks/flex_mods.py",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"N={QUICK_CONTEXT}, bf16 only")
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    runs.add_grid_options(parser, "mods")
    args = parser.parse_args(argv)
    if not runs.merged_or_needs_gpu(args, grid_points(), POINT_FIELDS, "benchmarks/flex_mods.py"):
        run(args)


if __name__ == "__main__":
    main()
