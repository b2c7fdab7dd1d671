"""Host overhead vs kernel time of attention() at short contexts.

A call whose host-side work (checks, launch binding) outlasts its kernel leaves the GPU idle
between launches; timing the same call eagerly and as a CUDA-graph replay tells the two apart.
"""

from __future__ import annotations

import time

import torch

import tileattn

from .common import time_ms


def _inputs(dtype, context, head_dim, k_major_v):
    q, k, v = (torch.randn(4, context, 32, head_dim, device="cuda") for _ in range(3))
    if dtype.itemsize == 2:
        return (q.to(dtype), k.to(dtype), v.to(dtype)), {}
    (q, qd), (k, kd), (v, vd) = (tileattn.quantize_fp8(x, dtype) for x in (q, k, v))
    if k_major_v:
        v = tileattn.prepare_v(v)
    return (q, k, v), dict(q_descale=qd, k_descale=kd, v_descale=vd)


def _row_major_v_launch(args, kwargs, causal):
    """The portable kernel reading FP8 V as given (head_dim contiguous), which attention()
    never does on sm89/sm90: times what skipping the V transposition would cost the kernel."""
    from tileattn.arch import arch_of
    from tileattn.kernels.attention import fwd as attention_fwd

    q, k, v = args
    out = torch.empty(q.shape[:3] + (v.shape[3],), dtype=torch.bfloat16, device=q.device)
    launch = attention_fwd.attention_launch(
        q, k, v, out, None, kwargs["q_descale"], kwargs["k_descale"], kwargs["v_descale"],
        q.shape[3] ** -0.5, causal, arch_of(q.device))
    return launch.run


def run(contexts=(1024, 2048), head_dims=(64, 128), causal_values=(False, True)):
    rows = []
    for context in contexts:
        for head_dim in head_dims:
            for causal in causal_values:
                for name, dtype, k_major in (("bf16", torch.bfloat16, False),
                                             ("fp8", torch.float8_e4m3fn, False),
                                             ("fp8-vT", torch.float8_e4m3fn, True),
                                             ("fp8-rowV", torch.float8_e4m3fn, False)):
                    args, kwargs = _inputs(dtype, context, head_dim, k_major)
                    if name == "fp8-rowV":
                        call = _row_major_v_launch(args, kwargs, causal)
                    else:
                        def call():
                            return tileattn.attention(*args, causal=causal, **kwargs)
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
                    with torch.cuda.stream(stream):
                        call()
                        with torch.cuda.graph(graph, stream=stream):
                            call()
                    graph_ms = time_ms(graph.replay)
                    flops = 4 * 4 * 32 * context * context * head_dim / (2 if causal else 1)
                    row = dict(N=context, D=head_dim, causal=causal, dtype=name,
                               host_us_per_call=host_us, eager_ms=eager_ms, graph_ms=graph_ms,
                               eager_tflops=flops / eager_ms / 1e9, graph_tflops=flops / graph_ms / 1e9)
                    rows.append(row)
                    print(f"N={context:5} D={head_dim:3} causal={causal!s:5} {name:7} host {host_us:6.1f} us/call  "
                          f"eager {eager_ms:.3f} ms ({row['eager_tflops']:.0f})  graph {graph_ms:.3f} ms "
                          f"({row['graph_tflops']:.0f})", flush=True)
    return rows
