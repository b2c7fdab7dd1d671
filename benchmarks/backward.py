"""The backward grid of ../shared/BENCHMARKS.md: tileattn's backward kernels beside cuDNN, FA2
and FlexAttention, bf16, Z=4, H=32, D in {64, 128}, N in {1024, 4096, 16384}, causal or not.

Timed: tileattn's kernels alone (preprocess, dK/dV, then dQ conversion or the deterministic dQ
kernel, as one call of kernels.attention_bwd.attention_backward, with its workspace
allocation), out and lse coming from tileattn.attention beforehand; the peers'
torch.autograd.grad(out, (q, k, v), dout, retain_graph=True) on inputs [B, H, N, D] that
require grad. Every timed call's gradients are first compared with the yardstick peer's
(cuDNN, else FA2) on the same inputs. TFLOP/s = 2.5 x forward FLOPs / median time.

    python benchmarks/backward.py RESULTS.json [--quick]
    python benchmarks/backward.py SWEEP.json --sweep     # candidate tile configs at N=4096
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib

import torch
import torch.nn.functional as F

import tileattn
from tileattn.arch import arch_of
from tileattn.bench.common import Progress, device_facts, spin_up, time_ms
from tileattn.bench.prefill import BATCH, FLEX_CONTEXTS, HEADS
from tileattn.bench.prefill import flops as forward_flops
from tileattn.kernels.attention.bwd import attention_backward

HEAD_DIMS = (64, 128)
CONTEXTS = (1024, 4096, 16384)
# Largest relative L2 distance (worst of dq, dk, dv) to the yardstick peer's gradients on the
# same inputs that a timed call may have: two bf16 backward passes, each within 1.1e-2 of fp64
# (tests/conftest.py GRAD_TOLERANCES), are within about 2.2e-2 of each other.
CHECK_TOLERANCE = 3e-2


def backward_flops(context: int, head_dim: int, causal: bool) -> float:
    return 2.5 * forward_flops(context, head_dim, causal)


def _tileattn(deterministic: bool):
    """(prepare, run): the forward's out and lse once, then the backward kernels per call."""
    def prepare(q, k, v, dout, causal):
        with torch.no_grad():
            out, lse = tileattn.attention(q, k, v, causal=causal, return_lse=True)
        grads = tuple(torch.empty_like(x) for x in (q, k, v))
        arch = arch_of(q.device)
        softmax_scale = 1.0 / math.sqrt(q.shape[-1])

        def run():
            attention_backward(q, k, v, out, lse, dout, *grads, causal=causal,
                               softmax_scale=softmax_scale, window_left=-1, window_right=-1,
                               deterministic=deterministic, arch=arch)
            return grads
        return run
    return prepare


def _autograd_peer(forward):
    """(prepare, run) for a peer: inputs copied to [B, H, N, D] with requires_grad, one
    forward, then each call is the backward alone; gradients returned as [B, N, H, D]."""
    def prepare(q, k, v, dout, causal):
        leaves = [x.transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v)]
        out = forward(*leaves, causal)
        dout_bhnd = dout.transpose(1, 2).contiguous()

        def run():
            grads = torch.autograd.grad(out, leaves, dout_bhnd, retain_graph=True)
            return tuple(g.transpose(1, 2) for g in grads)
        return run
    return prepare


def _sdpa(backend):
    from torch.nn.attention import sdpa_kernel

    def forward(q, k, v, causal):
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return forward


def _flex():
    import torch._dynamo
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    # The default recompile limit of 8 silently falls back to an unfused path.
    torch._dynamo.config.cache_size_limit = 1000
    compiled = torch.compile(flex_attention, dynamic=False)
    masks = {}

    def forward(q, k, v, causal):
        block_mask = None
        if causal:
            key = (q.shape[2], q.device)
            if key not in masks:
                masks[key] = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None,
                                               q.shape[2], q.shape[2], device=q.device)
            block_mask = masks[key]
        return compiled(q, k, v, block_mask=block_mask)
    return forward


