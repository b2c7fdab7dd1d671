"""Why the non-causal fused backward reads ~5% below causal per FLOP in do_bench while ncu
gives equal cycles per FLOP: do_bench vs back-to-back events vs profiler kernel sums, with
SM clocks sampled (pynvml) during each; cuDNN alike."""
import json, math, os, threading, time, statistics, torch, triton
from tileattn.arch import arch_of
from tileattn.kernels.attention import bwd
from tileattn.bench.common import spin_up, device_facts
import tileattn
from torch.nn.attention import sdpa_kernel, SDPBackend
dev = torch.device("cuda"); arch = arch_of(dev); spin_up()
OUT = os.environ.get("OUT", ".")
try:
    import pynvml; pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0)
except Exception as e:
    print("no nvml", e); h = None

class Clocks:
    def __enter__(self):
        self.samples, self.stop = [], False
        def run():
            while not self.stop:
                if h is not None:
                    self.samples.append((pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM), pynvml.nvmlDeviceGetPowerUsage(h) / 1000))
                time.sleep(0.005)
        self.t = threading.Thread(target=run); self.t.start(); return self
    def __exit__(self, *a):
        self.stop = True; self.t.join()
    def summary(self):
        if not self.samples: return None
        c = [s[0] for s in self.samples]; p = [s[1] for s in self.samples]
        return dict(sm_mhz_median=statistics.median(c), sm_mhz_min=min(c), watts_median=statistics.median(p), n=len(c))

rows = []
D, N = 128, 16384
for causal in (False, True):
    gen = torch.Generator(device=dev).manual_seed(N + D)
    q, k, v, do = (torch.randn(4, N, 32, D, device=dev, generator=gen, dtype=torch.bfloat16) for _ in range(4))
    out, lse = tileattn.attention(q, k, v, causal=causal, return_lse=True)
    g = tuple(torch.empty_like(x) for x in (q, k, v))
    opts = dict(causal=causal, softmax_scale=1 / math.sqrt(D), window_left=-1, window_right=-1, arch=arch, kernel="sm90", deterministic=False)
    ours = lambda: bwd.attention_backward(q, k, v, out, lse, do, *g, **opts)
    ql, kl, vl = (x.transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
    dol = do.transpose(1, 2).contiguous()
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = torch.nn.functional.scaled_dot_product_attention(ql, kl, vl, is_causal=causal)
    cudnn = lambda: torch.autograd.grad(o, (ql, kl, vl), dol, retain_graph=True)
    flops = 2.5 * 4 * 4 * 32 * N * N * D * (0.5 if causal else 1)
    for name, fn in (("tileattn", ours), ("cudnn", cudnn)):
        fn(); torch.cuda.synchronize()
        with Clocks() as ck:
            ms_bench = triton.testing.do_bench(fn, warmup=20, rep=500)
        row = dict(causal=causal, impl=name, do_bench_ms=ms_bench, do_bench_tflops=flops / ms_bench / 1e9, clocks_do_bench=ck.summary())
        # back-to-back: 6 calls between two events, no cache clearing
        with Clocks() as ck:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(6): fn()
            e.record(); torch.cuda.synchronize()
        row.update(b2b_ms=s.elapsed_time(e) / 6, b2b_tflops=flops / (s.elapsed_time(e) / 6) / 1e9, clocks_b2b=ck.summary())
        from torch.profiler import profile, ProfilerActivity
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3): fn()
            torch.cuda.synchronize()
        row["kernels_ms"] = {e.key[:50]: round(e.device_time_total / 3 / 1000, 3) for e in prof.key_averages() if e.device_time_total > 0}
        print(row, flush=True); rows.append(row)
json.dump(dict(device_facts(), rows=rows), open(os.path.join(OUT, "bwd-clock-diag.json"), "w"), indent=1)
