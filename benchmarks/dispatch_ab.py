"""attention() with TILEATTN_KERNEL=sm90 vs portable at the points where the dispatch
threshold (attention_sm90_policy.MIN_WORK) is decided; eager calls, the host path included.

    python benchmarks/dispatch_ab.py [OUT_DIR]
"""

import json
import os
import sys

import torch

import tileattn
from tileattn.bench.common import device_facts, spin_up, time_ms
from tileattn.bench.prefill import flops

POINTS = [(128, 1024, False), (128, 1024, True), (128, 2048, True), (256, 1024, True),
          (128, 2048, False)]


def main(out_dir: str) -> None:
    spin_up()
    rows = []
    for head_dim, context, causal in POINTS:
        q, k, v = (torch.randn(4, context, 32, head_dim, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        row = {"D": head_dim, "N": context, "causal": causal}
        for kernel in ("portable", "sm90"):
            os.environ["TILEATTN_KERNEL"] = kernel
            call = lambda: tileattn.attention(q, k, v, causal=causal)  # noqa: E731
            call()
            row[kernel] = flops(context, head_dim, causal) / time_ms(call) / 1e9
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open(os.path.join(out_dir, "dispatch-ab.json"), "w") as f:
        json.dump({**device_facts(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
