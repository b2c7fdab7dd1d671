"""A/B of the FP8 V key order (TILEATTN_FP8_V_KEYS=natural|grouped, kernels/layout.py) on both
forward kernels (TILEATTN_KERNEL=portable|sm90, the Gluon one also with ping-pong consumers)
through attention(), V transposition included, same inputs, do_bench median; outputs compared
with the first variant's.
Usage: python benchmarks/fp8_v_keys_ab.py; JSON under $OUT."""

import dataclasses
import json
import os

import torch
import triton

import tileattn
from tileattn.bench.common import device_facts, spin_up
from tileattn.kernels import attention_sm90 as sm90

LOCKSTEP = dict(sm90.CONFIGS)

# sm90-pingpong: the Gluon kernel with FP8 rows switched to ping-pong consumers (split=True;
# the FP8 rows ship lockstep until this has run on a GPU).
VARIANTS = [(kernel, order) for kernel in ("portable", "sm90", "sm90-pingpong")
            for order in ("natural", "grouped")]
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
        for kernel, order in VARIANTS:
            os.environ["TILEATTN_FP8_V_KEYS"] = order
            os.environ["TILEATTN_KERNEL"] = kernel.split("-")[0]
            for key in [key for key in sm90.CONFIGS if key[1]]:
                sm90.CONFIGS[key] = dataclasses.replace(LOCKSTEP[key],
                                                        split=kernel.endswith("pingpong"))
            name = f"{kernel}-{order}"
            call = lambda: tileattn.attention(q, k, v, causal=causal, q_descale=qd,
                                              k_descale=kd, v_descale=vd)
            outs[name] = call().float()
            ms = triton.testing.do_bench(call, warmup=25, rep=200, return_mode="median")
            first = next(iter(outs.values()))
            row[name] = dict(ms=ms, tflops=flops / ms / 1e9,
                             rel_diff=float((outs[name] - first).norm() / first.norm()))
        rows.append(row)
        print(f"D{head_dim} N{seqlen} {'causal' if causal else 'full'}: " + "  ".join(
            f"{name} {r['tflops']:.0f}{'' if r['rel_diff'] < 5e-2 else ' WRONG'}"
            for name, r in row.items() if isinstance(r, dict)), flush=True)
    for name in ("TILEATTN_FP8_V_KEYS", "TILEATTN_KERNEL"):
        os.environ.pop(name, None)
    sm90.CONFIGS.update(LOCKSTEP)
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "fp8-v-keys-ab.json"), "w") as f:
        json.dump(dict(device_facts(device), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
