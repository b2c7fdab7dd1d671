"""A/B: the ping-pong turn barriers on/off, 128x128 (2 consumers) and 192x64 (3 consumers),
for softcap 30 (bf16), with no-softcap and FP8 controls. B=4 H=32 D=128, interleaved rounds,
errors vs fp64 on a slice."""
import json, os, statistics
import torch, triton
import tileattn
from tileattn.kernels.attention import sm90
from tileattn.kernels.attention.sm90 import Sm90Config
from tileattn.ops import call_cache
from tileattn.bench.common import spin_up, device_facts
from tileattn.reference import attention_reference

ROUNDS = int(os.environ.get("ROUNDS", 3))
CAP = 30.0
BASE = Sm90Config(128, 2, split=True, q_in_registers=True)
FP8_BASE = Sm90Config(128, 2, split=True)
VARIANTS = {
    "base": (BASE, FP8_BASE),
    "noturn": (Sm90Config(128, 2, split=True, q_in_registers=True, take_turns=False),
               Sm90Config(128, 2, split=True, take_turns=False)),
    "t3": (Sm90Config(64, 2, block_m=192, split=True), Sm90Config(64, 2, block_m=192, split=True)),
    "t3noturn": (Sm90Config(64, 2, block_m=192, split=True, take_turns=False),
                 Sm90Config(64, 2, block_m=192, split=True, take_turns=False)),
}
# (N, causal, kind) kind: softcap | plain | fp8
POINTS = [(16384, True, "softcap"), (4096, True, "softcap"), (16384, False, "softcap"),
          (16384, True, "plain"), (16384, False, "fp8"), (4096, False, "fp8")]
spin_up()
rows = []
for n, causal, kind in POINTS:
    gen = torch.Generator(device="cuda").manual_seed(n)
    q, k, v = (torch.randn(4, n, 32, 128, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(3))
    cap = CAP if kind == "softcap" else 0.0
    kwargs = dict(causal=causal, softcap=cap)
    if kind == "fp8":
        q8, k8, v8, scales = tileattn.quantize_qkv_fp8(q, k, v)
        call = lambda: tileattn.attention(q8, k8, v8, causal=causal, **scales)
    else:
        call = lambda: tileattn.attention(q, k, v, **kwargs)
    flops = 4 * 4 * 32 * n * n * 128 * (0.5 if causal else 1.0)
    def setv(name):
        bf, f8 = VARIANTS[name]
        sm90.CONFIGS[128] = bf
        sm90.FP8_CONFIGS[128] = f8
        call_cache.clear_all()
    ks, vs = k[:1, :, :2].double(), v[:1, :, :2].double()
    ref, _ = attention_reference(q[:1, :, :2].double(), ks, vs, causal=causal, softcap=cap)
    ref = ref[:, -256:]
    outs, errs = {}, {}
    for name in VARIANTS:
        setv(name)
        o = call().float()
        outs[name] = o[:1, -256:, :2]
        errs[name] = float((o[:1, -256:, :2].double() - ref).norm() / ref.norm())
    row = dict(N=n, causal=causal, kind=kind, err=errs,
               diff_vs_base={m: float((outs[m] - outs["base"]).abs().max()) for m in VARIANTS})
    names = list(VARIANTS)
    times = {name: [] for name in names}
    for r in range(ROUNDS):
        for name in (names if r % 2 == 0 else names[::-1]):
            setv(name); call()
            times[name].append(triton.testing.do_bench(call, warmup=25, rep=200, return_mode="median"))
    for name in names:
        ms = statistics.median(times[name])
        row[name] = dict(ms=ms, ms_rounds=times[name], tflops=flops / ms / 1e9)
    print(n, causal, kind, "  ".join(f"{m} {row[m]['tflops']:.0f}" for m in names),
          " ratios vs base:", " ".join(f"{m} {row['base']['ms']/row[m]['ms']:.3f}" for m in names[1:]),
          " err", {m: f"{e:.2e}" for m, e in errs.items()}, flush=True)
    rows.append(row)
    del q, k, v
    torch.cuda.empty_cache()
setv("base")
json.dump(dict(device_facts(), rows=rows), open(os.path.join(os.environ.get("OUT", "."), "turns-ab.json"), "w"), indent=1)
