"""Which MLA decode kernel runs where, by measurement: gluon_preferred() says where the Gluon sm90
partial kernel (mla_sm90.py) beat the Triton one (mla_decode.py, which also holds the config
table and the launches; the combine kernel is in mla_decode_combine.py), and fp8_cache_slower()
where an FP8 cache ran slower than a 16-bit one. api.mla_kernel_for and api.mla_plan read them.
"""

from __future__ import annotations

from ..arch import Arch


# Where the Gluon sm90 kernel (tileattn/kernels/mla_sm90.py) runs by default (api.mla_kernel_for):
# every split_dv plan it supports (H·q_len >= 32, page_size a multiple of 64); dup_qk plans stay
# on Triton. H100 (results/2026-11-22-h100-session5/mla-gluon-sweep.json), batch 768 seq 2048
# bf16, Triton vs Gluon: H64 1.053 vs 0.683 ms, H128 222 vs 399 TFLOP/s. At small batches, timed
# from CUDA graphs (results/2026-11-23-h100-session7/mla-ab-small*.json), Gluon won at every
# shape tried, 32-row plans padded to 64 included: batch 1 seq 8192 H32/H64/H128 0.0165/0.0180/
# 0.0225 vs 0.0223/0.0255/0.0305 ms, batch 32 seq 1024 H32 0.037 vs 0.042, batch 32 seq 8192 H32
# 0.128 vs 0.146, H64 0.124 vs 0.190, batch 768 seq 2048 H32 FP8 0.683 vs 0.725. Sessions 5-6 had
# kept small batches (under 2^18 keys, or under 384 work items at 32 rows) on Triton from eager
# timings, which at those sizes measure host launch overhead, not the kernels.
GLUON_BY_DEFAULT = True


def fp8_cache_slower(arch: Arch, num_rows: int) -> bool:
    """Where an FP8 cache measured slower than a 16-bit one: sm90 with H·q_len >= 32, where
    both run Gluon kernels (32-63 rows padded to 64). The FP8 one widens e4m3 tiles of 32 keys
    in shared memory and is bound by its consumers at that tile size. H100, FP8 time / bf16
    time: batch 768 seq 2048 H64 0.71 / 0.68 ms, H128 1.39 / 0.94 (results/2026-11-23-h100-
    session6/); session 7's grid (results/2026-11-23-h100-mla.json) H32 at batch 768 seq
    2048/8192 1.06x/1.07x, batch 128 seq 8192 1.10x, batch 32 seq 8192 1.01x. (16 rows stay on
    the Triton kernel, where FP8 is 1.3x faster from batch 32 up.) mla_plan warns there rather
    than leave a silent cliff."""
    return arch.name == "sm90" and num_rows >= 32


def gluon_preferred(plan) -> bool:
    """Whether the Gluon kernel measured faster for this plan (the comment above); whether it
    supports the inputs is mla_sm90.supports."""
    return GLUON_BY_DEFAULT and plan.config.schedule == "split_dv"
