"""FP8 at head dim 64: the Hopper kernel vs the portable one, both forced, V K-major and
row-major (its copy timed); B=4 H=32 N 1k/4k/16k and smaller calls; interleaved rounds."""
import json, os, statistics
import torch, triton
import tileattn
from tileattn.bench.common import spin_up, device_facts

ROUNDS = 3
SHAPES = [(4, 32, 16384), (4, 32, 4096), (4, 32, 1024), (1, 32, 4096), (2, 32, 2048), (1, 32, 1024)]
spin_up()
rows = []
for b, h, n in SHAPES:
    gen = torch.Generator(device="cuda").manual_seed(n + b)
    q, k, v = (torch.randn(b, n, h, 64, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(3))
    for k_major in (True, False):
        q8, k8, v8, scales = tileattn.quantize_qkv_fp8(q, k, v, v_k_major=k_major)
        for causal in (False, True):
            work = b * h * n * n * 64 // (2 if causal else 1)
            flops = 4 * b * h * n * n * 64 * (0.5 if causal else 1.0)
            def call(force):
                with tileattn.use_kernels(attention=force):
                    return tileattn.attention(q8, k8, v8, causal=causal, **scales)
            from tileattn import dispatch
            from tileattn.arch import arch_of
            vk = tileattn.prepare_v(v8)
            chosen = dispatch.attention_kernel(arch_of(q8.device), q8, k8, vk, causal, dispatch.Settings(attention="sm90"))
            assert chosen == "sm90", chosen
            names = ["sm90", "portable"]
            outs = {m: call(m).float() for m in names}
            times = {m: [] for m in names}
            for r in range(ROUNDS):
                for m in (names if r % 2 == 0 else names[::-1]):
                    call(m)
                    times[m].append(triton.testing.do_bench(lambda: call(m), warmup=25, rep=100, return_mode="median"))
            row = dict(D=64, B=b, H=h, N=n, causal=causal, v_k_major=k_major, work_log2=work.bit_length() - 1,
                       max_diff=float((outs["sm90"] - outs["portable"]).abs().max()))
            for m in names:
                ms = statistics.median(times[m])
                row[m] = dict(ms=ms, ms_rounds=times[m], tflops=flops / ms / 1e9)
            row["sm90_speedup"] = row["portable"]["ms"] / row["sm90"]["ms"]
            print(f"D=64 B={b} H={h} N={n} causal={causal} V {'K-major' if k_major else 'row-major'} 2^{row['work_log2']}: sm90 {row['sm90']['tflops']:.0f} portable {row['portable']['tflops']:.0f} TFLOP/s -> {row['sm90_speedup']:.3f}x diff {row['max_diff']:.1e}", flush=True)
            rows.append(row)
json.dump(dict(device_facts(), rows=rows), open(os.path.join(os.environ.get("OUT", "."), "fp8-d64.json"), "w"), indent=1)
