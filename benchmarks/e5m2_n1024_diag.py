"""Diagnostic (GPU): FP8 e4m3 vs e5m2 at N=1024, D=128, causal, one call timed alone —
eager, CUDA-graph replay, V pre-transposed, and a profiler table of the kernels.
Run: PYTHONPATH=$PWD python3 benchmarks/e5m2_n1024_diag.py (results in benchmarks/NOTES.md)."""
import torch, triton, tileattn
from tileattn.kernels import compile as cc
q = torch.randn(4, 1024, 32, 128, device="cuda")
for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
    (q8, qd), (k8, kd), (v8, vd) = (tileattn.quantize_fp8(x, dtype) for x in (q, q, q))
    call = lambda: tileattn.attention(q8, k8, v8, causal=True, q_descale=qd, k_descale=kd, v_descale=vd)
    call(); call()
    n0 = len(cc._COMPILED)
    for _ in range(3): call()
    n1 = len(cc._COMPILED)
    eager = triton.testing.do_bench(call, warmup=100, rep=400, return_mode="median")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        call()
    graph = triton.testing.do_bench(lambda: g.replay(), warmup=100, rep=400, return_mode="median")
    vt = tileattn.prepare_v(v8)
    kern = triton.testing.do_bench(lambda: tileattn.attention(q8, k8, vt, causal=True, q_descale=qd, k_descale=kd, v_descale=vd), warmup=100, rep=400, return_mode="median")
    print(dtype, "compiled entries", n0, n1, "eager ms", round(eager, 4), "graph ms", round(graph, 4), "pre-transposed eager", round(kern, 4), flush=True)
import torch.profiler as tp
for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
    (q8, qd), (k8, kd), (v8, vd) = (tileattn.quantize_fp8(x, dtype) for x in (q, q, q))
    with tp.profile(activities=[tp.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            tileattn.attention(q8, k8, v8, causal=True, q_descale=qd, k_descale=kd, v_descale=vd)
        torch.cuda.synchronize()
    print(dtype); print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=6))