def providers() -> dict:
    """impl -> prepare(q, k, v, dout, causal) -> run() -> (dq, dk, dv). Peers that cannot be
    set up here are left out (and said so)."""
    from torch.nn.attention import SDPBackend
    table = {"tileattn": _tileattn(False), "tileattn-deterministic": _tileattn(True),
             "cudnn": _autograd_peer(_sdpa(SDPBackend.CUDNN_ATTENTION)),
             "fa2": _autograd_peer(_sdpa(SDPBackend.FLASH_ATTENTION))}
    try:
        table["flex"] = _autograd_peer(_flex())
    except Exception as error:  # noqa: BLE001 - report and go on without the peer
        print(f"flex attention unavailable: {error}")
    return table


def _distance(grads, reference) -> float:
    return max(float((g.float() - r.float()).norm() / r.float().norm())
               for g, r in zip(grads, reference))


def run(path: pathlib.Path, quick: bool = False) -> dict:
    device = torch.device("cuda")
    table = providers()
    head_dims, contexts = ((128,), (1024, 4096)) if quick else (HEAD_DIMS, CONTEXTS)
    points = [(d, c, n) for d in head_dims for c in (False, True) for n in contexts]
    rows = []
    progress = Progress(len(points) * len(table), "backward")
    spin_up()
    for head_dim, causal, context in points:
        gen = torch.Generator(device=device).manual_seed(context + head_dim)
        q, k, v, dout = (torch.randn(BATCH, context, HEADS, head_dim, device=device,
                                     generator=gen, dtype=torch.bfloat16) for _ in range(4))
        yardstick = None
        for impl in ("cudnn", "fa2"):
            try:
                yardstick = tuple(g.clone() for g in table[impl](q, k, v, dout, causal)())
                break
            except Exception:  # noqa: BLE001 - try the next peer
                continue
        if yardstick is None:
            print(f"\nD={head_dim} N={context} causal={causal}: neither cuDNN nor FA2 ran; "
                  "its timings are not checked (distance_to_yardstick null)")
        for impl, prepare in table.items():
            progress.step(f"{impl} D={head_dim} N={context} causal={causal}")
            if impl == "flex" and context not in FLEX_CONTEXTS:
                continue
            try:
                call = prepare(q, k, v, dout, causal)
                distance = _distance(call(), yardstick) if yardstick else None
                if yardstick and not distance < CHECK_TOLERANCE:
                    print(f"\n{impl} D={head_dim} N={context} causal={causal}: gradients "
                          f"{distance:.3g} from the yardstick, not timed")
                    continue
                ms = time_ms(call)
            except Exception as error:  # noqa: BLE001 - a peer that fails a shape is reported
                print(f"\n{impl} D={head_dim} N={context} causal={causal}: "
                      f"{type(error).__name__}: {str(error)[:200]}")
                continue
            rows.append({"D": head_dim, "causal": causal, "N": context, "impl": impl,
                         "dtype": "bf16", "ms": ms, "distance_to_yardstick": distance,
                         "tflops": backward_flops(context, head_dim, causal) / ms / 1e9})
            del call
        del q, k, v, dout, yardstick
        torch.cuda.empty_cache()
    payload = {**device_facts(device), "grid": "backward", "batch": BATCH, "heads": HEADS,
               "rows": rows}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1) + "\n")
    print(format_tables(payload))
    print(f"results: {path}")
    return payload


def format_tables(payload: dict) -> str:
    """One table per (D, causal): TFLOP/s per context and impl, then tileattn / best peer."""
    rows = payload["rows"]
    impls = sorted({r["impl"] for r in rows}, key=lambda i: (not i.startswith("tileattn"), i))
    lines = []
    for head_dim in sorted({r["D"] for r in rows}):
        for causal in (False, True):
            here = [r for r in rows if r["D"] == head_dim and r["causal"] == causal]
            if not here:
                continue
            lines.append(f"\nbackward D={head_dim} causal={causal}  (TFLOP/s)")
            lines.append("N".rjust(6) + "".join(f"{i:>24}" for i in impls) + "   tileattn/best peer")
            for context in sorted({r["N"] for r in here}):
                cell = {r["impl"]: r["tflops"] for r in here if r["N"] == context}
                text = f"{context:>6}" + "".join(
                    f"{cell[i]:>24.0f}" if i in cell else f"{'-':>24}" for i in impls)
                peers = [t for i, t in cell.items() if not i.startswith("tileattn")]
                if "tileattn" in cell and peers:
                    text += f"   {cell['tileattn'] / max(peers):.2f}x"
                lines.append(text)
    return "\n".join(lines)


