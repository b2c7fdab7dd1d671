"""Argument checks: one path for every public entry point.

Every check raises a ValueError or TypeError whose message starts with the argument's name.
Kernels and ops assume what these functions have checked; they never validate user input.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch

from .arch import FP8_DTYPES
from .kernels.attention.configs import DESCALE_BLOCK_ROWS
from .kernels.attention.layout import is_k_major
from .kernels.runtime import interpreter_active

SUPPORTED_HEAD_DIMS = (64, 96, 128, 192, 256)
INPUT_DTYPES = (torch.float16, torch.bfloat16) + FP8_DTYPES
OUTPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# ---- scalars ---------------------------------------------------------------------------------

def real_scalar(name: str, value) -> float:
    """value as a Python float: ints, floats, numpy scalars and 0-d tensors are accepted,
    bools (Python or numpy) refused, since True would silently mean 1.0."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 0 or value.dtype == torch.bool or value.is_complex():
            raise TypeError(f"{name} must be a real number or a 0-d real tensor, got a tensor of "
                            f"shape {tuple(value.shape)} and dtype {value.dtype}")
        return float(value.item())
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a real number, got the bool {value!r}")
    if isinstance(value, numbers.Real):
        return float(value)
    raise TypeError(f"{name} must be a real number, got {type(value).__name__}")


