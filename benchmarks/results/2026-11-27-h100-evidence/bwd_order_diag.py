"""Does a timing depend on what ran just before it? Backward D=128, tileattn and cuDNN timed in
the sequence T T C C (x3) with do_bench(warmup=100, rep=400), each reading labelled by its
predecessor; then each after a 3 s run of itself (steady state). SM clock sampled after each."""
import json, math, os, time, torch, triton
from tileattn.arch import arch_of
from tileattn.kernels.attention import bwd
from tileattn.bench.common import spin_up, device_facts
import tileattn
from torch.nn.attention import sdpa_kernel, SDPBackend
dev = torch.device("cuda"); arch = arch_of(dev); spin_up()
OUT = os.environ.get("OUT", ".")
try:
    import pynvml; pynvml.nvmlInit(); H = pynvml.nvmlDeviceGetHandleByIndex(0)
    clock = lambda: pynvml.nvmlDeviceGetClockInfo(H, pynvml.NVML_CLOCK_SM)
    power = lambda: pynvml.nvmlDeviceGetPowerUsage(H) / 1000
except Exception:
    clock = power = lambda: None

def point(D, N, causal, H=32):
    gen = torch.Generator(device=dev).manual_seed(N + D)
    q, k, v, do = (torch.randn(4, N, H, D, device=dev, generator=gen, dtype=torch.bfloat16) for _ in range(4))
    out, lse = tileattn.attention(q, k, v, causal=causal, return_lse=True)
    ql, kl, vl = (x.transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
    dol = do.transpose(1, 2).contiguous()
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = torch.nn.functional.scaled_dot_product_attention(ql, kl, vl, is_causal=causal)
    g = tuple(torch.empty_like(x) for x in (q, k, v))
    opts = dict(causal=causal, softmax_scale=1 / math.sqrt(D), window_left=-1, window_right=-1,
                arch=arch, kernel="sm90", deterministic=False)
    calls = {"T": lambda: bwd.attention_backward(q, k, v, out, lse, do, *g, **opts),
             "C": lambda: torch.autograd.grad(o, (ql, kl, vl), dol, retain_graph=True)}
    flops = 2.5 * 4 * 4 * H * N * N * D * (0.5 if causal else 1)
    readings, prev = [], "start"
    for name in "TTCCTTCCTTCC":
        ms = triton.testing.do_bench(calls[name], warmup=100, rep=400, return_mode="median")
        readings.append(dict(impl=name, after=prev, tflops=round(flops / ms / 1e9, 1), sm_mhz=clock(), watts=power()))
        prev = name
    steady = {}
    for name in "TCTC":
        ms = triton.testing.do_bench(calls[name], warmup=3000, rep=400, return_mode="median")
        steady.setdefault(name, []).append(dict(tflops=round(flops / ms / 1e9, 1), sm_mhz=clock(), watts=power()))
    summary = {}
    for impl in "TC":
        for after in "TC":
            xs = [r["tflops"] for r in readings if r["impl"] == impl and r["after"] == after]
            summary[f"{impl} after {after}"] = round(sum(xs) / len(xs), 1) if xs else None
    row = dict(D=D, N=N, causal=causal, readings=readings, steady=steady, summary=summary)
    print({k: row[k] for k in ("D", "N", "causal", "summary")}, {k: [s["tflops"] for s in v] for k, v in steady.items()}, flush=True)
    return row

rows = [point(128, 4096, False), point(128, 4096, True), point(128, 16384, False)]
json.dump(dict(device_facts(), rows=rows), open(os.path.join(OUT, "bwd-order-diag.json"), "w"), indent=1)
