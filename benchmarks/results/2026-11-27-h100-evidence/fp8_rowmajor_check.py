"""The new FP8 dispatch with a row-major V (its K-major copy timed in every call): auto (the
rule's choice) vs the portable kernel forced; B/H/N around the new thresholds."""
import json, os, statistics
import torch, triton
import tileattn
from tileattn import dispatch
from tileattn.bench.common import spin_up, device_facts

ROUNDS = 3
SHAPES = [(4, 32, 1024), (1, 32, 1024), (4, 32, 2048), (8, 32, 512), (1, 32, 256)]
spin_up()
rows = []
for d in (128, 256):
    for b, h, n in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(n + d + b)
        q, k, v = (torch.randn(b, n, h, d, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(3))
        q8, k8, v8, scales = tileattn.quantize_qkv_fp8(q, k, v, v_k_major=False)
        assert v8.stride(3) == 1
        for causal in (False, True):
            work = b * h * n * n * d // (2 if causal else 1)
            def call(force):
                with tileattn.use_kernels(attention=force):
                    return tileattn.attention(q8, k8, v8, causal=causal, **scales)
            names = ["auto", "portable"]
            outs = {m: call(m).float() for m in names}
            times = {m: [] for m in names}
            for r in range(ROUNDS):
                for m in (names if r % 2 == 0 else names[::-1]):
                    call(m)
                    times[m].append(triton.testing.do_bench(lambda: call(m), warmup=25, rep=100, return_mode="median"))
            row = dict(D=d, B=b, H=h, N=n, causal=causal, work_log2=work.bit_length() - 1,
                       max_diff=float((outs["auto"] - outs["portable"]).abs().max()))
            for m in names:
                row[m] = dict(ms=statistics.median(times[m]), ms_rounds=times[m])
            row["auto_speedup"] = row["portable"]["ms"] / row["auto"]["ms"]
            print(f"rowmajorV D={d} B={b} H={h} N={n} causal={causal} 2^{row['work_log2']}: auto {row['auto']['ms']*1e3:.1f} us portable {row['portable']['ms']*1e3:.1f} us -> {row['auto_speedup']:.3f}x", flush=True)
            rows.append(row)
json.dump(dict(device_facts(), rows=rows), open(os.path.join(os.environ.get("OUT", "."), "fp8-rowmajor-check.json"), "w"), indent=1)
