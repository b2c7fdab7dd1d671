"""The backward grid of ../shared/BENCHMARKS.md: benchmarks/backward.py writes
results/<gpu>/backward.json (tileattn's backward beside cuDNN, FA2 and FlexAttention).

    python benchmarks/backward.py --quick            # D=128, N 1024/4096: ~2 min on an H100
    python benchmarks/backward.py --head-dims 64 --contexts 4096 16384   # a part of the grid
                                                     # (3 timing rounds: a device call's worth)
    python benchmarks/backward.py --head-dims 64 128 256 --contexts 1024
    python benchmarks/backward.py --merge A.json B.json C.json  # parts -> backward.json
    python benchmarks/backward.py --sweep            # candidate tile configs of the kernels

Grid: bf16, Z=4, H=32, D in {64, 128, 256}, N in {1024, 4096, 16384}, causal or not (--quick:
D=128, N 1024 and 4096, Flex at 4096 only: its fwd+bwd compiles per shape dominate). Every
implementation runs through autograd from its own layout: tileattn.attention on [B, N, H, D]
leaves (deterministic=False, and True as "tileattn-deterministic"), the peers (prefill.py's
SDPA/cuDNN, SDPA/FA2 and compiled FlexAttention) on [B, H, N, D] leaves. Two passes are timed:
"backward", torch.autograd.grad(out, (q, k, v), dout, retain_graph=True) after one forward,
and "forward+backward", the implementations interleaved over common.ROUNDS rounds (a
point's graphs all alive at once); "ms" is the median, "ms_rounds" every round. TFLOP/s = 2.5
(backward) or 3.5 (forward+backward) x prefill.flops. Before timing, each implementation's
gradients are compared with the yardstick peer's (cuDNN, else FA2) on the same inputs. Rows:
{"D", "causal", "N", "impl", "dtype", "pass", "ms", "ms_rounds", "tflops",
"distance_to_yardstick"}. --sweep writes `backward-tile-sweep.json` under --out (default $OUT):
evidence for the config tables of tileattn/kernels/attention/bwd.py.
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics

import torch

from tileattn.bench import runs
from tileattn.bench.common import device_facts, spin_up, time_interleaved, time_ms, write_json
from tileattn.bench.prefill import BATCH, FLEX_CONTEXTS, HEADS, _flex, _sdpa, flops

GRID = "backward"
HEAD_DIMS = (64, 128, 256)
CONTEXTS = (1024, 4096, 16384)
QUICK = dict(head_dims=(128,), contexts=(1024, 4096))
QUICK_FLEX_CONTEXTS = (4096,)
POINT_FIELDS = ("D", "causal", "N")
PASSES = {"backward": 2.5, "forward+backward": 3.5}   # FLOPs as multiples of the forward's
# Largest relative L2 distance (worst of dq, dk, dv) to the yardstick's gradients that a timed
# call may have: two bf16 backward passes, each within 1.1e-2 of fp64 (tests/conftest.py
# GRAD_TOLERANCES), are within about 2.2e-2 of each other.
CHECK_TOLERANCE = 3e-2


def grid_points(head_dims=HEAD_DIMS, contexts=CONTEXTS) -> list[dict]:
    return [dict(D=d, causal=c, N=n) for d in head_dims for c in (False, True) for n in contexts]


def pass_flops(context: int, head_dim: int, causal: bool, timed: str) -> float:
    return PASSES[timed] * flops(context, head_dim, causal)


def _tileattn(deterministic: bool):
    """forward(q, k, v, causal) on [B, N, H, D] leaves: tileattn.attention's autograd."""
    import tileattn

    def forward(q, k, v, causal):
        return tileattn.attention(q, k, v, causal=causal, deterministic=deterministic)
    return forward


