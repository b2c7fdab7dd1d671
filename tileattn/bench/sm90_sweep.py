"""The Hopper Gluon kernel against the portable Triton kernel and cuDNN, on an sm90 GPU.

Z=4, H=32, N in {1024, 4096, 16384}, D in {64, 128, 256}, causal or not; bf16, and fp8 e4m3 for
the portable kernel (the Gluon kernel takes 16-bit inputs only). FP8 rows time the kernel on a
pre-transposed (K-major) V, as a user of prepare_v would call it; cuDNN runs bf16.
Each call's output is first checked against cuDNN bf16 on the same (dequantized) inputs.

    python -m tileattn.bench.sm90_sweep [--out DIR] [--budget-s SECONDS]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import time

import torch
from torch.nn.attention import SDPBackend

from ..arch import arch_of
from ..fp8 import prepare_v, quantize_fp8
from ..kernels.attention import fwd as attention_fwd, sm90 as attention_sm90
from .common import device_facts, time_ms
from .prefill import BATCH, CHECK_TOLERANCE, HEAD_DIMS, HEADS, _sdpa, flops

CONTEXTS = (1024, 4096, 16384)
cudnn_bf16 = _sdpa(SDPBackend.CUDNN_ATTENTION)


def providers(q, k, v, descales, causal, is_fp8):
    """name -> zero-argument callable returning the output [B, N, H, D]."""
    scale = q.shape[3] ** -0.5
    out = torch.empty(q.shape, device=q.device, dtype=torch.bfloat16)
    lse = None
    d = descales if is_fp8 else (None, None, None)
    runs = {}
    if not is_fp8:
        launch = attention_sm90.attention_sm90_launch(q, k, v, out, lse, scale, causal)
        runs["sm90"] = lambda: (launch.run(), out)[1]
    portable = attention_fwd.attention_launch(q, k, v, out, lse, *d, scale, causal, arch_of(q.device))
    runs["portable"] = lambda: (portable.run(), out)[1]
    return runs


def sweep(budget_s: float, out_dir: pathlib.Path, contexts=CONTEXTS,
          causal_values=(False, True)) -> dict:
    start = time.time()
    facts = device_facts()
    rows = []
    for head_dim in HEAD_DIMS:
        for context in contexts:
            for causal in causal_values:
                if time.time() - start > budget_s:
                    break
                gen = torch.Generator(device="cuda").manual_seed(context + head_dim)
                shape = (BATCH, context, HEADS, head_dim)
                x = [torch.randn(shape, device="cuda", generator=gen, dtype=torch.bfloat16)
                     for _ in range(3)]
                peer = cudnn_bf16(*x, causal).clone()
                row = {"head_dim": head_dim, "context": context, "causal": causal,
                       "cudnn-bf16": flops(context, head_dim, causal) / time_ms(
                           lambda: cudnn_bf16(*x, causal)) / 1e9}
                for precision in ("bf16", "fp8e4m3"):
                    is_fp8 = precision != "bf16"
                    if is_fp8:
                        quantized = [quantize_fp8(t) for t in x]
                        q, k, v = (t for t, _ in quantized)
                        descales = tuple(s for _, s in quantized)
                        v = prepare_v(v)
                        reference = cudnn_bf16(*[(t.float() * s).to(torch.bfloat16)
                                                 for t, s in quantized], causal)
                    else:
                        (q, k, v), descales, reference = x, (None,) * 3, peer
                    for name, fn in providers(q, k, v, descales, causal, is_fp8).items():
                        key = f"{name}-{precision}"
                        try:
                            got = fn().float()
                            error = float((got - reference.float()).norm() / reference.float().norm())
                            row[f"{key}-err"] = error
                            if not error < CHECK_TOLERANCE[precision]:
                                row[key] = None
                                continue
                            row[key] = flops(context, head_dim, causal) / time_ms(fn) / 1e9
                        except Exception as exc:  # record and go on: one bad row must not end the sweep
                            row[key] = None
                            row[f"{key}-error"] = repr(exc)[:300]
                    del q, k, v
                rows.append(row)
                print(json.dumps(row), flush=True)
                del x, peer
                torch.cuda.empty_cache()
                (out_dir / "sm90_sweep.json").write_text(json.dumps({**facts, "rows": rows}, indent=1))
    return {**facts, "rows": rows}


# Candidate configs per head_dim for --configs (each compiled for sm90 without spills).
CANDIDATES = {  # (block_n, num_stages, split): lockstep vs ping-pong consumers per table row
    64: [(128, 3, False), (128, 3, True)],
    128: [(128, 2, False), (128, 2, True)],
    256: [(64, 2, False), (64, 2, True)],
}


def config_sweep(out_dir: pathlib.Path, candidates=None, contexts=(4096, 16384),
                 causal_values=(False, True)) -> list[dict]:
    """TFLOP/s of each candidate config (default CANDIDATES), beside cuDNN bf16 on the same
    inputs; each candidate's output is checked against the first one's."""
    rows = []
    for head_dim, configs in (candidates or CANDIDATES).items():
        for context in contexts:
            for causal in causal_values:
                shape = (BATCH, context, HEADS, head_dim)
                x = [torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
                cudnn = flops(context, head_dim, causal) / time_ms(lambda: cudnn_bf16(*x, causal)) / 1e9
                q, k, v = x
                out = torch.empty(shape, device="cuda", dtype=torch.bfloat16)
                first = None
                for block_n, stages, split in configs:
                    config = attention_sm90.Sm90Config(block_n, stages, split=split)
                    row = {"head_dim": head_dim, "context": context,
                           "causal": causal, "block_n": block_n, "stages": stages, "split": split,
                           "cudnn-bf16": cudnn}
                    try:
                        launch = attention_sm90.attention_sm90_launch(
                            q, k, v, out, None, head_dim ** -0.5, causal, config=config)
                        launch.run()
                        got = out.float()
                        if first is None:
                            first = got.clone()
                        row["err_vs_first"] = float((got - first).norm() / first.norm())
                        row["tflops"] = flops(context, head_dim, causal) / time_ms(launch.run) / 1e9
                    except Exception as exc:  # noqa: BLE001 - out of resources etc.
                        row["error"] = repr(exc)[:200]
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                (out_dir / "sm90_configs.json").write_text(json.dumps(rows, indent=1))
    return rows


def table(result: dict) -> str:
    cols = ["sm90-bf16", "portable-bf16", "cudnn-bf16", "portable-fp8e4m3"]
    lines = ["| D | N | causal | " + " | ".join(cols) + " |", "|" + "---|" * (3 + len(cols))]
    for row in result["rows"]:
        cells = [f"{row[c]:.0f}" if row.get(c) else "-" for c in cols]
        lines.append(f"| {row['head_dim']} | {row['context']} | {'yes' if row['causal'] else 'no'} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--budget-s", type=float, default=1e9)
    parser.add_argument("--head-dims", default="64,128,256")
    parser.add_argument("--contexts", default=",".join(map(str, CONTEXTS)))
    parser.add_argument("--non-causal-only", action="store_true")
    parser.add_argument("--configs", action="store_true", help="time CANDIDATES instead")
    args = parser.parse_args()
    out_dir = pathlib.Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.configs:
        config_sweep(out_dir)
        return
    global HEAD_DIMS
    HEAD_DIMS = tuple(int(d) for d in args.head_dims.split(","))
    result = sweep(args.budget_s, out_dir, tuple(int(n) for n in args.contexts.split(",")),
                   (False,) if args.non_causal_only else (False, True))
    print(f"TFLOP/s, {result['device']}, {result['date']}")
    print(table(result))


if __name__ == "__main__":
    main()
