"""Which MLA decode kernel runs where, by measurement: gluon_preferred() says where the Gluon sm90
partial kernel (mla_sm90.py) beat the Triton one (mla_decode.py, which also holds the config
table and the launches; the combine kernel is in mla_decode_combine.py), and fp8_cache_slower()
where an FP8 cache ran slower than a 16-bit one. api.mla_kernel_for and api.mla_plan read them.
"""

from __future__ import annotations

from ..arch import Arch


# Where the Gluon sm90 kernel (tileattn/kernels/mla_sm90.py) runs by default (api.mla_kernel_for).
# H100, batch 768 seq 2048 bf16 (results/2026-11-22-h100-session5/mla-gluon-sweep.json), Triton vs
# Gluon: H64 1.053 vs 0.683 ms (0.60 -> 0.93 of the copy rate), H128 222 vs 399 TFLOP/s; batch
# 128 seq 8192 H128 222 vs 406. The Gluon kernel is the split_dv schedule (one S, P shared), so
# `auto` takes it for split_dv plans only; dup_qk plans stay on Triton. And only from
# GLUON_MIN_KEYS keys in the batch, where it won at every grid point (batch 128 seq 2048 H64
# 0.128 vs 0.189 ms, H128 0.197 vs 0.343; batch 32 seq 8192 H64 0.135 vs 0.198 in the final
# run). Below, launches are host-bound and noisy (the same Triton launch at batch 32 seq 1024
# H32 measured 0.055 and 0.108 ms in two runs; one run had Gluon at 0.34 vs 0.19 ms at batch
# 128 seq 1024 H128), and Gluon was not shown to win: results/2026-11-23-h100-mla-session5b/c.
GLUON_BY_DEFAULT = True
GLUON_MIN_KEYS = 1 << 18
# 32-63 rows (e.g. H32 q_len 1) run the Gluon kernel padded to 64 rows. H100 A/B
# (results/2026-11-23-h100-session6/mla-sm90-ab-rows32.json, Triton vs Gluon ms): batch 768
# seq 1024/2048/8192 H32 0.387/0.709/2.646 vs 0.355/0.651/2.435 (0.85 -> 0.92 of the copy rate
# at seq 2048), batch 128 seq 8192 0.580 vs 0.515, FP8 H32 0.718 vs 0.699; but batch 32 seq
# 8192 (256 work items of the 32-row plan) 0.164 vs 0.353. So below 64 rows Gluon needs
# GLUON_MIN_WORK_FEW_ROWS work items.
GLUON_MIN_WORK_FEW_ROWS = 384


def fp8_cache_slower(arch: Arch, num_rows: int) -> bool:
    """Where an FP8 cache measured slower than a 16-bit one: sm90 with H·q_len >= 64. Both run
    Gluon kernels there, but the FP8 one widens e4m3 tiles of 32 keys in shared memory and is
    bound by its consumers at that tile size (H100, results/2026-11-23-h100-session6/: 0.71 vs
    0.68 ms at H64, 1.39 vs 0.94 ms at H128, batch 768 seq 2048; it was 1.8-2.2x on the Triton
    kernel before). mla_plan warns there rather than leave a silent cliff."""
    return arch.name == "sm90" and num_rows >= 64


def gluon_preferred(plan) -> bool:
    """Whether the Gluon kernel measured faster for this plan (the comment above)."""
    few_rows = plan.num_heads * plan.q_len < 64    # padded up to the kernel's 64-row block
    return (GLUON_BY_DEFAULT and plan.config.schedule == "split_dv"
            and plan.total_keys >= GLUON_MIN_KEYS
            and (not few_rows or plan.num_work >= GLUON_MIN_WORK_FEW_ROWS))
