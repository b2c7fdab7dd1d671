"""What an MLA decode with FP8 GEMMs would cost in accuracy, emulated in float64 on the CPU
(no GPU needed): relative L2 error of the output against fp64 attention on the same e4m3 cache,
for H=64 heads, q in bf16, the cache as the GPU tests make it (randn / 0.02 in e4m3).

Columns:
- today: both GEMMs on the 16-bit values (the cache widened exactly), P rounded to bf16;
- split q: QK^T from q split into two e4m3 halves with a per-row power-of-two scale
  (q * s = hi + lo / 16), P still bf16;
- split q, P e4m3: and P rounded to e4m3 for an FP8 P @ V;
- same, normalised by the row sum of the rounded P.
FP8 wgmma's reduced accumulation precision is not modelled.

    python benchmarks/mla_fp8_mma_numerics.py
"""

import torch

E4M3 = torch.float8_e4m3fn
SCALE = 1.0 / 192 ** 0.5


def e4m3(x: torch.Tensor) -> torch.Tensor:
    return x.to(E4M3).to(torch.float64)


def errors(seq_len: int, heads: int = 64, q_magnitude: float = 1.0) -> list[float]:
    kv = e4m3(torch.randn(seq_len, 576, dtype=torch.float64) / 0.02) * 0.02
    q = (torch.randn(heads, 576, dtype=torch.float64) * q_magnitude).to(torch.bfloat16).double()
    v = kv[:, :512]
    scores = q @ kv.T * SCALE
    ref = torch.softmax(scores, -1) @ v

    def attend(s, p_round, sum_rounded=False):
        p = torch.exp(s - s.max(-1, keepdim=True).values)
        p_used = p_round(p)
        return (p_used @ v) / (p_used if sum_rounded else p).sum(-1, keepdim=True)

    bf16 = lambda p: p.to(torch.bfloat16).double()  # noqa: E731
    row_scale = torch.exp2(torch.floor(torch.log2(448 / q.abs().amax(-1, keepdim=True))))
    hi = e4m3(q * row_scale)
    lo = e4m3((q * row_scale - hi) * 16)
    split_scores = (hi @ kv.T + lo @ kv.T / 16) / row_scale * SCALE
    outs = [attend(scores, bf16), attend(split_scores, bf16), attend(split_scores, e4m3),
            attend(split_scores, e4m3, sum_rounded=True)]
    return [float((o - ref).norm() / ref.norm()) for o in outs]


def main() -> None:
    torch.manual_seed(0)
    print("seq_len  today    split q  +P e4m3  +P e4m3, l of rounded P")
    for seq_len in (4, 64, 1000, 4097):
        print(f"{seq_len:7d}  " + "  ".join(f"{e:.1e}" for e in errors(seq_len)))
    print("q x 30:  " + "  ".join(f"{e:.1e}" for e in errors(1000, q_magnitude=30.0)))


if __name__ == "__main__":
    main()
