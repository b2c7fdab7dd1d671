"""A/B: softcap with P's row sums as a wgmma (rs) and the turn barriers off (noturn), D=128
B=4 H=32 bf16, interleaved rounds; the no-softcap call of the same run; errors vs fp64 on a
slice; plus a correctness sweep of rs on odd shapes (D 64/128/256, GQA, causal, softcap)."""
import dataclasses, json, os, statistics
import torch, triton
import tileattn
from tileattn.kernels.attention import sm90
from tileattn.ops import call_cache
from tileattn.bench.common import spin_up, device_facts
from tileattn.reference import attention_reference

ROUNDS = int(os.environ.get("ROUNDS", 5))
ROWS = {name: dict(getattr(sm90, name)) for name in ("CONFIGS", "LONG_QUERY_CONFIGS", "SHORT_QUERY_CONFIGS")}
VARIANTS = {"base": {}, "rs": dict(row_sum_mma=True), "noturn": dict(take_turns=False),
            "rs-noturn": dict(row_sum_mma=True, take_turns=False)}


def setv(name):
    for table, rows in ROWS.items():
        live = getattr(sm90, table)
        for d, cfg in rows.items():
            live[d] = dataclasses.replace(cfg, **VARIANTS[name])
    call_cache.clear_all()


spin_up()
# Correctness of rs on odd shapes against fp64.
torch.manual_seed(0)
worst = {}
for d in (64, 128, 256):
    for (b, sq, sk, hq, hkv) in ((2, 1000, 1000, 4, 2), (1, 300, 777, 3, 1), (2, 4500, 4500, 2, 2)):
        for causal in (False, True):
            for cap in (0.0, 20.0):
                q = torch.randn(b, sq, hq, d, device="cuda").bfloat16()
                k = torch.randn(b, sk, hkv, d, device="cuda").bfloat16()
                v = torch.randn(b, sk, hkv, d, device="cuda").bfloat16()
                ref, _ = attention_reference(q.double(), k.double(), v.double(), causal=causal, softcap=cap)
                errs = {}
                for name in ("base", "rs"):
                    setv(name)
                    with tileattn.use_kernels(attention="sm90"):
                        o = tileattn.attention(q, k, v, causal=causal, softcap=cap)
                    errs[name] = float((o.double() - ref).norm() / ref.norm())
                key = f"D{d} {b}x{sq}x{sk} h{hq}/{hkv} causal={causal} cap={cap}"
                worst[key] = errs
                flag = "  <-- rs worse" if errs["rs"] > 1.2 * errs["base"] + 1e-4 else ""
                print(key, {k_: f"{e:.2e}" for k_, e in errs.items()}, flag, flush=True)
rows = []
for n, causal, cap in ((16384, True, 30.0), (4096, True, 30.0), (16384, False, 30.0),
                       (16384, True, 0.0), (4096, False, 0.0)):
    gen = torch.Generator(device="cuda").manual_seed(n)
    q, k, v = (torch.randn(4, n, 32, 128, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(3))
    call = lambda: tileattn.attention(q, k, v, causal=causal, softcap=cap)
    flops = 4 * 4 * 32 * n * n * 128 * (0.5 if causal else 1.0)
    names = list(VARIANTS) + (["nosoftcap"] if cap else [])
    nocap = lambda: tileattn.attention(q, k, v, causal=causal)
    calls = {name: call for name in VARIANTS}
    calls["nosoftcap"] = nocap
    times = {name: [] for name in names}
    for r in range(ROUNDS):
        for name in (names if r % 2 == 0 else names[::-1]):
            setv("base" if name == "nosoftcap" else name); calls[name]()
            times[name].append(triton.testing.do_bench(calls[name], warmup=25, rep=200, return_mode="median"))
    row = dict(N=n, causal=causal, softcap=cap)
    for name in names:
        ms = statistics.median(times[name])
        row[name] = dict(ms=ms, ms_rounds=times[name], tflops=flops / ms / 1e9)
    line = "  ".join(f"{m} {row[m]['tflops']:.0f}" for m in names)
    ratios = " ".join(f"{m}/base {row['base']['ms'] / row[m]['ms']:.3f}" for m in names[1:4])
    extra = ""
    if cap:
        extra = " vs nosoftcap: " + " ".join(f"{m} {row['nosoftcap']['ms'] / row[m]['ms']:.3f}" for m in VARIANTS)
    print(f"N={n} causal={causal} cap={cap}: {line} | {ratios}{extra}", flush=True)
    rows.append(row)
    del q, k, v
    torch.cuda.empty_cache()
setv("base")
json.dump(dict(device_facts(), rows=rows, errors=worst), open(os.path.join(os.environ.get("OUT", "."), "rowsum-ab.json"), "w"), indent=1)
