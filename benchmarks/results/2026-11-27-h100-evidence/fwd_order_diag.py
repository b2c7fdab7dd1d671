"""Forward bf16: does a timing depend on its predecessor? tileattn (T) and cuDNN (C), D=128, timed
T T C C x3 (do_bench warmup=100 rep=400), then each after 3 s of itself."""
import json, os, torch, triton
import tileattn
from tileattn.bench.common import spin_up, device_facts
from torch.nn.attention import sdpa_kernel, SDPBackend
dev = torch.device("cuda"); spin_up()
OUT = os.environ.get("OUT", ".")

def point(D, N, causal, H=32):
    gen = torch.Generator(device=dev).manual_seed(N + D)
    q, k, v = (torch.randn(4, N, H, D, device=dev, generator=gen, dtype=torch.bfloat16) for _ in range(3))
    qh, kh, vh = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, is_causal=causal)
    calls = {"T": lambda: tileattn.attention(q, k, v, causal=causal), "C": cudnn}
    flops = 4 * 4 * H * N * N * D * (0.5 if causal else 1)
    readings, prev = [], "start"
    for name in "TTCCTTCCTTCC":
        ms = triton.testing.do_bench(calls[name], warmup=100, rep=400, return_mode="median")
        readings.append(dict(impl=name, after=prev, tflops=round(flops / ms / 1e9, 1)))
        prev = name
    steady = {}
    for name in "TCTC":
        ms = triton.testing.do_bench(calls[name], warmup=3000, rep=400, return_mode="median")
        steady.setdefault(name, []).append(round(flops / ms / 1e9, 1))
    summary = {f"{i} after {a}": round(sum(xs) / len(xs), 1) for i in "TC" for a in "TC"
               if (xs := [r["tflops"] for r in readings if r["impl"] == i and r["after"] == a])}
    row = dict(D=D, N=N, causal=causal, readings=readings, steady=steady, summary=summary)
    print(D, N, causal, summary, steady, flush=True)
    return row

rows = [point(128, 16384, False), point(128, 4096, False), point(128, 16384, True)]
json.dump(dict(device_facts(), rows=rows), open(os.path.join(OUT, "fwd-order-diag.json"), "w"), indent=1)
