"""FP8 D=128 Hopper kernel: 2 vs 3 K/V stages (128-key blocks), interleaved, 3 rounds."""
import json, os, torch
import tileattn
from tileattn import fp8
from tileattn.bench.common import device_facts, spin_up, time_ms
from tileattn.kernels.attention import sm90
B, H, D = 4, 32, 128
spin_up()
rows = []
for N in (4096, 16384):
    x = [torch.randn(B, N, H, D, device="cuda") for _ in range(3)]
    (q, qd), (k, kd), (v, vd) = (tileattn.quantize_fp8(t, torch.float8_e4m3fn) for t in x)
    v = fp8.k_major_copy(v, grouped=True)
    del x
    out = torch.empty(B, N, H, D, device="cuda", dtype=torch.bfloat16)
    for causal in (False, True):
        launches = {st: sm90.attention_sm90_launch(q, k, v, out, None, D ** -0.5, causal, config=sm90.Sm90Config(128, st, split=True), q_descale=qd, k_descale=kd, v_descale=vd, v_keys_grouped=True) for st in (2, 3)}
        outs = {}
        for st, l in launches.items():
            l.run(); outs[st] = out.float().clone()
        diff = float((outs[2] - outs[3]).norm() / outs[2].norm())
        flops = 4 * B * H * N * N * D / (2 if causal else 1)
        tf = {st: [] for st in launches}
        for _ in range(3):
            for st, l in launches.items():
                tf[st].append(round(flops / time_ms(l.run) / 1e9))
        print(N, causal, tf, f"diff {diff:.1e}", flush=True)
        rows.append(dict(N=N, causal=causal, tflops=tf, diff=diff))
json.dump(dict(device_facts(), rows=rows), open(os.path.join(os.environ.get("OUT", "."), "fp8-stages-ab.json"), "w"), indent=1)