def implementations() -> dict:
    """impl -> (leaves in [B, H, N, D]?, forward(q, k, v, causal) -> out [B, N, H, D]). The
    peers are prefill.py's, given [B, N, H, D] views of their [B, H, N, D] leaves (which they
    transpose back, so SDPA and Flex see contiguous [B, H, N, D])."""
    from torch.nn.attention import SDPBackend
    table = {"tileattn": (False, _tileattn(False)),
             "tileattn-deterministic": (False, _tileattn(True)),
             "cudnn": (True, _sdpa(SDPBackend.CUDNN_ATTENTION)),
             "fa2": (True, _sdpa(SDPBackend.FLASH_ATTENTION))}
    try:
        table["flex"] = (True, _flex())
    except Exception as error:  # noqa: BLE001 - report and go on without the peer
        print(f"flex attention unavailable: {error}")
    return table


def _calls(heads_major: bool, forward, q, k, v, dout, causal):
    """(backward call, forward+backward call), both returning (dq, dk, dv) as [B, N, H, D]."""
    as_leaf = (lambda x: x.transpose(1, 2).contiguous()) if heads_major else torch.clone
    leaves = [as_leaf(x).requires_grad_() for x in (q, k, v)]
    views = [x.transpose(1, 2) if heads_major else x for x in leaves]
    grad_out = as_leaf(dout)
    grad_out = grad_out.transpose(1, 2) if heads_major else grad_out
    out = forward(*views, causal)

    def layout(grads):
        return tuple(g.transpose(1, 2) if heads_major else g for g in grads)

    def backward():
        return layout(torch.autograd.grad(out, leaves, grad_out, retain_graph=True))

    def forward_backward():
        return layout(torch.autograd.grad(forward(*views, causal), leaves, grad_out))
    return backward, forward_backward


def _distance(grads, reference) -> float:
    return max(float((g.float() - r.float()).norm() / r.float().norm())
               for g, r in zip(grads, reference))


def measure(point: dict, table: dict, device=None, flex_contexts=FLEX_CONTEXTS) -> list[dict]:
    """The rows of one (D, causal, N): every implementation, both passes, checked first."""
    head_dim, causal, context = point["D"], point["causal"], point["N"]
    device = device or torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(context + head_dim)
    q, k, v, dout = (torch.randn(BATCH, context, HEADS, head_dim, device=device, generator=gen,
                                 dtype=torch.bfloat16) for _ in range(4))
    yardstick = None
    for impl in ("cudnn", "fa2"):
        try:
            backward, _ = _calls(*table[impl], q, k, v, dout, causal)
            yardstick = tuple(g.clone() for g in backward())
            break
        except Exception:  # noqa: BLE001 - try the next peer
            continue
    if yardstick is None:
        print(f"\n{point}: neither cuDNN nor FA2 ran; timings unchecked (distance null)")
    checked = {}   # impl -> (pass -> call, distance): every implementation's graph stays alive
    for impl, (heads_major, forward) in table.items():
        if impl == "flex" and context not in flex_contexts:
            continue
        try:
            calls = dict(zip(PASSES, _calls(heads_major, forward, q, k, v, dout, causal)))
            distance = _distance(calls["backward"](), yardstick) if yardstick else None
            if yardstick and not distance < CHECK_TOLERANCE:
                print(f"\n{impl} {point}: gradients {distance:.3g} from the yardstick, not timed")
                continue
            checked[impl] = (calls, distance)
        except Exception as error:  # noqa: BLE001 - a peer that fails a shape is reported
            print(f"\n{impl} {point}: {type(error).__name__}: {str(error)[:200]}")
    rows = []
    for timed in PASSES:
        times = time_interleaved({impl: calls[timed] for impl, (calls, _) in checked.items()})
        for impl, (_, distance) in checked.items():
            ms = statistics.median(times[impl])
            rows.append({**point, "impl": impl, "dtype": "bf16", "pass": timed, "ms": ms,
                         "ms_rounds": times[impl],
                         "tflops": pass_flops(context, head_dim, causal, timed) / ms / 1e9,
                         "distance_to_yardstick": distance})
    checked = None
    torch.cuda.empty_cache()
    return rows


