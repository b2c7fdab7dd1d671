"""Diagnosis: at N=1024, is tileattn's forward bound by its kernel or by the host? Per call:
do_bench (back-to-back calls, as the grid times), CUDA-graph replay (kernel work only), host
time (no sync), for tileattn and cuDNN."""
import json, os, time, torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
import tileattn
from tileattn.bench.common import device_facts, spin_up, time_ms
spin_up()
rows = []
def graph_ms(fn, reps=20):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay(); torch.cuda.synchronize()
    return time_ms(g.replay) / reps
def host_us(fn, n=300):
    fn(); torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    h = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return h
for B, N, D, causal in ((4, 1024, 128, True), (4, 1024, 128, False), (4, 1024, 64, True), (4, 1024, 256, True), (4, 2048, 128, True), (16, 1024, 128, True)):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, N, 32, D, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(3))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    fl = 4 * B * 32 * N * N * D * (0.5 if causal else 1.0)
    ours = lambda: tileattn.attention(q, k, v, causal=causal)
    def cudnn():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    for name, fn in (("tileattn", ours), ("cudnn", cudnn)):
        try:
            bench = time_ms(fn); graph = graph_ms(fn); host = host_us(fn)
        except Exception as e:
            print(name, B, N, D, causal, "failed", type(e).__name__, str(e)[:200]); continue
        row = dict(impl=name, B=B, N=N, D=D, causal=causal, bench_ms=bench, graph_ms=graph, host_us=host,
                   bench_tflops=fl / bench / 1e9, graph_tflops=fl / graph / 1e9)
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
        rows.append(row)
json.dump(dict(device_facts(), rows=rows), open(os.path.join(os.environ.get("OUT", "."), "host-diag.json"), "w"), indent=1)
