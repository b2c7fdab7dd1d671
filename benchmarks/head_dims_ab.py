"""attention() with TILEATTN_KERNEL=sm90 vs portable at head dims the Hopper kernel pads (96,
192) and at Dv != D (192/128: DeepSeek's prefill), bf16 and FP8 e4m3 (V transposed in the
call); same inputs, outputs compared, eager calls timed with do_bench (median). Decides
attention_sm90_policy.preferred() for those dims.

    python benchmarks/head_dims_ab.py [OUT_DIR]
"""

import json
import os
import sys

import torch

import tileattn
from tileattn.bench.common import device_facts, spin_up, time_ms

DIMS = [(192, 128), (96, 96), (192, 192)]
POINTS = [(n, causal) for n in (2048, 8192) for causal in (False, True)]
BATCH, HEADS = 4, 32


def main(out_dir: str) -> None:
    spin_up()
    rows = []
    for head_dim, head_dim_v in DIMS:
        for context, causal in POINTS:
            gen = torch.Generator(device="cuda").manual_seed(context + head_dim)
            q, k = (torch.randn(BATCH, context, HEADS, head_dim, device="cuda", generator=gen)
                    for _ in range(2))
            v = torch.randn(BATCH, context, HEADS, head_dim_v, device="cuda", generator=gen)
            flop = 2 * BATCH * HEADS * context * context * (head_dim + head_dim_v)
            flop //= 2 if causal else 1
            for dtype in ("bf16", "fp8e4m3"):
                if dtype == "bf16":
                    args, kwargs = [x.bfloat16() for x in (q, k, v)], {}
                else:
                    (q8, qd), (k8, kd), (v8, vd) = (tileattn.quantize_fp8(x) for x in (q, k, v))
                    args, kwargs = [q8, k8, v8], dict(q_descale=qd, k_descale=kd, v_descale=vd)
                row = {"D": head_dim, "Dv": head_dim_v, "N": context, "causal": causal,
                       "dtype": dtype}
                outs = {}
                for kernel in ("portable", "sm90"):
                    os.environ["TILEATTN_KERNEL"] = kernel
                    call = lambda: tileattn.attention(*args, causal=causal, **kwargs)  # noqa: E731
                    outs[kernel] = call().float()
                    row[kernel] = flop / time_ms(call) / 1e9
                row["max_abs_diff"] = float((outs["sm90"] - outs["portable"]).abs().max())
                rows.append(row)
                print(json.dumps(row), flush=True)
    os.environ.pop("TILEATTN_KERNEL")
    with open(os.path.join(out_dir, "head-dims-ab.json"), "w") as f:
        json.dump({**device_facts(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
