"""A/B: Sm90Config.exp2_on_fma off vs on, interleaved, one process."""
import dataclasses, json, os, sys, torch
import tileattn
from tileattn import fp8
from tileattn.bench.common import device_facts, spin_up, time_ms
from tileattn.kernels.attention import sm90
B, H = 4, 32
POINTS = [  # (dtype, D, N, causal, softcap)
    ("bf16", 128, 16384, True, 30.0), ("bf16", 128, 16384, True, 0.0),
    ("bf16", 128, 16384, False, 30.0),
    ("fp8", 128, 16384, False, 0.0), ("fp8", 128, 16384, True, 0.0),
    ("fp8", 256, 16384, False, 0.0), ("fp8", 128, 4096, False, 0.0),
    ("bf16", 64, 16384, False, 0.0), ("bf16", 64, 16384, True, 0.0),
    ("bf16", 128, 16384, False, 0.0), ("bf16", 256, 16384, False, 0.0),
    ("fp8", 128, 16384, True, 30.0),
]
only = sys.argv[1:]
spin_up()
rows = []
for dtype, D, N, causal, cap in POINTS:
    key = f"{dtype}-D{D}-N{N}-{'causal' if causal else 'full'}-cap{cap:g}"
    if only and not any(o in key for o in only):
        continue
    x = [torch.randn(B, N, H, D, device="cuda") for _ in range(3)]
    if dtype == "fp8":
        (q, qd), (k, kd), (v, vd) = (tileattn.quantize_fp8(t, torch.float8_e4m3fn) for t in x)
        v = fp8.k_major_copy(v, grouped=True)
        extra = dict(q_descale=qd, k_descale=kd, v_descale=vd, v_keys_grouped=True)
    else:
        q, k, v = (t.to(torch.bfloat16) for t in x)
        extra = {}
    del x
    out = torch.empty(B, N, H, D, device="cuda", dtype=torch.bfloat16)
    base = sm90.config_for(D, D, dtype == "fp8")
    launches, outs = {}, {}
    for fma in (False, True):
        launches[fma] = sm90.attention_sm90_launch(q, k, v, out, None, D ** -0.5, causal, softcap=cap,
                                                    config=dataclasses.replace(base, exp2_on_fma=fma), **extra)
        out.fill_(float("nan")); launches[fma].run(); outs[fma] = out.float().clone()
    diff = float((outs[True] - outs[False]).norm() / outs[False].norm())
    flops = 4 * B * H * N * N * D / (2 if causal else 1)
    ms = {False: [], True: []}
    for _ in range(2):
        for fma in (False, True):
            ms[fma].append(time_ms(launches[fma].run))
    tf = {f: [round(flops / m / 1e9) for m in ms[f]] for f in ms}
    print(key, "off", tf[False], "on", tf[True], f"diff {diff:.2e}", flush=True)
    rows.append(dict(point=key, off_tflops=tf[False], on_tflops=tf[True], rel_diff=diff))
    del q, k, v, out, outs
out_dir = os.environ.get("OUT", ".")
json.dump(dict(device_facts(), rows=rows), open(os.path.join(out_dir, "exp2-fma-ab.json"), "w"), indent=1)
