"""FP8 kernel choice: the Hopper (Gluon) kernel vs the portable one forced, over call sizes
around dispatch.SM90_MIN_WORK_FP8 (work = B*H*Sq*Sk*D, halved under causal). e4m3 per tensor
from quantize_qkv_fp8, timed through tileattn.attention (host included, as callers see it);
interleaved rounds; outputs compared."""
import json, os, statistics
import torch, triton
import tileattn
from tileattn.bench.common import spin_up, device_facts

ROUNDS = int(os.environ.get("ROUNDS", 3))
SHAPES = [(1, 32, 256), (1, 16, 512), (2, 16, 512), (1, 32, 1024), (1, 8, 2048), (4, 16, 1024),
          (8, 32, 512), (4, 32, 1024), (2, 32, 2048)]
spin_up()
rows = []
for d in (128, 256):
    for b, h, n in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(n + d + b + h)
        q, k, v = (torch.randn(b, n, h, d, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(3))
        q8, k8, v8, scales = tileattn.quantize_qkv_fp8(q, k, v)
        for causal in (False, True):
            work = b * h * n * n * d // (2 if causal else 1)
            def call(force):
                with tileattn.use_kernels(attention=force):
                    return tileattn.attention(q8, k8, v8, causal=causal, **scales)
            names = ["sm90", "portable"]
            outs = {m: call(m).float() for m in names}
            diff = float((outs["sm90"] - outs["portable"]).abs().max())
            times = {m: [] for m in names}
            for r in range(ROUNDS):
                for m in (names if r % 2 == 0 else names[::-1]):
                    call(m)
                    times[m].append(triton.testing.do_bench(lambda: call(m), warmup=25, rep=100, return_mode="median"))
            row = dict(D=d, B=b, H=h, N=n, causal=causal, work_log2=work.bit_length() - 1, max_diff=diff)
            for m in names:
                row[m] = dict(ms=statistics.median(times[m]), ms_rounds=times[m])
            row["sm90_speedup"] = row["portable"]["ms"] / row["sm90"]["ms"]
            print(f"D={d} B={b} H={h} N={n} causal={causal} work=2^{row['work_log2']}: sm90 {row['sm90']['ms']*1e3:.1f} us portable {row['portable']['ms']*1e3:.1f} us -> sm90 {row['sm90_speedup']:.3f}x  diff {diff:.1e}", flush=True)
            rows.append(row)
        del q, k, v, q8, k8, v8
json.dump(dict(device_facts(), rows=rows), open(os.path.join(os.environ.get("OUT", "."), "fp8-threshold.json"), "w"), indent=1)
