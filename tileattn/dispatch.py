"""Which kernel runs: the one room for every kernel choice.

Decisions come from the chip's row in arch.py, the (already checked) inputs and explicit
settings. Each kernel says what it can run (its own `supports()`); this module says where it
*should* run, by measurement (docs/design.md, "Kernel choice"). Settings are resolved once:
the environment variables TILEATTN_KERNEL and TILEATTN_MLA_KERNEL are read when tileattn is
imported, and `tileattn.use_kernels(...)` overrides them within a `with` block. Nothing here
reads the environment per call.
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass, replace

import torch

from .arch import FP8_DTYPES, Arch

ATTENTION_KERNELS = ("auto", "portable", "sm90")
MLA_KERNELS = ("auto", "triton", "gluon")


@dataclass(frozen=True)
class Settings:
    """Explicit kernel choices. "auto" takes the measured choice; another value forces that
    kernel wherever it supports the inputs (and the default kernel elsewhere)."""
    attention: str = "auto"   # attention, forward and backward: "auto", "portable" or "sm90"
    mla: str = "auto"         # MLA decode partial kernel: "auto", "triton" or "gluon"

    def __post_init__(self):
        for name, value, allowed in (("attention", self.attention, ATTENTION_KERNELS),
                                     ("mla", self.mla, MLA_KERNELS)):
            if value not in allowed:
                raise ValueError(f"{name} kernel must be one of {allowed}, got {value!r}")


def _from_environment() -> Settings:
    try:
        return Settings(attention=os.environ.get("TILEATTN_KERNEL", "auto"),
                        mla=os.environ.get("TILEATTN_MLA_KERNEL", "auto"))
    except ValueError as error:
        raise ValueError(f"TILEATTN_KERNEL / TILEATTN_MLA_KERNEL: {error}") from None


_DEFAULT = _from_environment()
_local = threading.local()


def current() -> Settings:
    """The settings in force (the innermost use_kernels block of this thread, else the
    environment's at import)."""
    return getattr(_local, "settings", _DEFAULT)


@contextlib.contextmanager
def use_kernels(*, attention: str | None = None, mla: str | None = None):
    """Force kernel choices inside a `with` block (benchmarks, A/B tests, workarounds):
    `with tileattn.use_kernels(attention="portable"): ...`. None keeps the current choice."""
    previous = current()
    changes = {name: value for name, value in (("attention", attention), ("mla", mla))
               if value is not None}
    _local.settings = replace(previous, **changes)
    try:
        yield _local.settings
    finally:
        _local.settings = previous


# ---- forward attention -----------------------------------------------------------------------

# Smallest batch·q_heads·seqlen_q·seqlen_k·head_dim (halved under a causal mask) for which the
# 16-bit Hopper kernel beats the portable one: below it, the persistent kernel's launch costs
# more than its faster tiles save. At head dim 64 the two tie without a mask and the portable
# one wins short causal calls (docs/design.md, "Kernel choice").
SM90_MIN_WORK = 1 << 29
SM90_MIN_WORK_D64 = 1 << 32
# Those measurements had seqlen_q >= 512. Fewer queries than one Hopper tile (128 rows, all
# computed) keep the earlier rule, 2^34 and never at D=64, which no measurement overturned.
SM90_TILE_QUERIES = 128
SM90_MIN_WORK_FEW_QUERIES = 1 << 34
# FP8 on the Hopper kernel: both forced, with V K-major or row-major (its copy timed), it won
# at every measured call from 2^34 of work on (2^33 under a causal mask, work halved); below,
# calls of one sequence lost where the Hopper path's copy and host time outweigh its faster
# tiles (docs/design.md, "Kernel choice"). Fewer queries than a tile keep the earlier 2^36:
# unmeasured there.
SM90_MIN_WORK_FP8 = 1 << 34
SM90_MIN_WORK_FP8_CAUSAL = 1 << 33
SM90_MIN_WORK_FP8_FEW_QUERIES = 1 << 36


def attention_kernel(arch: Arch, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     causal: bool, settings: Settings) -> str:
    """The forward kernel for checked inputs (v already in the layout the call will pass):
    "sm90" (the Gluon Hopper kernel) where the chip has wgmma, the kernel measured faster (16-bit
    inputs with enough work, FP8 ones except D = 64) or is forced, and it supports the inputs
    (FP8: v as the call will pass it, K-major);
    "portable" otherwise. Asked only for calls the Hopper kernel can mask: softcap, ALiBi,
    windows whose right bound is causal's or none (ops/attention.py)."""
    if settings.attention == "portable" or not arch.has_wgmma or arch.name == "cpu":
        return "portable"
    if settings.attention == "auto" and not _sm90_preferred(q, k, causal):
        return "portable"
    from .kernels.attention import sm90  # Gluon: imported only where it can run
    return "sm90" if sm90.supports(q, k, v, causal) else "portable"


def flex_kernel(arch: Arch, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                block_sizes: tuple[int, int] | None, mask_mod, settings: Settings) -> str:
    """The kernel of a flex_attention call (ops/flex.py; q, k, v [B, S, H, D] views):
    attention_kernel's rule for non-causal calls, where the Hopper kernel's tiles fit the
    BlockMask: 128-query tiles inside its query blocks, key blocks a multiple of 64 keys
    (block_sizes (query, key) None: no block lists, which it takes only without a mask hook),
    and one K/V per batch entry (no stride-0 batch broadcast for TMA). FP8: v K-major."""
    if block_sizes is None and mask_mod is not None:
        return "portable"
    if block_sizes is not None and (block_sizes[0] % 128 or block_sizes[1] % 64):
        return "portable"
    if k.stride(0) == 0 or v.stride(0) == 0:
        return "portable"
    return attention_kernel(arch, q, k, v, False, settings)


def varlen_kernel(arch: Arch, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  max_seqlen_q: int, max_seqlen_k: int, causal: bool, settings: Settings) -> str:
    """The kernel of an attention_varlen prefill (packed q [total_q, Hq, D], k/v [total_k,
    Hkv, D]; no block table, a right window bound causal's or none): attention_kernel's rule,
    with the work of total_q queries against the longest sequence's keys."""
    if settings.attention == "portable" or not arch.has_wgmma or arch.name == "cpu":
        return "portable"
    total_q, num_q_heads, head_dim = q.shape
    work = total_q * num_q_heads * max_seqlen_k * head_dim // (2 if causal else 1)
    if settings.attention == "auto" and not (q.dtype in (torch.float16, torch.bfloat16)
                                             and _sm90_wins_16bit(head_dim, max_seqlen_q, work)):
        return "portable"
    from .kernels.attention import sm90
    return "sm90" if sm90.supports_packed(q, k, v) else "portable"


def _sm90_preferred(q: torch.Tensor, k: torch.Tensor, causal: bool) -> bool:
    batch, seqlen_q, num_q_heads, head_dim = q.shape
    work = batch * num_q_heads * seqlen_q * k.shape[1] * head_dim // (2 if causal else 1)
    if q.dtype in FP8_DTYPES:
        if seqlen_q < SM90_TILE_QUERIES:
            least = SM90_MIN_WORK_FP8_FEW_QUERIES
        else:
            least = SM90_MIN_WORK_FP8_CAUSAL if causal else SM90_MIN_WORK_FP8
        return head_dim != 64 and work >= least
    return (q.dtype in (torch.float16, torch.bfloat16)
            and _sm90_wins_16bit(head_dim, seqlen_q, work))


def _sm90_wins_16bit(head_dim: int, seqlen_q: int, work: int) -> bool:
    """The 16-bit rule: SM90_MIN_WORK (SM90_MIN_WORK_D64 at head dim 64); for fewer queries
    than a tile, SM90_MIN_WORK_FEW_QUERIES and never at head dim 64."""
    if seqlen_q < SM90_TILE_QUERIES:
        return head_dim != 64 and work >= SM90_MIN_WORK_FEW_QUERIES
    return work >= (SM90_MIN_WORK_D64 if head_dim == 64 else SM90_MIN_WORK)


# ---- backward ---------------------------------------------------------------------------------

def backward_kernel(arch: Arch, settings: Settings) -> str:
    """The kernels of an attention backward: "sm90" (kernels/attention/sm90_bwd.py's dK/dV and
    dQ kernels, which bwd.backward_launches runs wherever they support the call, the portable
    ones elsewhere; measured faster at D=128, docs/design.md, "Backward") on Hopper unless the
    portable kernels are forced; "portable" otherwise."""
    if settings.attention == "portable" or arch.name != "sm90":
        return "portable"
    return "sm90"


# ---- MLA decode ------------------------------------------------------------------------------

def mla_kernel(arch: Arch, num_rows: int, page_size: int, kv_dtype: torch.dtype,
               schedule: str, settings: Settings) -> str:
    """The MLA partial kernel a plan will run (decided by mla_plan, stored in the plan):
    "gluon" (kernels/mla/sm90.py, sm90_fp8.py for an e4m3 cache) on sm90 for split_dv plans it
    supports — it beat the Triton kernel at every batch size timed from CUDA graphs — and
    "triton" (kernels/mla/decode.py) otherwise."""
    if settings.mla == "triton" or arch.name != "sm90" or schedule != "split_dv":
        return "triton"
    from .kernels.mla import sm90  # Gluon: imported only where it can run
    return "gluon" if sm90.supports_plan(num_rows, page_size, kv_dtype) else "triton"


def fp8_mla_cache_slower(arch: Arch, num_rows: int) -> bool:
    """Where an FP8 MLA cache measured slower than a 16-bit one: sm90 with H·q_len > 64, two or
    more 64-row blocks a work item, where both run Gluon kernels, the 16-bit one is bound by
    its tensor cores and the FP8 one also waits for each tile's widening (docs/design.md, "MLA
    decode"). mla_plan warns there rather than leave a silent cliff."""
    return arch.name == "sm90" and num_rows > 64
