"""Tile-config sweep of a forward kernel: candidate rows of its config table timed alone.

Each candidate is launched explicitly with `config=` (kernels/attention/fwd.py attention_launch
for the portable kernel, kernels/attention/sm90.py attention_sm90_launch for the Hopper one),
so neither the table, the dispatch rule nor the call cache is touched; FP8 inputs pass V
K-major, as attention() hands it to the kernel on sm89/sm90 (to the Hopper kernel in grouped
key order). The table row's output is checked
against the fp64 reference (first batch element) and every candidate's against the table row's
before it is timed (do_bench median). This fills the
CONFIGS / CAUSAL_CONFIGS tables for a chip (docs/design.md, "Portable forward kernel" and
"Hopper forward kernel").

    python benchmarks/prefill_config_sweep.py --kernel portable [--head-dims 64,128,256]
        [--dtypes bf16,fp8e4m3] [--contexts 4096] [--causal] [--out DIR]
    python benchmarks/prefill_config_sweep.py --kernel sm90 --dtypes bf16 --contexts 4096,16384

Output: prefill-config-sweep-<kernel>.json under --out ($OUT, else the current directory).
"""

from __future__ import annotations

import argparse

import torch

import tileattn
from tileattn import fp8
from tileattn.arch import arch_of
from tileattn.bench.common import device_facts, spin_up, time_ms, write_json
from tileattn.bench.prefill import BATCH, CHECK_TOLERANCE, HEADS, TILEATTN_DTYPES, flops
from tileattn.kernels.attention import fwd, sm90
from tileattn.reference import attention_reference

# Portable kernel: (BLOCK_M, BLOCK_N, warps, stages); one warpgroup per 64 query rows, as
# wgmma wants. Rows that do not fit a chip's shared memory fail to launch and are reported.
PORTABLE_CANDIDATES = [(128, 64, 8, 2), (128, 64, 8, 3), (128, 128, 8, 2), (128, 128, 8, 3),
                       (128, 128, 8, 4), (64, 64, 4, 3), (64, 128, 4, 2), (64, 128, 4, 3),
                       (128, 64, 4, 3), (128, 128, 4, 2)]
# Hopper kernel: (BLOCK_N, stages, ping-pong consumers);
# tests/test_sm90_cross_compile.py says which fit 227 KB without spills at each head dim.
SM90_CANDIDATES = [(64, 2, True), (64, 3, True), (128, 2, True), (128, 3, True), (128, 2, False),
                   (128, 3, False)]


def launch_for(kernel, candidate, q, k, v, out, descales, causal, arch):
    """The launch of one candidate config (None: the table's row)."""
    scale = q.shape[3] ** -0.5
    if kernel == "portable":
        config = fwd.TileConfig(*candidate) if candidate else None
        return fwd.attention_launch(q, k, v, out, None, *descales, scale, causal, arch,
                                    config=config)
    config = None
    if candidate:
        block_n, stages, split = candidate
        config = sm90.Sm90Config(block_n, stages, split=split)
    fp8 = dict(zip(("q_descale", "k_descale", "v_descale"), descales), v_keys_grouped=True)
    return sm90.attention_sm90_launch(q, k, v, out, None, scale, causal, config=config,
                                      **(fp8 if descales[0] is not None else {}))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", choices=("portable", "sm90"), default="portable")
    parser.add_argument("--head-dims", default="64,128,256")
    parser.add_argument("--dtypes", default="bf16,fp8e4m3")
    parser.add_argument("--contexts", default="4096")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--out", default=None, help="output folder (default $OUT, else .)")
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    arch = arch_of(device)
    candidates = PORTABLE_CANDIDATES if args.kernel == "portable" else SM90_CANDIDATES
    spin_up()
    rows = []
    for head_dim in (int(d) for d in args.head_dims.split(",")):
        for dtype_name in args.dtypes.split(","):
            for context in (int(n) for n in args.contexts.split(",")):
                dtype = TILEATTN_DTYPES[dtype_name]
                x = [torch.randn(BATCH, context, HEADS, head_dim, device=device) for _ in range(3)]
                if dtype.itemsize == 2:
                    (q, k, v), descales = (t.to(dtype) for t in x), (None, None, None)
                    v_reference = v
                else:
                    (q, qd), (k, kd), (v_reference, vd) = (tileattn.quantize_fp8(t, dtype)
                                                           for t in x)
                    v = (fp8.k_major_copy(v_reference, grouped=True) if args.kernel == "sm90"
                         else tileattn.prepare_v(v_reference))
                    descales = (qd, kd, vd)
                out = torch.empty(BATCH, context, HEADS, head_dim, device=device,
                                  dtype=torch.bfloat16 if dtype.itemsize == 1 else dtype)
                launch_for(args.kernel, None, q, k, v, out, descales, args.causal, arch).run()
                expected = out.float().clone()
                # The reference reads V row-major (the Hopper kernel's FP8 copy is key-grouped).
                reference, _ = attention_reference(q[:1], k[:1], v_reference[:1],
                                                   causal=args.causal,
                                                   q_descale=descales[0], k_descale=descales[1],
                                                   v_descale=descales[2])
                error = float((out[:1].double() - reference).norm() / reference.norm())
                if not error < CHECK_TOLERANCE[dtype_name]:
                    print(f"D={head_dim} {dtype_name} N={context}: the table row is off the "
                          f"fp64 reference by {error:.3g}; nothing timed")
                    continue
                best = None
                for candidate in [None, *candidates]:
                    name = "table" if candidate is None else str(candidate)
                    try:
                        launch = launch_for(args.kernel, candidate, q, k, v, out, descales,
                                            args.causal, arch)
                        out.fill_(float("nan"))
                        launch.run()
                        error = float((out.float() - expected).norm() / expected.norm())
                        if not error < CHECK_TOLERANCE[dtype_name]:
                            print(f"D={head_dim} {dtype_name} N={context} {name}: differs "
                                  f"from the table row by {error:.3g}, not timed")
                            continue
                        ms = time_ms(launch.run)
                    except Exception as error:  # noqa: BLE001 - out of resources etc.
                        print(f"D={head_dim} {dtype_name} N={context} {name}: "
                              f"{type(error).__name__} {str(error)[:120]}")
                        continue
                    row = dict(kernel=args.kernel, D=head_dim, dtype=dtype_name, N=context,
                               causal=args.causal, config=name, ms=ms,
                               tflops=flops(context, head_dim, args.causal) / ms / 1e9)
                    rows.append(row)
                    if candidate is not None and (best is None or ms < best["ms"]):
                        best = row
                table = next((r for r in rows[::-1] if r["config"] == "table" and
                              (r["D"], r["dtype"], r["N"]) == (head_dim, dtype_name, context)), None)
                print(f"D={head_dim} {dtype_name} N={context}: table row "
                      f"{table and round(table['tflops'])} TFLOP/s, best candidate "
                      f"{best and best['config']} {best and round(best['tflops'])}", flush=True)
                del q, k, v, v_reference, out, expected, x
                torch.cuda.empty_cache()
    path = write_json(f"prefill-config-sweep-{args.kernel}",
                      dict(device_facts(), causal=args.causal, rows=rows), args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
