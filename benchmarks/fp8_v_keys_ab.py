"""A/B of the FP8 V key order (TILEATTN_FP8_V_KEYS=natural|grouped, kernels/layout.py) through
attention(), V transposition included, same inputs, do_bench median; outputs compared.
Usage: python benchmarks/fp8_v_keys_ab.py; JSON under $OUT."""

import json
import os

import torch
import triton

import tileattn
from tileattn.bench.common import device_facts, spin_up

POINTS = [(d, n, causal) for d in (64, 128, 256) for n in (1024, 4096, 16384)
          for causal in (False, True)]


def main():
    device = torch.device("cuda")
    spin_up()
    rows = []
    for head_dim, seqlen, causal in POINTS:
        batch, heads = 4, 32
        gen = torch.Generator(device=device).manual_seed(seqlen + head_dim)
        q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device=device, generator=gen)
                   for _ in range(3))
        (q, qd), (k, kd), (v, vd) = (tileattn.quantize_fp8(x) for x in (q, k, v))
        flops = 4 * batch * heads * seqlen * seqlen * head_dim // (2 if causal else 1)
        row, outs = dict(head_dim=head_dim, seqlen=seqlen, causal=causal), {}
        for order in ("natural", "grouped"):
            os.environ["TILEATTN_FP8_V_KEYS"] = order
            call = lambda: tileattn.attention(q, k, v, causal=causal, q_descale=qd,
                                              k_descale=kd, v_descale=vd)
            outs[order] = call().float()
            ms = triton.testing.do_bench(call, warmup=25, rep=200, return_mode="median")
            row[order] = dict(ms=ms, tflops=flops / ms / 1e9)
        row["rel_diff"] = float((outs["grouped"] - outs["natural"]).norm() / outs["natural"].norm())
        rows.append(row)
        print(f"D{head_dim} N{seqlen} {'causal' if causal else 'full'}: natural "
              f"{row['natural']['tflops']:.0f} grouped {row['grouped']['tflops']:.0f} TFLOP/s "
              f"(rel diff {row['rel_diff']:.1e})", flush=True)
    os.environ.pop("TILEATTN_FP8_V_KEYS", None)
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "fp8-v-keys-ab.json"), "w") as f:
        json.dump(dict(device_facts(device), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
