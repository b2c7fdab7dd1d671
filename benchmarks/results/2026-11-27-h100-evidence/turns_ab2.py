"""A/B round 2: the ping-pong turn barriers on (base) / off (noturn) for FP8 at D 64/128/256,
N 4k/16k, causal and not (per-tensor e4m3 from quantize_qkv_fp8), softcap 30 bf16 D=128, and a
bf16 control. B=4 H=32, interleaved rounds (ROUNDS, default 5)."""
import dataclasses, json, os, statistics
import torch, triton
import tileattn
from tileattn.kernels.attention import sm90
from tileattn.ops import call_cache
from tileattn.bench.common import spin_up, device_facts

ROUNDS = int(os.environ.get("ROUNDS", 5))
BF16_ROWS = dict(sm90.CONFIGS)
FP8_ROWS = dict(sm90.FP8_CONFIGS)
POINTS = [(d, n, c, "fp8") for d in (128, 256, 64) for n in (16384, 4096) for c in (False, True)]
POINTS += [(128, 16384, True, "softcap"), (128, 4096, True, "softcap"), (128, 16384, False, "softcap"),
           (128, 16384, False, "plain")]
spin_up()
rows = []


def setv(name):
    turns = name == "base"
    for table, rows_ in ((sm90.CONFIGS, BF16_ROWS), (sm90.FP8_CONFIGS, FP8_ROWS)):
        for d, cfg in rows_.items():
            table[d] = dataclasses.replace(cfg, take_turns=turns)
    call_cache.clear_all()


for d, n, causal, kind in POINTS:
    gen = torch.Generator(device="cuda").manual_seed(n + d)
    q, k, v = (torch.randn(4, n, 32, d, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(3))
    if kind == "fp8":
        q8, k8, v8, scales = tileattn.quantize_qkv_fp8(q, k, v)
        call = lambda: tileattn.attention(q8, k8, v8, causal=causal, **scales)
    else:
        cap = 30.0 if kind == "softcap" else 0.0
        call = lambda: tileattn.attention(q, k, v, causal=causal, softcap=cap)
    flops = 4 * 4 * 32 * n * n * d * (0.5 if causal else 1.0)
    names = ["base", "noturn"]
    outs = {}
    for name in names:
        setv(name); outs[name] = call().float()
    row = dict(D=d, N=n, causal=causal, kind=kind,
               max_diff=float((outs["noturn"] - outs["base"]).abs().max()))
    del outs
    times = {name: [] for name in names}
    for r in range(ROUNDS):
        for name in (names if r % 2 == 0 else names[::-1]):
            setv(name); call()
            times[name].append(triton.testing.do_bench(call, warmup=25, rep=200, return_mode="median"))
    for name in names:
        ms = statistics.median(times[name])
        row[name] = dict(ms=ms, ms_rounds=times[name], tflops=flops / ms / 1e9)
    row["ratio"] = row["base"]["ms"] / row["noturn"]["ms"]
    print(kind, d, n, "causal" if causal else "full", f"base {row['base']['tflops']:.0f} noturn {row['noturn']['tflops']:.0f} ratio {row['ratio']:.3f} diff {row['max_diff']:.1e}", flush=True)
    rows.append(row)
    del q, k, v
    torch.cuda.empty_cache()
setv("base")
json.dump(dict(device_facts(), rows=rows), open(os.path.join(os.environ.get("OUT", "."), "turns-ab2.json"), "w"), indent=1)
