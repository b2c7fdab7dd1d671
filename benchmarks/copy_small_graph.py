"""The HBM copy rate at small sizes, timed from a CUDA graph: what y.copy_(x) reaches when it
moves (reads + writes) as many bytes as a small MLA decode batch reads, e.g. 9.4 MB for batch 1
seq 8192. The bench's copy_gbps (2 GiB) is the large-copy rate; this shows how much of it
launch latency leaves at these sizes. JSON under $OUT."""
import json, os, torch, triton
res = {}
for mb in (9.4, 37.7, 302.0, 2048.0):
    n = int(mb * 1e6 / 2) // 2   # bytes read + written = mb
    x = torch.randn(n, device="cuda", dtype=torch.bfloat16); y = torch.empty_like(x)
    ms = triton.testing.do_bench_cudagraph(lambda: y.copy_(x), rep=200, return_mode="median")
    res[mb] = dict(us=ms * 1e3, gbps=4 * n / ms / 1e6)
    print(mb, "MB moved (read+write):", res[mb])
json.dump(res, open(os.path.join(os.environ["OUT"], "copy-small-graph.json"), "w"), indent=1)
