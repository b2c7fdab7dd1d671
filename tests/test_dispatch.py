"""Which kernel runs: dispatch.py is a pure function of chip, inputs and settings. CPU tensors
stand in for device tensors (the rules read only shapes, dtypes and strides)."""

import subprocess
import sys

import pytest
import torch

import tileattn
from tileattn import dispatch
from tileattn.arch import arch_for_capability
from tileattn.fp8 import prepare_v

SM90, SM80, SM89, SM100 = (arch_for_capability(c) for c in ((9, 0), (8, 0), (8, 9), (10, 0)))
AUTO = dispatch.Settings()


def inputs(dtype=torch.bfloat16, head_dim=128, seqlen=4096, heads=32, head_dim_v=None):
    """Uninitialised: the rules read no values. B=1 H=32 N=4096 D=128 is 2^36 of work (2^35
    under a causal mask)."""
    q, k = (torch.empty(1, seqlen, heads, head_dim, dtype=dtype) for _ in range(2))
    v = torch.empty(1, seqlen, heads, head_dim_v or head_dim, dtype=dtype)
    return q, k, v


def kernel(arch, q, k, v, causal, settings=AUTO):
    return dispatch.attention_kernel(arch, q, k, v, causal, settings)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dims", [(128, 128), (256, 256), (96, 96), (192, 128), (192, 192),
                                  (128, 64)], ids=lambda d: f"D{d[0]}-Dv{d[1]}")
def test_hopper_kernel_where_it_measured_faster(dtype, dims, causal):
    head_dim, head_dim_v = dims
    assert kernel(SM90, *inputs(dtype, head_dim, head_dim_v=head_dim_v), causal) == "sm90"


def test_short_contexts_stay_portable_where_the_launch_outlasts_the_kernel():
    def work(batch, seqlen, heads, head_dim):
        return (torch.empty(batch, seqlen, heads, head_dim, dtype=torch.bfloat16)
                for _ in range(3))
    # D=128: from 2^29 of work (B=1 H=32 N=512, causal); B=1 H=8 N=256 is 2^26.
    assert kernel(SM90, *work(1, 512, 32, 128), True) == "sm90"
    assert kernel(SM90, *work(4, 1024, 32, 128), True) == "sm90"
    assert kernel(SM90, *work(1, 256, 8, 128), False) == "portable"
    assert kernel(SM90, *work(1, 256, 32, 128), True) == "portable"      # 2^28
    # D=64: from 2^32 (B=4 H=32 N=1024 causal); B=1 H=32 N=1024 causal is 2^30.
    assert kernel(SM90, *work(4, 1024, 32, 64), True) == "sm90"
    assert kernel(SM90, *work(4, 4096, 32, 64), False) == "sm90"
    assert kernel(SM90, *work(1, 1024, 32, 64), True) == "portable"
    assert kernel(SM90, *work(1, 1024, 32, 64), False) == "portable"     # 2^31


def test_fewer_queries_than_a_hopper_tile_keep_the_earlier_rule():
    """seqlen_q < 128: the Hopper kernel computes a whole 128-row tile anyway; from 2^34 of
    work as before, never at D=64."""
    def work(batch, seqlen_q, seqlen_k, head_dim):   # meta tensors: shapes without memory
        q = torch.empty(batch, seqlen_q, 32, head_dim, dtype=torch.bfloat16, device="meta")
        k = v = torch.empty(batch, seqlen_k, 32, head_dim, dtype=torch.bfloat16, device="meta")
        return q, k, v
    assert kernel(SM90, *work(64, 1, 32768, 128), False) == "portable"    # 2^33
    assert kernel(SM90, *work(128, 1, 32768, 128), False) == "sm90"       # 2^34
    assert kernel(SM90, *work(128, 64, 32768, 64), False) == "portable"
    assert kernel(SM90, *work(1, 128, 32768, 128), False) == "sm90"       # 2^31, a whole tile
    packed = torch.empty(512, 32, 128, dtype=torch.bfloat16)   # 512 queries x 4096 keys: 2^33
    assert dispatch.varlen_kernel(SM90, packed, packed, packed, 16, 4096, False,
                                  AUTO) == "portable"
    assert dispatch.varlen_kernel(SM90, packed, packed, packed, 512, 4096, False,
                                  AUTO) == "sm90"


@pytest.mark.parametrize("case", ["fp8", "d64", "short", "short-causal", "sm80", "sm89",
                                  "sm100", "misaligned", "k-major-v"])
