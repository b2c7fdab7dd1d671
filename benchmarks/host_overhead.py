"""Host time vs kernel time of attention() at short contexts.

A call whose host work (checks, call cache, launch) outlasts its kernel leaves the GPU idle
between launches. Per point and column this measures the host time per call (200 calls, no
synchronisation in between), the eager do_bench median and the CUDA-graph replay median: where
eager is well above graph, the call is host-bound. Columns: bf16; FP8 e4m3 with V row-major
(attention() transposes it, a second launch); FP8 with V already K-major (prepare_v); and the
portable kernel reading FP8 V row-major, which attention() never does on sm89/sm90 (what
skipping the transposition would cost the kernel). Decides the call cache and the V layout at
short contexts (docs/design.md, "Host overhead and the call cache", "FP8 and V layout").

    python benchmarks/host_overhead.py [--contexts 1024,2048] [--head-dims 64,128] [--out DIR]

Output: host-overhead.json under --out ($OUT, else the current directory).
"""

from __future__ import annotations

import argparse
import time

import torch

import tileattn
from tileattn.arch import arch_of
from tileattn.bench.common import device_facts, spin_up, time_ms, write_json
from tileattn.kernels.attention import fwd

BATCH, HEADS = 4, 32
COLUMNS = (("bf16", torch.bfloat16, False), ("fp8", torch.float8_e4m3fn, False),
           ("fp8-vT", torch.float8_e4m3fn, True), ("fp8-rowV", torch.float8_e4m3fn, False))


def _inputs(dtype, context, head_dim, k_major_v):
    q, k, v = (torch.randn(BATCH, context, HEADS, head_dim, device="cuda") for _ in range(3))
    if dtype.itemsize == 2:
        return (q.to(dtype), k.to(dtype), v.to(dtype)), {}
    (q, qd), (k, kd), (v, vd) = (tileattn.quantize_fp8(x, dtype) for x in (q, k, v))
    if k_major_v:
        v = tileattn.prepare_v(v)
    return (q, k, v), dict(q_descale=qd, k_descale=kd, v_descale=vd)


def _row_major_v_launch(args, kwargs, causal):
    """The portable kernel's launch on FP8 V as given (head_dim contiguous)."""
    q, k, v = args
    out = torch.empty(q.shape[:3] + (v.shape[3],), dtype=torch.bfloat16, device=q.device)
    launch = fwd.attention_launch(q, k, v, out, None, kwargs["q_descale"], kwargs["k_descale"],
                                  kwargs["v_descale"], q.shape[3] ** -0.5, causal,
                                  arch_of(q.device))
    return launch.run


def measure(call) -> tuple[float, float, float]:
    """(host µs per call, eager ms, graph-replay ms) of call()."""
    call()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(200):
        call()
    host_us = (time.perf_counter() - start) / 200 * 1e6
    torch.cuda.synchronize()
    eager_ms = time_ms(call)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()
        with torch.cuda.graph(graph, stream=stream):
            call()
    torch.cuda.current_stream().wait_stream(stream)
    return host_us, eager_ms, time_ms(graph.replay)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="1024,2048")
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--out", default=None, help="output folder (default $OUT, else .)")
    args = parser.parse_args(argv)
    spin_up()
    rows = []
    for context in (int(n) for n in args.contexts.split(",")):
        for head_dim in (int(d) for d in args.head_dims.split(",")):
            for causal in (False, True):
                for name, dtype, k_major in COLUMNS:
                    inputs, kwargs = _inputs(dtype, context, head_dim, k_major)
                    if name == "fp8-rowV":
                        call = _row_major_v_launch(inputs, kwargs, causal)
                    else:
                        def call(inputs=inputs, kwargs=kwargs, causal=causal):
                            return tileattn.attention(*inputs, causal=causal, **kwargs)
                    host_us, eager_ms, graph_ms = measure(call)
                    flops = 4 * BATCH * HEADS * context * context * head_dim / (2 if causal else 1)
                    row = dict(N=context, D=head_dim, causal=causal, dtype=name,
                               host_us_per_call=host_us, eager_ms=eager_ms, graph_ms=graph_ms,
                               eager_tflops=flops / eager_ms / 1e9,
                               graph_tflops=flops / graph_ms / 1e9)
                    rows.append(row)
                    print(f"N={context:5} D={head_dim:3} causal={causal!s:5} {name:8} host "
                          f"{host_us:6.1f} us/call  eager {eager_ms:.3f} ms "
                          f"({row['eager_tflops']:.0f})  graph {graph_ms:.3f} ms "
                          f"({row['graph_tflops']:.0f})", flush=True)
    path = write_json("host-overhead", dict(device_facts(), rows=rows), args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