def format_tables(rows: list[dict]) -> str:
    """One table per (pass, D, causal): TFLOP/s per context and impl, then tileattn / best peer."""
    impls = sorted({r["impl"] for r in rows}, key=lambda i: (not i.startswith("tileattn"), i))
    lines = []
    for timed in PASSES:
        for head_dim in sorted({r["D"] for r in rows}):
            for causal in (False, True):
                here = [r for r in rows
                        if (r["pass"], r["D"], r["causal"]) == (timed, head_dim, causal)]
                if not here:
                    continue
                lines += [f"\n{timed} D={head_dim} causal={causal}  (TFLOP/s)",
                          "N".rjust(6) + "".join(f"{i:>24}" for i in impls)
                          + "   tileattn/best peer"]
                for context in sorted({r["N"] for r in here}):
                    cell = {r["impl"]: r["tflops"] for r in here if r["N"] == context}
                    text = f"{context:>6}" + "".join(
                        f"{cell[i]:>24.0f}" if i in cell else f"{'-':>24}" for i in impls)
                    peers = [t for i, t in cell.items() if not i.startswith("tileattn")]
                    if "tileattn" in cell and peers:
                        text += f"   {cell['tileattn'] / max(peers):.2f}x"
                    lines.append(text)
    return "\n".join(lines)


def run(args) -> None:
    device = torch.device("cuda")
    head_dims, contexts = ((QUICK["head_dims"], QUICK["contexts"]) if args.quick
                           else (tuple(args.head_dims), tuple(args.contexts)))
    table = implementations()
    grid = runs.GridRun(GRID, device_facts(device), grid_points(head_dims, contexts),
                        grid_points(), POINT_FIELDS, args.out, args.budget_s,
                        batch=BATCH, heads=HEADS)
    spin_up()
    flex_contexts = QUICK_FLEX_CONTEXTS if args.quick else FLEX_CONTEXTS
    for point in grid:
        grid.add(point, measure(point, table, device, flex_contexts))
    path = grid.finish()
    print(format_tables(grid.rows))
    print(f"results: {path}")


# Tile candidates for --sweep, per padded head dim: (block_m, block_n, warps, stages). dK/dV
# rows keep block_n keys and their fp32 dK, dV in registers; some spill (benchmarks/
# backward_registers.py) and are here because larger MMA tiles can pay for spills.
SWEEP_CANDIDATES = {
    64: dict(dkdv=[(32, 128, 8, 2), (32, 128, 4, 3), (64, 64, 4, 3), (64, 64, 4, 2),
                   (64, 128, 8, 2)],
             dq=[(128, 64, 8, 2), (128, 64, 8, 3), (64, 64, 4, 2)]),
    128: dict(dkdv=[(16, 128, 8, 2), (64, 128, 8, 2), (32, 128, 8, 3), (64, 128, 8, 1),
                    (32, 128, 8, 2)],
              dq=[(128, 64, 8, 2), (128, 64, 8, 3), (128, 128, 8, 2), (64, 64, 4, 2)]),
    256: dict(dkdv=[(16, 64, 8, 2), (32, 64, 8, 2), (64, 64, 8, 2), (32, 64, 8, 1),
                    (64, 64, 8, 1), (64, 64, 4, 2)],
              dq=[(128, 32, 8, 2), (64, 32, 4, 2), (64, 64, 8, 2), (128, 64, 8, 2)]),
}
SWEEP_CONTEXTS = (4096, 16384)


