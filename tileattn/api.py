"""The public entry points: every argument check and every dispatch decision lives here.

Kernels assume what this module has checked; they never validate.
"""

from __future__ import annotations

import math
import os
import warnings

import torch

from . import fp8, reference
from .arch import FP8_DTYPES, arch_of, v_needs_k_major
from .kernels import attention_fwd, interpreter_active
from .kernels.cross_compile import launch_hooks_clear, on_device

SUPPORTED_HEAD_DIMS = (64, 96, 128, 192, 256)
INPUT_DTYPES = (torch.float16, torch.bfloat16) + FP8_DTYPES
OUTPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# ---------------------------------------------------------------------------------------------
# Shared checks
# ---------------------------------------------------------------------------------------------

def check_tensor(name: str, x, ndim: int) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    if x.numel() == 0:
        raise ValueError(f"{name} must not be empty, got shape {tuple(x.shape)}")


def check_no_grad(function: str, **tensors) -> None:
    """tileattn has no backward pass: an input that requires grad while autograd records would
    get an output that silently carries no gradient back (a model training through it would
    not learn its attention inputs). Refused, naming the argument."""
    if not torch.is_grad_enabled():
        return
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.requires_grad:
            raise ValueError(f"{name} requires grad, but tileattn.{function} has no backward pass "
                             f"(its output would carry no gradient to {name}): call it under "
                             f"torch.no_grad() or torch.inference_mode(), or pass {name}.detach()")


def check_same_device(**tensors) -> torch.device:
    named = [(name, t) for name, t in tensors.items() if t is not None]
    device = named[0][1].device
    for name, t in named[1:]:
        if t.device != device:
            raise ValueError(f"{name} is on {t.device} but {named[0][0]} is on {device}; "
                             "all tensors must be on one device")
    return device


def check_descale(name: str, descale, batch: int, heads: int) -> None:
    if descale is None:
        return
    if not isinstance(descale, torch.Tensor):
        raise TypeError(f"{name} must be a float32 torch.Tensor or None, got {type(descale).__name__}")
    if descale.dtype != torch.float32:
        raise TypeError(f"{name} must be float32, got {descale.dtype}")
    if tuple(descale.shape) not in ((), (batch, heads)):
        raise ValueError(f"{name} must have shape [] (per tensor) or [{batch}, {heads}] "
                         f"(per head), got {tuple(descale.shape)}")


# ---------------------------------------------------------------------------------------------
# attention()
# ---------------------------------------------------------------------------------------------

def _check_softmax_scale(softmax_scale) -> None:
    if softmax_scale is not None and not (isinstance(softmax_scale, (int, float))
                                          and math.isfinite(softmax_scale) and softmax_scale > 0):
        raise ValueError(f"softmax_scale must be a positive finite float or None, got {softmax_scale!r}")