def positive_float(name: str, value) -> float:
    """A finite, strictly positive real number as a float."""
    number = real_scalar(name, value)
    if not (math.isfinite(number) and number > 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return number


def softmax_scale(value, head_dim: int) -> float:
    """The scale of q·k: 1/sqrt(head_dim) by default."""
    return 1.0 / math.sqrt(head_dim) if value is None else positive_float("softmax_scale", value)


def flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def int_in_range(name: str, value, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    value = int(value)
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in {low}..{high}"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return value


# ---- tensors ---------------------------------------------------------------------------------

def tensor(name: str, x, ndim: int) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")


def same_device(**tensors) -> torch.device:
    named = [(name, t) for name, t in tensors.items() if t is not None]
    device = named[0][1].device
    for name, t in named[1:]:
        if t.device != device:
            raise ValueError(f"{name} is on {t.device} but {named[0][0]} is on {device}; "
                             "all tensors must be on one device")
    return device


def runnable_device(name: str, device: torch.device) -> None:
    """tileattn's kernels run on CUDA (and ROCm) GPUs, and on the CPU in Triton's interpreter
    (TRITON_INTERPRET=1 set before triton is imported). Meta tensors are handled by the ops'
    shape functions before they get here."""
    if device.type == "cuda":
        return
    if device.type == "cpu":
        if interpreter_active():
            return
        raise ValueError(f"{name} is a CPU tensor, but tileattn runs its kernels on the CPU only "
                         "in Triton's interpreter: set TRITON_INTERPRET=1 before importing "
                         "triton or tileattn (tileattn.reference has fp64 reference "
                         "implementations for plain CPU use)")
    raise ValueError(f"{name} is on {device}, which tileattn does not support (CUDA GPUs, or the "
                     "CPU under TRITON_INTERPRET=1)")


def cuda_device(name: str, device) -> torch.device:
    """A device argument (e.g. mla_plan's) that names a device this torch can use."""
    try:
        device = torch.device(device)
    except (TypeError, RuntimeError) as error:
        raise ValueError(f"{name} must name a torch device, got {device!r}") from error
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{name} is {device}, but this torch build has no usable CUDA device")
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"{name} is {device}, which tileattn does not support")
    return device


def no_grad(function: str, **tensors) -> None:
    """For entry points without a backward pass: an input that requires grad while autograd
    records would get an output that silently carries no gradient. Refused, naming it."""
    if not torch.is_grad_enabled():
        return
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.requires_grad:
            error = TypeError if t.dtype in FP8_DTYPES else ValueError
            raise error(f"{name} requires grad, but tileattn.{function} has no backward pass "
                        f"for it ({t.dtype}; its output would carry no gradient to {name}): "
                        f"call it under torch.no_grad() or torch.inference_mode(), or pass "
                        f"{name}.detach()")


def descale(name: str, value, batch: int, heads: int, seqlen: int | None = None) -> None:
    """A descale: float32 [] (per tensor) or [batch, heads]; with seqlen (q's and k's of
    attention()), also [batch, heads, ceil(seqlen / 128)], one per 128-row block."""
    if value is None:
        return
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a float32 torch.Tensor or None, got {type(value).__name__}")
    if value.dtype != torch.float32:
        raise TypeError(f"{name} must be float32, got {value.dtype}")
    shapes = [(), (batch, heads)]
    wanted = f"[] (per tensor) or [{batch}, {heads}] (per batch and head)"
    if seqlen is not None:
        shapes.append((batch, heads, -(-seqlen // DESCALE_BLOCK_ROWS)))
        wanted = (f"[] (per tensor), [{batch}, {heads}] (per batch and head) or "
                  f"{list(shapes[2])} (per {DESCALE_BLOCK_ROWS}-row block)")
    if tuple(value.shape) not in shapes:
        raise ValueError(f"{name} must have shape {wanted}, got {tuple(value.shape)}")


def head_dim(name: str, dim: int) -> None:
    if dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"{name} must be one of {SUPPORTED_HEAD_DIMS}, got {dim}")


# ---- attention() -----------------------------------------------------------------------------

def dense_shapes(q, k, v) -> None:
    """q [B, Sq, Hq, D], k [B, Sk, Hkv, D], v [B, Sk, Hkv, Dv] agree (4-D tensors, checked
    before): one batch, k and v one sequence and head count, Hq a multiple of Hkv."""
    batch, _, num_q_heads, dim = q.shape
    _, seqlen_k, num_kv_heads, _ = k.shape
    if k.shape[0] != batch or v.shape[0] != batch:
        raise ValueError(f"batch sizes differ: q {batch}, k {k.shape[0]}, v {v.shape[0]}")
    if v.shape[1] != seqlen_k:
        raise ValueError(f"v must have k's seqlen ({seqlen_k}), got {v.shape[1]}")
    if v.shape[2] != num_kv_heads:
        raise ValueError(f"v must have k's number of heads ({num_kv_heads}), got {v.shape[2]}")
    if num_kv_heads == 0 or num_q_heads % num_kv_heads != 0:
        raise ValueError(f"q's heads ({num_q_heads}) must be a non-zero multiple of k's heads "
                         f"({num_kv_heads}) for GQA/MQA")
    if k.shape[3] != dim:
        raise ValueError(f"k must have q's head_dim ({dim}), got {k.shape[3]}")


def attention_inputs(q, k, v, causal, q_descale, k_descale, v_descale, out_dtype, *,
                     device_check=True) -> None:
    """Everything attention() requires of its tensors and flags, except softmax_scale
    (softmax_scale() converts it). device_check=False skips the device rule (shape functions
    of the custom ops run on meta and fake tensors)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        tensor(name, x, 4)
        if x.dtype not in INPUT_DTYPES:
            raise TypeError(f"{name} must be float16, bfloat16, float8_e4m3fn or float8_e5m2, "
                            f"got {x.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}")

    batch, _, num_q_heads, dim = q.shape
    num_kv_heads = k.shape[2]
    dense_shapes(q, k, v)
    head_dim("q/k head_dim", dim)
    head_dim("v head_dim", v.shape[3])
    for name, x in (("q", q), ("k", k)):
        if x.stride(3) != 1 and x.numel() > 0:
            raise ValueError(f"{name} must have a contiguous last dim (stride 1), got strides "
                             f"{x.stride()}")
    if v.stride(3) != 1 and not is_k_major(v) and v.numel() > 0:
        raise ValueError(f"v must have a contiguous last dim or a contiguous seqlen dim "
                         f"(tileattn.prepare_v), got strides {v.stride()}")

    if q.dtype not in FP8_DTYPES and any(d is not None for d in (q_descale, k_descale, v_descale)):
        raise ValueError("q_descale/k_descale/v_descale apply only to FP8 inputs, "
                         f"got them with {q.dtype}")
    descale("q_descale", q_descale, batch, num_q_heads, q.shape[1])
    descale("k_descale", k_descale, batch, num_kv_heads, k.shape[1])
    descale("v_descale", v_descale, batch, num_kv_heads)
    device = same_device(q=q, k=k, v=v, q_descale=q_descale, k_descale=k_descale,
                         v_descale=v_descale)
    if device_check:
        runnable_device("q", device)
    flag("causal", causal)
    if out_dtype is not None and out_dtype not in OUTPUT_DTYPES:
        raise TypeError(f"out_dtype must be float16, bfloat16 or float32, got {out_dtype}")


# ---- masks: window_size, softcap, alibi_slopes (attention() and attention_varlen()) ----------

def window_size(value) -> tuple[int, int]:
    """(left, right) keys around each query's aligned position; -1 is unbounded."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise TypeError(f"window_size must be a pair (left, right) of ints, got {value!r}")
    left, right = (int_in_range(f"window_size[{i}]", x, -1) for i, x in enumerate(value))
    return left, right


def softcap(value) -> float:
    """The logit cap (0: none)."""
    cap = real_scalar("softcap", value)
    if not (math.isfinite(cap) and cap >= 0):
        raise ValueError(f"softcap must be a finite number >= 0 (0 disables it), got {value!r}")
    return cap


def alibi_slopes(slopes, batch: int, num_q_heads: int, device: torch.device) -> None:
    if slopes is None:
        return
    if not isinstance(slopes, torch.Tensor):
        raise TypeError(f"alibi_slopes must be a float32 torch.Tensor or None, got "
                        f"{type(slopes).__name__}")
    if slopes.dtype != torch.float32:
        raise TypeError(f"alibi_slopes must be float32, got {slopes.dtype}")
    if tuple(slopes.shape) not in ((num_q_heads,), (batch, num_q_heads)):
        raise ValueError(f"alibi_slopes must have shape [{num_q_heads}] or [{batch}, "
                         f"{num_q_heads}], got {tuple(slopes.shape)}")
    if slopes.device != device:
        raise ValueError(f"alibi_slopes is on {slopes.device} but q is on {device}")
    if slopes.requires_grad and torch.is_grad_enabled():
        raise ValueError("alibi_slopes requires grad, but tileattn has no gradient for ALiBi "
                         "slopes: pass alibi_slopes.detach()")


# ---- attention_varlen() ----------------------------------------------------------------------

def varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_table,
                  q_descale, k_descale, v_descale, out_dtype) -> tuple[int, int]:
    """The shapes, dtypes and devices of attention_varlen()'s arguments (values are
    varlen_values'). Returns (max_seqlen_q, max_seqlen_k) as ints."""
    paged = block_table is not None
    tensor("q", q, 3)
    for name, x in (("k", k), ("v", v)):
        tensor(name, x, 4 if paged else 3)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dtype not in INPUT_DTYPES:
            raise TypeError(f"{name} must be float16, bfloat16, float8_e4m3fn or float8_e5m2, "
                            f"got {x.dtype}")
    mixed = paged and q.dtype not in FP8_DTYPES and k.dtype in FP8_DTYPES
    if k.dtype != v.dtype or (q.dtype != k.dtype and not mixed):
        raise TypeError(f"q, k and v must share one dtype (or, with a block_table, a 16-bit q "
                        f"may read an FP8 cache), got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    for name, x in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        tensor(name, x, 1)
        if x.dtype != torch.int32:
            raise TypeError(f"{name} must be int32, got {x.dtype}")
        if x.shape[0] < 1:
            raise ValueError(f"{name} must have B + 1 >= 1 entries, got shape {tuple(x.shape)}")
    if cu_seqlens_k.shape[0] != cu_seqlens_q.shape[0]:
        raise ValueError(f"cu_seqlens_k must have cu_seqlens_q's length "
                         f"({cu_seqlens_q.shape[0]}), got {cu_seqlens_k.shape[0]}")
    batch = cu_seqlens_q.shape[0] - 1
    num_q_heads, dim = q.shape[1], q.shape[2]
    num_kv_heads = k.shape[-2]
    if v.shape[:-1] != k.shape[:-1]:
        raise ValueError(f"v must have k's leading dims {tuple(k.shape[:-1])}, got "
                         f"{tuple(v.shape[:-1])}")
    if num_kv_heads == 0 or num_q_heads % num_kv_heads != 0:
        raise ValueError(f"q's heads ({num_q_heads}) must be a non-zero multiple of k's heads "
                         f"({num_kv_heads}) for GQA/MQA")
    if k.shape[-1] != dim:
        raise ValueError(f"k must have q's head_dim ({dim}), got {k.shape[-1]}")
    head_dim("q/k head_dim", dim)
    head_dim("v head_dim", v.shape[-1])
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.stride(-1) != 1 and x.numel() > 0:
            raise ValueError(f"{name} must have a contiguous last dim (stride 1), got strides "
                             f"{x.stride()}")
    if paged:
        tensor("block_table", block_table, 2)
        if block_table.dtype != torch.int32:
            raise TypeError(f"block_table must be int32, got {block_table.dtype}")
        if block_table.shape[0] != batch:
            raise ValueError(f"block_table must have one row per sequence ({batch}), got "
                             f"{block_table.shape[0]}")
        if block_table.numel() > 0 and block_table.stride(1) != 1:
            raise ValueError(f"block_table must have a contiguous last dim, got strides "
                             f"{block_table.stride()}")
        if k.shape[0] == 0 or k.shape[1] == 0:
            raise ValueError(f"k must hold at least one page of at least one row, got shape "
                             f"{tuple(k.shape)}")
    max_q = int_in_range("max_seqlen_q", max_seqlen_q, 0)
    max_k = int_in_range("max_seqlen_k", max_seqlen_k, 0)
    for name, x, given in (("q_descale", q, q_descale), ("k_descale", k, k_descale),
                           ("v_descale", v, v_descale)):
        if given is not None and x.dtype not in FP8_DTYPES:
            raise ValueError(f"{name} applies only to an FP8 tensor, got it with {x.dtype}")
    descale("q_descale", q_descale, batch, num_q_heads)
    descale("k_descale", k_descale, batch, num_kv_heads)
    descale("v_descale", v_descale, batch, num_kv_heads)
    device = same_device(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                         block_table=block_table, q_descale=q_descale, k_descale=k_descale,
                         v_descale=v_descale)
    runnable_device("q", device)
    if out_dtype is not None and out_dtype not in OUTPUT_DTYPES:
        raise TypeError(f"out_dtype must be float16, bfloat16 or float32, got {out_dtype}")
    return max_q, max_k


def varlen_values(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                  block_table) -> None:
    """What attention_varlen() needs of the index tensors' values: prefix sums from 0 that end
    at the packed lengths, max_seqlen bounds, page tables that reach far enough and hold pages
    of the cache. Reads them on the host (one synchronisation)."""
    lengths = {}
    for name, cu, total in (("cu_seqlens_q", cu_seqlens_q, q.shape[0]),
                            ("cu_seqlens_k", cu_seqlens_k, None if block_table is not None
                             else k.shape[0])):
        values = cu.tolist()
        if values[0] != 0:
            raise ValueError(f"{name}[0] must be 0, got {values[0]}")
        steps = [b - a for a, b in zip(values, values[1:])]
        if any(step < 0 for step in steps):
            b = next(i for i, step in enumerate(steps) if step < 0)
            raise ValueError(f"{name} must be non-decreasing, but {name}[{b + 1}] = "
                             f"{values[b + 1]} < {name}[{b}] = {values[b]}")
        if total is not None and values[-1] != total:
            raise ValueError(f"{name}[-1] must equal the packed length {total}, got {values[-1]}")
        lengths[name] = steps
    for name, bound, steps in (("max_seqlen_q", max_seqlen_q, lengths["cu_seqlens_q"]),
                               ("max_seqlen_k", max_seqlen_k, lengths["cu_seqlens_k"])):
        if steps and max(steps) > bound:
            raise ValueError(f"{name} ({bound}) is smaller than a sequence "
                             f"({max(steps)} tokens)")
    if block_table is not None:
        pages(block_table, torch.tensor(lengths["cu_seqlens_k"], dtype=torch.int32,
                                        device=block_table.device), k.shape[0], k.shape[1],
              table_name="block_table", cache_name="k")


# ---- mla_plan() / mla_decode() ---------------------------------------------------------------

MLA_NUM_HEADS = (16, 32, 64, 128)
MLA_MAX_Q_LEN = 4
MLA_Q_DTYPES = (torch.float16, torch.bfloat16)
MLA_KV_DTYPES = MLA_Q_DTYPES + (torch.float8_e4m3fn,)
MLA_HEAD_DIM_QK = 576   # 512 latent ("nope") columns, which are also V, + 64 rotary columns


def mla_shape(num_heads, q_len, page_size,
              names=("num_heads", "q_len", "page_size")) -> None:
    """names: how the caller's arguments hold the three (mla_plan's keywords, or tensor dims)."""
    if isinstance(num_heads, bool) or num_heads not in MLA_NUM_HEADS:
        raise ValueError(f"{names[0]} must be one of {MLA_NUM_HEADS}, got {num_heads!r}")
    int_in_range(names[1], q_len, 1, MLA_MAX_Q_LEN)
    int_in_range(names[2], page_size, 1)


def seq_lens(lengths, batch: int | None = None) -> None:
    tensor("seq_lens", lengths, 1)
    if lengths.dtype != torch.int32:
        raise TypeError(f"seq_lens must be int32, got {lengths.dtype}")
    if batch is not None and lengths.shape[0] != batch:
        raise ValueError(f"seq_lens must have one entry per sequence ({batch}), got {lengths.shape[0]}")


def mla_plan_args(lengths, num_heads, q_len, page_size, kv_dtype, device) -> torch.device:
    seq_lens(lengths)
    if lengths.numel() == 0:
        raise ValueError("seq_lens must hold at least one sequence (an empty batch needs no plan)")
    mla_shape(num_heads, q_len, page_size)
    if kv_dtype not in MLA_KV_DTYPES:
        raise TypeError(f"kv_dtype must be float16, bfloat16 or float8_e4m3fn, got {kv_dtype}")
    return cuda_device("device", device)


def mla_lengths(lengths: list[int], q_len: int) -> None:
    """seq_lens values, read on the host by mla_plan: each sequence holds its q_len new tokens."""
    shortest = min(lengths)
    if shortest < q_len:
        raise ValueError(f"seq_lens must be >= q_len ({q_len}) since the q_len new tokens are in "
                         f"the cache, got seq_lens[{lengths.index(shortest)}] = {shortest}")


def mla_inputs(q, kv_cache, page_table, lengths, kv_descale) -> None:
    tensor("q", q, 4)
    tensor("kv_cache", kv_cache, 3)
    tensor("page_table", page_table, 2)
    batch, q_len, num_heads, dim = q.shape
    seq_lens(lengths, batch)
    if q.dtype not in MLA_Q_DTYPES:
        raise TypeError(f"q must be float16 or bfloat16, got {q.dtype}")
    if kv_cache.dtype not in (q.dtype, torch.float8_e4m3fn):
        raise TypeError(f"kv_cache must have q's dtype ({q.dtype}) or be float8_e4m3fn, "
                        f"got {kv_cache.dtype}")
    if page_table.dtype != torch.int32:
        raise TypeError(f"page_table must be int32, got {page_table.dtype}")
    no_grad("mla_decode", q=q, kv_cache=kv_cache, kv_descale=kv_descale)
    for name, width in (("q", dim), ("kv_cache", kv_cache.shape[2])):
        if width != MLA_HEAD_DIM_QK:
            raise ValueError(f"{name}'s last dim must be {MLA_HEAD_DIM_QK} (512 latent + 64 "
                             f"rope), got {width}")
    mla_shape(num_heads, q_len, kv_cache.shape[1],
              ("q's heads (dim 2)", "q's q_len (dim 1)", "kv_cache's page size (dim 1)"))
    if kv_cache.shape[0] == 0:
        raise ValueError("kv_cache must hold at least one page, got shape "
                         f"{tuple(kv_cache.shape)}")
    if page_table.shape[0] != batch:
        raise ValueError(f"page_table must have one row per sequence ({batch}), got {page_table.shape[0]}")
    for name, x in (("q", q), ("kv_cache", kv_cache), ("page_table", page_table)):
        if x.stride(-1) != 1 and x.numel() > 0:
            raise ValueError(f"{name} must have a contiguous last dim (stride 1), got strides {x.stride()}")
    if kv_descale is not None:
        if kv_cache.dtype != torch.float8_e4m3fn:
            raise ValueError(f"kv_descale applies only to a float8_e4m3fn kv_cache, got it with "
                             f"{kv_cache.dtype}")
        if not isinstance(kv_descale, torch.Tensor):
            raise TypeError(f"kv_descale must be a float32 torch.Tensor or None, got "
                            f"{type(kv_descale).__name__}")
        if kv_descale.dtype != torch.float32:
            raise TypeError(f"kv_descale must be float32, got {kv_descale.dtype}")
        if kv_descale.dim() != 0:
            raise ValueError(f"kv_descale must have shape [] (one scale for the whole cache), "
                             f"got {tuple(kv_descale.shape)}")
    device = same_device(q=q, kv_cache=kv_cache, page_table=page_table, seq_lens=lengths,
                         kv_descale=kv_descale)
    runnable_device("q", device)


def pages(page_table, lengths, num_pages: int, page_size: int, *, table_name="page_table",
          cache_name="kv_cache") -> None:
    """Every page a sequence uses exists and the table is long enough. Reads the tensors on the
    host (synchronises)."""
    max_pages = page_table.shape[1]
    if lengths.numel() == 0:
        return
    longest = int(lengths.max())
    if longest > max_pages * page_size:
        raise ValueError(f"sequences of up to {longest} keys exceed {table_name}'s capacity "
                         f"{max_pages} pages x {page_size} = {max_pages * page_size}")
    if int(lengths.min()) < 0:
        raise ValueError(f"seq_lens must be >= 0, got {int(lengths.min())}")
    pages_used = (lengths.long() + page_size - 1) // page_size
    used = torch.arange(max_pages, device=page_table.device)[None, :] < pages_used[:, None]
    bad = used & ((page_table < 0) | (page_table >= num_pages))
    if bool(bad.any()):
        b, column = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{table_name}[{b}, {column}] = {int(page_table[b, column])} is not a "
                         f"page of {cache_name} (0..{num_pages - 1})")