def sweep(args) -> None:
    """Time the whole backward (the kernels alone, bf16, Z=4 H=32) for candidate tiles: the
    atomic-dQ mode with each dK/dV candidate, and the deterministic mode (a dQ pass) with each
    (dK/dV, dQ) pair; every candidate is checked against the table's deterministic gradients
    first. Rows: D, causal, N, mode, dkdv, dq (tiles or null), ms, tflops."""
    import tileattn
    from tileattn.arch import arch_of
    from tileattn.kernels.attention import bwd
    from tileattn.kernels.attention.fwd import TileConfig
    device = torch.device("cuda")
    arch = arch_of(device)
    rows, path = [], None
    spin_up()
    for (head_dim, candidates), context, causal in itertools.product(
            SWEEP_CANDIDATES.items(), SWEEP_CONTEXTS, (False, True)):
        gen = torch.Generator(device=device).manual_seed(head_dim)
        q, k, v, dout = (torch.randn(BATCH, context, HEADS, head_dim, device=device,
                                     generator=gen, dtype=torch.bfloat16) for _ in range(4))
        out, lse = tileattn.attention(q, k, v, causal=causal, return_lse=True)
        reference = tuple(torch.empty_like(x) for x in (q, k, v))
        options = dict(causal=causal, softmax_scale=1 / math.sqrt(head_dim), window_left=-1,
                       window_right=-1, arch=arch)
        bwd.attention_backward(q, k, v, out, lse, dout, *reference, deterministic=True,
                               **options)
        grads = tuple(torch.empty_like(x) for x in (q, k, v))
        pairs = ([("atomic", t, None) for t in candidates["dkdv"]]
                 + [("deterministic", t, u) for t in candidates["dkdv"] for u in candidates["dq"]])
        for mode, dkdv_tiles, dq_tiles in pairs:
            delta, dq_accum = bwd.backward_workspace(q, lse, mode == "deterministic")
            launches = bwd.backward_launches(
                q, k, v, out, lse, dout, *grads, delta, dq_accum,
                dkdv_tiles=TileConfig(*dkdv_tiles),
                dq_tiles=TileConfig(*dq_tiles) if dq_tiles else None, **options)

            def call():
                for launch in launches:
                    launch.run()
            label = f"D={head_dim} N={context} causal={causal} {mode} {dkdv_tiles} {dq_tiles}"
            try:
                call()
                distance = _distance(grads, reference)
                if not distance < CHECK_TOLERANCE:
                    print(f"{label}: distance {distance:.3g}, not timed")
                    continue
                ms = time_ms(call)
            except Exception as error:  # noqa: BLE001 - out of resources etc.
                print(f"{label}: {type(error).__name__}: {str(error)[:120]}")
                continue
            tflops = pass_flops(context, head_dim, causal, "backward") / ms / 1e9
            rows.append({"D": head_dim, "causal": causal, "N": context, "mode": mode,
                         "dkdv": dkdv_tiles, "dq": dq_tiles, "ms": ms, "tflops": tflops})
            print(f"{label}: {tflops:.0f} TFLOP/s", flush=True)
            # After every row, so that a call cut short keeps what it measured.
            path = write_json("backward-tile-sweep", {**device_facts(device), "batch": BATCH,
                                                      "heads": HEADS, "rows": rows}, args.out)
    print(f"wrote {path}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python benchmarks/backward.py",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"D={QUICK['head_dims']}, N={QUICK['contexts']} (a partial run)")
    parser.add_argument("--head-dims", type=int, nargs="+", default=list(HEAD_DIMS),
                        choices=HEAD_DIMS, help="the part of the full grid to run")
    parser.add_argument("--contexts", type=int, nargs="+", default=list(CONTEXTS),
                        choices=CONTEXTS, help="with --head-dims, a smaller part")
    runs.add_grid_options(parser, "backward")
    parser.add_argument("--sweep", action="store_true",
                        help="time candidate tile configs instead (N 4096 and 16384)")
    args = parser.parse_args(argv)
    if runs.merged_or_needs_gpu(args, grid_points(), POINT_FIELDS, "benchmarks/backward.py"):
        return
    if args.sweep:
        sweep(args)
    else:
        run(args)


if __name__ == "__main__":
    main()