def _check_attention_inputs(q, k, v, causal, softmax_scale, q_descale, k_descale, v_descale,
                            out_dtype) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, x, 4)
        if x.dtype not in INPUT_DTYPES:
            raise TypeError(f"{name} must be float16, bfloat16, float8_e4m3fn or float8_e5m2, "
                            f"got {x.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    check_no_grad("attention", q=q, k=k, v=v, q_descale=q_descale, k_descale=k_descale,
                  v_descale=v_descale)

    batch, _, num_q_heads, head_dim = q.shape
    _, seqlen_k, num_kv_heads, _ = k.shape
    if k.shape[0] != batch or v.shape[0] != batch:
        raise ValueError(f"batch sizes differ: q {batch}, k {k.shape[0]}, v {v.shape[0]}")
    if v.shape[1] != seqlen_k:
        raise ValueError(f"k and v must have the same seqlen, got k {seqlen_k}, v {v.shape[1]}")
    if v.shape[2] != num_kv_heads:
        raise ValueError(f"k and v must have the same number of heads, got k {num_kv_heads}, "
                         f"v {v.shape[2]}")
    if num_q_heads % num_kv_heads != 0:
        raise ValueError(f"q's heads ({num_q_heads}) must be a multiple of k's heads "
                         f"({num_kv_heads}) for GQA/MQA")
    if k.shape[3] != head_dim:
        raise ValueError(f"q and k must have the same head_dim, got q {head_dim}, k {k.shape[3]}")
    for name, dim in (("q/k head_dim", head_dim), ("v head_dim", v.shape[3])):
        if dim not in SUPPORTED_HEAD_DIMS:
            raise ValueError(f"{name} must be one of {SUPPORTED_HEAD_DIMS}, got {dim}")
    for name, x in (("q", q), ("k", k)):
        if x.stride(3) != 1:
            raise ValueError(f"{name} must have a contiguous last dim (stride 1), got strides "
                             f"{x.stride()}")
    if v.stride(3) != 1 and not fp8.is_k_major(v):
        raise ValueError(f"v must have a contiguous last dim or a contiguous seqlen dim "
                         f"(tileattn.prepare_v), got strides {v.stride()}")

    is_fp8 = q.dtype in FP8_DTYPES
    if not is_fp8 and any(d is not None for d in (q_descale, k_descale, v_descale)):
        raise ValueError("q_descale/k_descale/v_descale apply only to FP8 inputs, "
                         f"got them with {q.dtype}")
    check_descale("q_descale", q_descale, batch, num_q_heads)
    check_descale("k_descale", k_descale, batch, num_kv_heads)
    check_descale("v_descale", v_descale, batch, num_kv_heads)
    check_same_device(q=q, k=k, v=v, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    _check_softmax_scale(softmax_scale)
    if out_dtype is not None and out_dtype not in OUTPUT_DTYPES:
        raise TypeError(f"out_dtype must be float16, bfloat16 or float32, got {out_dtype}")


def attention(q, k, v, *, causal=False, softmax_scale=None, q_descale=None, k_descale=None,
              v_descale=None, out_dtype=None, return_lse=False):
    """Scaled dot-product attention forward, FlashAttention layout.

    q [B, Sq, Hq, D], k [B, Sk, Hkv, D], v [B, Sk, Hkv, Dv] with Hq % Hkv == 0 (GQA/MQA),
    D and Dv in {64, 96, 128, 192, 256}, dtype fp16, bf16, float8_e4m3fn or float8_e5m2.
    causal=True aligns the mask bottom-right: query i sees keys j <= i + Sk - Sq.
    FP8 descales are float32, shape [] or [B, heads]; a missing one means 1.0.
    Returns out [B, Sq, Hq, Dv] (bf16 for FP8 inputs, else the input dtype, unless out_dtype),
    and with return_lse=True also lse float32 [B, Hq, Sq] (natural log).

    CPU tensors run the same Triton kernel when TRITON_INTERPRET=1 was set before import, and
    the fp64 reference otherwise.
    """
    signature = _call_signature(q, k, v, causal, softmax_scale, q_descale, k_descale, v_descale,
                                out_dtype, return_lse)
    cached = _CALLS.get(signature) if signature is not None else None
    if cached is not None and launch_hooks_clear():
        _check_softmax_scale(softmax_scale)
        return cached(q, k, v, q_descale, k_descale, v_descale, softmax_scale)

    _check_attention_inputs(q, k, v, causal, softmax_scale, q_descale, k_descale, v_descale,
                            out_dtype)
    batch, seqlen_q, num_q_heads, head_dim = q.shape
    is_fp8 = q.dtype in FP8_DTYPES
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(head_dim)
    if out_dtype is None:
        out_dtype = torch.bfloat16 if is_fp8 else q.dtype

    if q.device.type == "cpu" and not interpreter_active():
        out, lse = reference.attention_reference(
            q, k, v, causal=causal, softmax_scale=softmax_scale,
            q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
        out = out.to(out_dtype)
        return (out, lse.to(torch.float32)) if return_lse else out

    arch = arch_of(q.device)
    given_v = v
    transposes_v = v_needs_k_major(arch, v.dtype) and not fp8.is_k_major(v)
    group_v_keys = groups_v_keys(arch) and transposes_v
    if transposes_v:
        v = fp8.k_major_copy(v, group_v_keys)
    if is_fp8:
        # The kernel reads every descale; a missing one is 1.0.
        q_descale, k_descale, v_descale = (_unit_descale(q.device) if d is None else d
                                           for d in (q_descale, k_descale, v_descale))
    out_shape = (batch, seqlen_q, num_q_heads, v.shape[3])
    lse_shape = (batch, num_q_heads, seqlen_q) if return_lse else None
    out = torch.empty(out_shape, dtype=out_dtype, device=q.device)
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device) if return_lse else None
    with on_device(q.device):
        kernel = kernel_for(arch, q, k, v, causal)
        if kernel == "sm90":
            from .kernels import attention_sm90
            launch = attention_sm90.attention_sm90_launch(
                q, k, v, out, lse, q_descale, k_descale, v_descale, softmax_scale, causal,
                v_keys_grouped=group_v_keys)
        else:
            launch = attention_fwd.attention_launch(q, k, v, out, lse, q_descale, k_descale,
                                                    v_descale, softmax_scale, causal, arch,
                                                    v_keys_grouped=group_v_keys)
        launch.run()
        if signature is not None:
            if kernel == "sm90":
                run_attention = attention_sm90.bind_attention(causal, group_v_keys)
            else:
                run_attention = attention_fwd.bind_attention(launch)
            _remember_call(signature, run_attention, q.device, given_v if transposes_v else None,
                           out_shape, out_dtype, lse_shape, is_fp8, softmax_scale, group_v_keys)
    return (out, lse) if return_lse else out


# ---- the call cache: later calls of the same signature skip the checks and the launch setup --

# Signature -> function(q, k, v, q_descale, k_descale, v_descale, softmax_scale). A signature
# holds everything the checks and the launch read besides tensor contents and the scale's
# value: shapes, strides, dtypes, devices, 16-byte alignment, flags and TILEATTN_KERNEL. On the
# lent H100's host the checks and launch setup cost more than an N=1024 kernel
# (benchmarks/NOTES.md, "Host overhead"), so repeat calls replay the bound launches instead.
_CALLS: dict[tuple, object] = {}
_MAX_CALLS = 1024
_UNIT_DESCALES: dict[torch.device, torch.Tensor] = {}


def _unit_descale(device: torch.device) -> torch.Tensor:
    """A float32 1.0 on device, made once (never handed to the caller, never written).
    Not during a CUDA graph capture: a tensor made there is only filled when the graph replays."""
    one = _UNIT_DESCALES.get(device)
    if one is None:
        one = torch.ones((), dtype=torch.float32, device=device)
        if device.type != "cuda" or not torch.cuda.is_current_stream_capturing():
            _UNIT_DESCALES[device] = one
    return one


def _call_signature(q, k, v, causal, softmax_scale, q_descale, k_descale, v_descale,
                    out_dtype, return_lse) -> tuple | None:
    """The cache key of a call, or None for a call the cache does not take (anything but plain
    tensors; CPU tensors, which never launch through it; tensors that require grad, which the
    checks refuse while autograd records)."""
    parts = [type(causal), causal, softmax_scale is None, out_dtype, return_lse,
             os.environ.get("TILEATTN_KERNEL"), os.environ.get("TILEATTN_FP8_V_KEYS")]
    for x in (q, k, v, q_descale, k_descale, v_descale):
        if x is None:
            parts.append(None)
        elif type(x) is torch.Tensor and x.is_cuda and not x.requires_grad:
            parts.append((x.shape, x.stride(), x.dtype, x.device, x.data_ptr() % 16))
        else:
            return None
    return tuple(parts)


def _remember_call(signature, run_attention, device, transposed_v, out_shape, out_dtype,
                   lse_shape, is_fp8, default_scale, group_v_keys=False) -> None:
    """Keep a call the checks passed, so later calls with its signature replay it.
    run_attention(q, k, v, out, lse, q_descale, k_descale, v_descale, softmax_scale) launches
    the chosen kernel (None: this launch cannot be replayed)."""
    prepare_v = (fp8.bind_k_major_copy(transposed_v, group_v_keys) if transposed_v is not None
                 else None)
    if run_attention is None or (transposed_v is not None and prepare_v is None):
        return

    def call(q, k, v, q_descale, k_descale, v_descale, softmax_scale):
        if is_fp8:
            q_descale, k_descale, v_descale = (_unit_descale(device) if d is None else d
                                               for d in (q_descale, k_descale, v_descale))
        out = torch.empty(out_shape, dtype=out_dtype, device=device)
        lse = (torch.empty(lse_shape, dtype=torch.float32, device=device)
               if lse_shape is not None else None)
        with on_device(device):
            if prepare_v is not None:
                v = prepare_v(v)
            run_attention(q, k, v, out, lse, q_descale, k_descale, v_descale,
                          default_scale if softmax_scale is None else softmax_scale)
        return (out, lse) if lse_shape is not None else out

    if len(_CALLS) >= _MAX_CALLS:
        _CALLS.clear()
    _CALLS[signature] = call


KERNELS = ("auto", "portable", "sm90")
FP8_V_KEY_ORDERS = ("natural", "grouped")


def groups_v_keys(arch) -> bool:
    """Whether attention() writes its K-major copy of an FP8 V in grouped key order
    (kernels/layout.py), so that both forward kernels feed P to P @ V without most of the
    register shuffle. wgmma chips only (on sm89's mma.sync the compiled conversion is the same
    either way). Experimental and off until measured on a GPU: TILEATTN_FP8_V_KEYS=grouped."""
    order = os.environ.get("TILEATTN_FP8_V_KEYS", "natural")
    if order not in FP8_V_KEY_ORDERS:
        raise ValueError(f"TILEATTN_FP8_V_KEYS must be one of {FP8_V_KEY_ORDERS}, got {order!r}")
    return arch.has_wgmma and order == "grouped"


def kernel_for(arch, q, k, v, causal: bool) -> str:
    """Which forward kernel runs checked inputs (v already in the layout the call will pass):
    "sm90" (the Gluon Hopper kernel) where the chip has wgmma, the kernel measured faster
    there and it supports the inputs' strides; "portable" otherwise.

    TILEATTN_KERNEL=portable forces the portable kernel (benchmarks compare the two with it);
    TILEATTN_KERNEL=sm90 takes the Hopper kernel wherever it supports the inputs.
    """
    choice = os.environ.get("TILEATTN_KERNEL", "auto")
    if choice not in KERNELS:
        raise ValueError(f"TILEATTN_KERNEL must be one of {KERNELS}, got {choice!r}")
    if choice == "portable" or not arch.has_wgmma:
        return "portable"
    from .kernels import attention_sm90_policy  # Gluon: imported only where it can run
    if choice == "auto" and not attention_sm90_policy.preferred(q, k, v, causal):
        return "portable"
    return "sm90" if attention_sm90_policy.supports(q, k, v, causal) else "portable"


# ---- mla_decode() / mla_plan() ----------------------------------------------------------------

from . import scheduler  # noqa: E402  (this section is appended; see the note above it)
from .arch import num_sms  # noqa: E402
from .kernels import mla_decode as mla_kernels  # noqa: E402
from .kernels import mla_decode_policy  # noqa: E402

MLA_NUM_HEADS = (16, 32, 64, 128)
MLA_MAX_Q_LEN = 4
MLA_Q_DTYPES = (torch.float16, torch.bfloat16)


def _check_mla_shape(num_heads, q_len, page_size) -> None:
    if num_heads not in MLA_NUM_HEADS:
        raise ValueError(f"num_heads must be one of {MLA_NUM_HEADS}, got {num_heads}")
    if not (isinstance(q_len, int) and 1 <= q_len <= MLA_MAX_Q_LEN):
        raise ValueError(f"q_len must be an int in 1..{MLA_MAX_Q_LEN}, got {q_len!r}")
    if not (isinstance(page_size, int) and page_size >= 1):
        raise ValueError(f"page_size must be an int >= 1, got {page_size!r}")


def _check_seq_lens(seq_lens, batch: int | None = None) -> None:
    check_tensor("seq_lens", seq_lens, 1)
    if seq_lens.dtype != torch.int32:
        raise TypeError(f"seq_lens must be int32, got {seq_lens.dtype}")
    if batch is not None and seq_lens.shape[0] != batch:
        raise ValueError(f"seq_lens must have one entry per sequence ({batch}), got {seq_lens.shape[0]}")


class PerformanceWarning(UserWarning):
    """A call that works but is known to be slower than an alternative the user controls."""


def mla_plan(seq_lens, *, num_heads, q_len=1, page_size, kv_dtype, device, schedule=None):
    """The split-KV plan for one batch layout: work items and workspace for mla_decode.

    Reads seq_lens once (a host synchronisation), so make it outside a CUDA graph and reuse it
    for every layer of the step. schedule picks the config knob ("split_dv" or "dup_qk", see
    tileattn/kernels/mla_decode.py); None takes the chip's default.
    """
    _check_seq_lens(seq_lens)
    _check_mla_shape(num_heads, q_len, page_size)
    if kv_dtype not in MLA_Q_DTYPES + (torch.float8_e4m3fn,):
        raise TypeError(f"kv_dtype must be float16, bfloat16 or float8_e4m3fn, got {kv_dtype}")
    if schedule is not None and schedule not in mla_kernels.SCHEDULES:
        raise ValueError(f"schedule must be one of {mla_kernels.SCHEDULES} or None, got {schedule!r}")
    device = torch.device(device)
    lengths = seq_lens.tolist()
    shortest = min(lengths)
    if shortest < q_len:
        raise ValueError(f"every seq_lens entry must be >= q_len ({q_len}) since the q_len new "
                         f"tokens are in the cache, got seq_lens[{lengths.index(shortest)}] = {shortest}")
    arch = arch_of(device)
    if kv_dtype == torch.float8_e4m3fn and mla_decode_policy.fp8_cache_slower(arch, num_heads * q_len):
        warnings.warn(f"an FP8 MLA cache with num_heads * q_len = {num_heads * q_len} >= 32 runs "
                      f"slower than a bf16 cache on {arch.name} today (on H100 about 1.05x the "
                      f"bf16 time at 32-64 rows, 1.5x at 128; see README, MLA decode)",
                      PerformanceWarning, stacklevel=2)
    config = mla_kernels.config_for(arch, schedule, num_heads * q_len)
    return plan_for_config(lengths, config, num_heads=num_heads, q_len=q_len,
                           page_size=page_size, kv_dtype=kv_dtype, device=device)


def plan_for_config(lengths: list[int], config, *, num_heads, q_len, page_size, kv_dtype, device):
    """The plan for checked arguments and a given MLA kernel config (mla_plan takes the
    chip's; the config sweep in tileattn/bench/mla.py passes its candidates)."""
    plan = scheduler.make_mla_plan(
        lengths, num_heads=num_heads, q_len=q_len, page_size=page_size, kv_dtype=kv_dtype,
        head_dim_v=mla_kernels.HEAD_DIM_NOPE,
        programs_per_item=mla_kernels.programs_per_work_item(config, num_heads * q_len),
        num_sms=num_sms(device) * config.programs_per_sm, block_n=config.block_n,
        min_chunk=config.min_chunk, device=device, config=config,
        max_items_per_seq=mla_kernels.MAX_SPLITS_PER_SEQ,
        capped_chunk_limit=mla_kernels.SPLIT_CAP_MAX_CHUNK)
    if plan.num_work > mla_kernels.MAX_WORK_ITEMS:
        raise ValueError(f"seq_lens holds {len(lengths)} sequences, which split into "
                         f"{plan.num_work} work items; at most {mla_kernels.MAX_WORK_ITEMS} "
                         "fit one launch: split the batch")
    return plan


def _check_mla_inputs(q, kv_cache, page_table, seq_lens, softmax_scale, kv_descale) -> None:
    check_tensor("q", q, 4)
    check_tensor("kv_cache", kv_cache, 3)
    check_tensor("page_table", page_table, 2)
    batch, q_len, num_heads, head_dim = q.shape
    _check_seq_lens(seq_lens, batch)
    if q.dtype not in MLA_Q_DTYPES:
        raise TypeError(f"q must be float16 or bfloat16, got {q.dtype}")
    if kv_cache.dtype not in (q.dtype, torch.float8_e4m3fn):
        raise TypeError(f"kv_cache must have q's dtype ({q.dtype}) or be float8_e4m3fn, "
                        f"got {kv_cache.dtype}")
    if page_table.dtype != torch.int32:
        raise TypeError(f"page_table must be int32, got {page_table.dtype}")
    check_no_grad("mla_decode", q=q, kv_cache=kv_cache, kv_descale=kv_descale)
    for name, dim in (("q", head_dim), ("kv_cache", kv_cache.shape[2])):
        if dim != mla_kernels.HEAD_DIM_QK:
            raise ValueError(f"{name}'s last dim must be {mla_kernels.HEAD_DIM_QK} "
                             f"(512 latent + 64 rope), got {dim}")
    _check_mla_shape(num_heads, q_len, kv_cache.shape[1])
    if page_table.shape[0] != batch:
        raise ValueError(f"page_table must have one row per sequence ({batch}), got {page_table.shape[0]}")
    for name, x in (("q", q), ("kv_cache", kv_cache), ("page_table", page_table)):
        if x.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last dim (stride 1), got strides {x.stride()}")
    if kv_descale is not None and kv_cache.dtype != torch.float8_e4m3fn:
        raise ValueError(f"kv_descale applies only to a float8_e4m3fn kv_cache, got it with {kv_cache.dtype}")
    check_descale("kv_descale", kv_descale, batch, 1)
    if kv_descale is not None and kv_descale.dim() != 0:
        raise ValueError(f"kv_descale must be a scalar (shape []), got {tuple(kv_descale.shape)}")
    check_same_device(q=q, kv_cache=kv_cache, page_table=page_table, seq_lens=seq_lens,
                      kv_descale=kv_descale)
    if not (isinstance(softmax_scale, (int, float)) and not isinstance(softmax_scale, bool)
            and math.isfinite(softmax_scale) and softmax_scale > 0):
        raise ValueError(f"softmax_scale must be a positive finite float, got {softmax_scale!r}")


def _check_mla_plan(plan, q, kv_cache) -> None:
    if not isinstance(plan, scheduler.MLAPlan):
        raise TypeError(f"plan must come from tileattn.mla_plan, got {type(plan).__name__}")
    batch, q_len, num_heads, _ = q.shape
    made_for = (plan.batch, plan.q_len, plan.num_heads, plan.page_size, plan.kv_dtype)
    given = (batch, q_len, num_heads, kv_cache.shape[1], kv_cache.dtype)
    if made_for != given:
        raise ValueError("plan was made for (batch, q_len, num_heads, page_size, kv_dtype) = "
                         f"{made_for}, but the inputs have {given}")
    if plan.work.device != q.device:
        raise ValueError(f"plan is on {plan.work.device} but q is on {q.device}")


def _check_pages(page_table, seq_lens, num_pages: int, page_size: int) -> None:
    """Every page a sequence uses must exist. Reads the tensors on the host (synchronises)."""
    max_pages = page_table.shape[1]
    longest = int(seq_lens.max())
    if longest > max_pages * page_size:
        raise ValueError(f"seq_lens up to {longest} exceed page_table's capacity "
                         f"{max_pages} pages x {page_size} = {max_pages * page_size}")
    pages_used = (seq_lens.long() + page_size - 1) // page_size
    used = torch.arange(max_pages, device=page_table.device)[None, :] < pages_used[:, None]
    bad = used & ((page_table < 0) | (page_table >= num_pages))
    if bool(bad.any()):
        b, column = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"page_table[{b}, {column}] = {int(page_table[b, column])} is not a page "
                         f"of kv_cache (0..{num_pages - 1})")


