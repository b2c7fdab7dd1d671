"""A/B: TMA stores on three-consumer rows (D=64 dense, >= 4096 queries, <= 4096 keys) vs register stores."""
import json, os, time, statistics
import torch, tileattn
from tileattn.ops import call_cache
from tileattn.kernels.attention import sm90
from tileattn.bench.common import spin_up, time_ms, device_facts

base = sm90._out_descriptor
def tma3(out, dim_v, config):
    if (out.element_size() != 2 or not config.split or dim_v > sm90.TMA_STORE_MAX_DIM
            or out.stride(3) != 1 or out.data_ptr() % 16
            or any(out.stride(i) * out.element_size() % 16 for i in range(3))):
        return None
    return sm90._descriptor(out.permute(0, 2, 1, 3), [1, 1, 64, dim_v])
def setv(name):
    sm90._out_descriptor = tma3 if name == "tma3" else base
    call_cache.clear_all()
rows = []
spin_up()
for causal in (False, True):
    B, H, N, D = 4, 32, 4096, 64
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    fn = lambda: tileattn.attention(q, k, v, causal=causal)
    outs = {}
    for name in ("base", "tma3"):
        setv(name); outs[name] = fn().float()
    diff = (outs["base"] - outs["tma3"]).abs().max().item()
    times = {"base": [], "tma3": []}
    for r in range(4):
        for name in (("base", "tma3") if r % 2 == 0 else ("tma3", "base")):
            setv(name); fn(); times[name].append(time_ms(fn))
    fl = 4 * B * H * N * N * D / (2 if causal else 1)
    for name, t in times.items():
        rows.append(dict(causal=causal, impl=name, ms_rounds=t, tflops=fl / statistics.median(t) / 1e9, maxdiff=diff))
        print(rows[-1], flush=True)
json.dump(dict(device=device_facts(), date=time.strftime("%Y-%m-%d"), rows=rows),
          open(os.path.join(os.environ.get("OUT", "."), "tma3-ab.json"), "w"), indent=1)