def test_portable_kernel_elsewhere(case):
    arch = {"sm80": SM80, "sm89": SM89, "sm100": SM100}.get(case, SM90)
    short = case.startswith("short") or case in ("fp8", "d64")
    q, k, v = inputs(torch.float8_e4m3fn if case == "fp8" else torch.bfloat16,
                     64 if case == "d64" else 128, 256 if short else 4096,
                     heads=8 if short else 32)
    if case in ("fp8", "k-major-v"):
        v = prepare_v(v)
    if case == "misaligned":  # rows of 132 bf16 (264 B): strides TMA cannot address
        q = torch.empty(1, 4096, 32, 132, dtype=torch.bfloat16)[..., :128]
    assert kernel(arch, q, k, v, case == "short-causal") == "portable"


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
def test_fp8_takes_the_hopper_kernel_with_enough_work(dtype):
    """FP8 from 2^34 of work, under a causal mask from 2^33 (work halved), fewer queries than a
    tile from 2^36; D != 64, V K-major (as the call copies it); a row-major V stays portable."""
    for head_dim, seqlen in ((128, 4096), (256, 4096), (96, 8192), (128, 2048)):
        q, k, v = inputs(dtype, head_dim, seqlen)
        assert kernel(SM90, q, k, prepare_v(v), False) == "sm90"
        assert kernel(SM90, q, k, v, False) == "portable"               # row-major V
    q, k, v = inputs(dtype, 128, 2048, heads=16)                        # 2^33
    assert kernel(SM90, q, k, prepare_v(v), False) == "portable"
    assert kernel(SM90, q, k, prepare_v(v), True) == "portable"         # 2^32 causal
    q, k, v = inputs(dtype, 128, 2048)                                  # 2^34
    assert kernel(SM90, q, k, prepare_v(v), True) == "sm90"             # 2^33 causal
    q, k, v = inputs(dtype, 64)
    assert kernel(SM90, q, k, prepare_v(v), False) == "portable"
    # 64 queries, 2^18 keys: 2^36 of work, 2^35 under a causal mask.
    q = torch.empty(1, 64, 32, 128, dtype=dtype)
    k = v = torch.empty(1, 1 << 18, 32, 128, dtype=dtype)
    assert kernel(SM90, q, k, prepare_v(v), False) == "sm90"
    assert kernel(SM90, q, k, prepare_v(v), True) == "portable"


def test_settings_force_either_kernel_where_it_runs():
    q, k, v = inputs()
    assert kernel(SM90, q, k, v, False, dispatch.Settings(attention="portable")) == "portable"
    q, k, v = inputs(head_dim=64, seqlen=128)
    assert kernel(SM90, q, k, v, True, dispatch.Settings(attention="sm90")) == "sm90"
    # Forcing never sends inputs to a kernel that cannot run them.
    q8, k8, v8 = inputs(torch.float8_e4m3fn, seqlen=128)
    forced = dispatch.Settings(attention="sm90")
    assert kernel(SM90, q8, k8, prepare_v(v8), False, forced) == "sm90"
    assert kernel(SM90, q8, k8, v8, False, forced) == "portable"      # row-major V
    assert kernel(SM80, q, k, v, False, dispatch.Settings(attention="sm90")) == "portable"


def test_use_kernels_scopes_the_override():
    assert dispatch.current() == AUTO
    with tileattn.use_kernels(attention="portable") as settings:
        assert dispatch.current().attention == "portable" == settings.attention
        with tileattn.use_kernels(mla="triton"):
            assert dispatch.current() == dispatch.Settings(attention="portable", mla="triton")
        assert dispatch.current().mla == "auto"
    assert dispatch.current() == AUTO
    with pytest.raises(ValueError, match="attention kernel must be one of"):
        with tileattn.use_kernels(attention="cudnn"):
            pass


@pytest.mark.parametrize("rows,page_size,kv_dtype,schedule,expected", [
    (64, 64, torch.bfloat16, "split_dv", "gluon"),
    (32, 64, torch.float8_e4m3fn, "split_dv", "gluon"),
    (16, 64, torch.bfloat16, "split_dv", "triton"),     # too few rows for a 64-row wgmma tile
    (128, 16, torch.bfloat16, "split_dv", "triton"),    # a tile must lie in one page
    (128, 64, torch.bfloat16, "dup_qk", "triton"),
])
def test_mla_plan_kernel(rows, page_size, kv_dtype, schedule, expected):
    assert dispatch.mla_kernel(SM90, rows, page_size, kv_dtype, schedule, AUTO) == expected
    assert dispatch.mla_kernel(SM80, rows, page_size, kv_dtype, schedule, AUTO) == "triton"
    forced = dispatch.Settings(mla="triton")
    assert dispatch.mla_kernel(SM90, rows, page_size, kv_dtype, schedule, forced) == "triton"


def test_environment_is_read_once_at_import_and_checked():
    code = ("import tileattn, os; from tileattn import dispatch; "
            "os.environ['TILEATTN_KERNEL'] = 'sm90'; print(dispatch.current().attention)")
    run = lambda env: subprocess.run([sys.executable, "-c", code], capture_output=True,
                                     text=True, env=env)
    import os
    base = {k: v for k, v in os.environ.items() if not k.startswith("TILEATTN_")}
    done = run({**base, "TILEATTN_KERNEL": "portable"})
    assert done.returncode == 0 and done.stdout.strip() == "portable", done.stderr
    done = run({**base, "TILEATTN_KERNEL": "cudnn"})
    assert done.returncode != 0 and "TILEATTN_KERNEL" in done.stderr