def mla_decode(q, kv_cache, page_table, seq_lens, *, softmax_scale, kv_descale=None, plan=None,
               return_lse=False, validate=False):
    """DeepSeek MLA decode over a paged latent KV cache.

    q [B, q_len, H, 576] fp16/bf16 with H in {16, 32, 64, 128} and q_len in 1..4 (speculative
    decoding: token j sees the first seq_len - q_len + 1 + j keys); kv_cache
    [num_pages, page_size, 576] in q's dtype or float8_e4m3fn (then kv_descale, a float32
    scalar, defaults to 1.0), whose first 512 columns are also V; page_table int32
    [B, max_pages]; seq_lens int32 [B] (keys per sequence, the q_len new tokens included).
    Returns out [B, q_len, H, 512] in q's dtype, and with return_lse=True also lse float32
    [B, q_len, H] (natural log).

    Without a plan, one is made here (host sync, allocation) and page ids are checked. With a
    plan (tileattn.mla_plan, from these seq_lens) nothing synchronises or allocates besides
    out/lse, so the call can be captured in a CUDA graph; page ids are then trusted unless
    validate=True (which synchronises).
    """
    _check_mla_inputs(q, kv_cache, page_table, seq_lens, softmax_scale, kv_descale)
    batch, q_len, num_heads, _ = q.shape
    page_size = kv_cache.shape[1]
    if plan is None or validate:
        _check_pages(page_table, seq_lens, kv_cache.shape[0], page_size)
    if plan is None:
        plan = mla_plan(seq_lens, num_heads=num_heads, q_len=q_len, page_size=page_size,
                        kv_dtype=kv_cache.dtype, device=q.device)
    _check_mla_plan(plan, q, kv_cache)
    if plan.max_seq_len > page_table.shape[1] * page_size:
        raise ValueError(f"seq_lens up to {plan.max_seq_len} (from the plan) exceed page_table's "
                         f"capacity {page_table.shape[1]} pages x {page_size}")
    if validate and seq_lens.tolist() != _plan_seq_lens(plan):
        raise ValueError("plan was made from different seq_lens than the ones given")

    if q.device.type == "cpu" and not interpreter_active():
        out, lse = reference.mla_decode_reference(q, kv_cache, page_table, seq_lens,
                                                  softmax_scale=softmax_scale, kv_descale=kv_descale)
        out, lse = out.to(q.dtype), lse.to(torch.float32)
        return (out, lse) if return_lse else out

    out = torch.empty((batch, q_len, num_heads, mla_kernels.HEAD_DIM_NOPE), dtype=q.dtype,
                      device=q.device)
    # The kernels always write the LSE: the combine needs it and it is 2 KB per 512 outputs.
    lse = torch.empty((batch, q_len, num_heads), dtype=torch.float32, device=q.device)
    arch = arch_of(q.device)
    kernel = mla_kernel_for(arch, q, kv_cache, plan)
    with on_device(q.device):
        for launch in mla_kernels.mla_decode_launches(q, kv_cache, page_table, seq_lens,
                                                      kv_descale, out, lse, plan, softmax_scale,
                                                      arch, kernel):
            launch.run()
    return (out, lse) if return_lse else out