# Tile candidates for sweep(): (block_m, block_n, warps, stages). dK/dV rows keep block_n keys
# and their fp32 dK, dV in registers; the table's rows are the ones ptxas compiles without
# spills on sm90 (see kernels/attention_bwd.py), the others trade spills for larger tiles.
DKDV_CANDIDATES = [(32, 128, 8, 2), (16, 128, 8, 2), (32, 64, 8, 2), (64, 128, 8, 1),
                   (64, 64, 4, 2), (32, 128, 4, 3), (64, 128, 8, 2), (16, 64, 4, 2)]
DQ_CANDIDATES = [(128, 64, 8, 2), (128, 32, 4, 3), (128, 32, 8, 2), (64, 64, 4, 3),
                 (128, 64, 8, 3), (64, 32, 4, 2)]


def sweep(path: pathlib.Path, context: int = 4096) -> dict:
    """Time candidate rows of DKDV_CONFIGS (default, atomic dQ) and DQ_CONFIGS (deterministic,
    with the table's dK/dV row) at Z=4 H=32 bf16; results written to path for the table."""
    from tileattn.kernels.attention import bwd as attention_bwd
    from tileattn.kernels.attention_fwd import TileConfig
    device = torch.device("cuda")
    arch = arch_of(device)
    rows = []
    spin_up()
    for head_dim in HEAD_DIMS:
        for causal in (False, True):
            gen = torch.Generator(device=device).manual_seed(head_dim)
            q, k, v, dout = (torch.randn(BATCH, context, HEADS, head_dim, device=device,
                                         generator=gen, dtype=torch.bfloat16) for _ in range(4))
            out, lse = tileattn.attention(q, k, v, causal=causal, return_lse=True)
            reference = _tileattn(True)(q, k, v, dout, causal)()
            reference = tuple(g.clone() for g in reference)
            grads = tuple(torch.empty_like(x) for x in (q, k, v))
            for kernel, candidates in (("dkdv", DKDV_CANDIDATES), ("dq", DQ_CANDIDATES)):
                for candidate in candidates:
                    tiles = TileConfig(*candidate)
                    deterministic = kernel == "dq"
                    delta, dq_accum = attention_bwd.backward_workspace(q, lse, deterministic)
                    launches = attention_bwd.backward_launches(
                        q, k, v, out, lse, dout, *grads, delta, dq_accum, causal=causal,
                        softmax_scale=1 / math.sqrt(head_dim), window_left=-1, window_right=-1,
                        arch=arch, **{f"{kernel}_tiles": tiles})

                    def call():
                        for launch in launches:
                            launch.run()
                    try:
                        call()
                        distance = _distance(grads, reference)
                        if not distance < CHECK_TOLERANCE:
                            print(f"D={head_dim} causal={causal} {kernel} {candidate}: "
                                  f"distance {distance:.3g}, not timed")
                            continue
                        ms = time_ms(call)
                    except Exception as error:  # noqa: BLE001 - out of resources etc.
                        print(f"D={head_dim} causal={causal} {kernel} {candidate}: "
                              f"{type(error).__name__}: {str(error)[:120]}")
                        continue
                    tflops = backward_flops(context, head_dim, causal) / ms / 1e9
                    rows.append({"D": head_dim, "causal": causal, "N": context, "kernel": kernel,
                                 "tiles": candidate, "ms": ms, "tflops": tflops})
                    print(f"D={head_dim} causal={causal} {kernel} {candidate}: {tflops:.0f} "
                          f"TFLOP/s", flush=True)
    payload = {**device_facts(device), "grid": "backward-tile-sweep", "batch": BATCH,
               "heads": HEADS, "rows": rows}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1) + "\n")
    return payload


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=pathlib.Path, help="JSON file to write")
    parser.add_argument("--quick", action="store_true", help="D=128, N in {1024, 4096} only")
    parser.add_argument("--sweep", action="store_true",
                        help="time candidate tile configs instead of the grid (N=4096)")
    args = parser.parse_args()
    if args.sweep:
        sweep(args.results)
    else:
        run(args.results, quick=args.quick)