MLA_KERNELS = ("auto", "triton", "gluon")


def mla_kernel_for(arch, q, kv_cache, plan) -> str:
    """Which MLA partial kernel runs checked inputs: "gluon" (the warp-specialized wgmma kernel
    in kernels/mla_sm90.py, kernels/mla_sm90_fp8.py for an e4m3 cache) where the chip is sm90,
    it supports the inputs and it measured
    faster (mla_decode_policy.gluon_preferred); "triton" (mla_decode_partial_kernel) otherwise.
    TILEATTN_MLA_KERNEL=triton|gluon forces one; "gluon" still falls back to Triton where the
    Gluon kernel does not support the inputs (H·q_len < 32, page_size not a
    multiple of 64, a plan whose chunks are not whole 64-key tiles)."""
    choice = os.environ.get("TILEATTN_MLA_KERNEL", "auto")
    if choice not in MLA_KERNELS:
        raise ValueError(f"TILEATTN_MLA_KERNEL must be one of {MLA_KERNELS}, got {choice!r}")
    if choice == "triton" or (choice == "auto" and not mla_decode_policy.gluon_preferred(plan)):
        return "triton"
    if arch.name != "sm90" or interpreter_active():
        return "triton"
    from .kernels import mla_sm90  # Gluon: imported only where it can run
    if plan.chunk_size % mla_sm90.BLOCK_N.value != 0 or not mla_sm90.supports(q, kv_cache):
        return "triton"
    return "gluon"


def _plan_seq_lens(plan) -> list[int]:
    """Per-sequence lengths a plan was made from (its work items' largest kv_end)."""
    lengths = [0] * plan.batch
    for b, _, end, _ in plan.work.tolist():
        lengths[b] = max(lengths[b], end)
    return lengths
