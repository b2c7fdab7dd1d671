"""Paged GQA decode: decode_plan() and paged_decode(), their argument checks and dispatch.

The kernels (kernels/attention/decode.py) assume what this module checked; the plan
(scheduler/decode.py) holds
the split-KV decisions. attention_varlen routes batches with few queries per sequence over a
paged cache here (see paged_decode's docstring for the contract).
"""

from __future__ import annotations

import math

import torch

from .. import checks
from ..scheduler import decode as split_kv
from ..checks import OUTPUT_DTYPES
from ..checks import descale as check_descale
from ..checks import no_grad as check_no_grad
from ..checks import same_device as check_same_device
from ..checks import tensor as check_tensor
from ..arch import FP8_DTYPES, arch_of, num_sms
from ..kernels.attention import decode as decode_kernels
from ..kernels.runtime import on_device

Q_DTYPES = (torch.float16, torch.bfloat16) + FP8_DTYPES
# Queries per sequence the decode kernel takes: q_len x group rows share one tile (in row
# blocks of at most 64), so past a few queries the prefill kernel is the better fit.
MAX_Q_LEN = 64


# ---- checks ---------------------------------------------------------------------------------

def _check_int(name: str, value, low: int, high: int | None = None) -> None:
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= low
            and (high is None or value <= high)):
        bound = f"in {low}..{high}" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be an int {bound}, got {value!r}")


def _check_window(window_size) -> tuple[int, int]:
    if not (isinstance(window_size, (tuple, list)) and len(window_size) == 2
            and all(isinstance(w, int) and not isinstance(w, bool) and w >= -1
                    for w in window_size)):
        raise ValueError(f"window_size must be a pair of ints >= -1 (-1: unbounded), "
                         f"got {window_size!r}")
    return int(window_size[0]), int(window_size[1])


def _lengths(seq_lens_k, cu_seqlens_k) -> tuple[list[int] | None, object, bool]:
    """(key counts as a list if given on the host, the tensor given, cumulative?) from exactly
    one of seq_lens_k / cu_seqlens_k (a list of ints or an int32 tensor)."""
    if (seq_lens_k is None) == (cu_seqlens_k is None):
        raise ValueError("give exactly one of seq_lens_k (keys per sequence) and cu_seqlens_k "
                         "(cumulative, batch + 1 entries)")
    cumulative = cu_seqlens_k is not None
    name, given = ("cu_seqlens_k", cu_seqlens_k) if cumulative else ("seq_lens_k", seq_lens_k)
    if isinstance(given, torch.Tensor):
        check_tensor(name, given, 1)
        if given.dtype != torch.int32:
            raise TypeError(f"{name} must be int32, got {given.dtype}")
        return None, given, cumulative
    if not (isinstance(given, (list, tuple)) and given
            and all(isinstance(n, int) and not isinstance(n, bool) for n in given)):
        raise TypeError(f"{name} must be an int32 tensor or a non-empty list of ints")
    values = list(given)
    return (_differences(values, name) if cumulative else values), None, cumulative


def _differences(cumulative: list[int], name: str) -> list[int]:
    if len(cumulative) < 2 or cumulative[0] != 0:
        raise ValueError(f"{name} must start at 0 and have batch + 1 entries, "
                         f"got {cumulative[:4]}...")
    return [b - a for a, b in zip(cumulative, cumulative[1:])]


def _host_lengths(tensor: torch.Tensor, cumulative: bool, name: str) -> list[int]:
    values = tensor.tolist()   # a host synchronisation
    return _differences(values, name) if cumulative else values


def _check_lengths(lengths: list[int], name: str) -> None:
    shortest = min(lengths)
    if shortest < 0:
        raise ValueError(f"{name} must give key counts >= 0, got {shortest} for sequence "
                         f"{lengths.index(shortest)}")


def decode_plan(seq_lens_k=None, *, cu_seqlens_k=None, num_q_heads: int, num_kv_heads: int,
                q_len: int = 1, page_size: int, head_dim: int, head_dim_v: int | None = None,
                kv_dtype: torch.dtype, device=None, window_size=(-1, -1), config=None):
    """The split-KV plan for one decode step: work items, workspace, and what it was made for.

    seq_lens_k: keys per sequence (int32 [batch] tensor or list of ints), or cu_seqlens_k
    (cumulative, batch + 1 entries). A tensor is read once (a host synchronisation; a list is
    not), so make the plan outside a CUDA graph, once per step, and pass it to every layer's
    paged_decode. q_len is the most queries a sequence has. window_size as in paged_decode;
    a plan made with a left window reads only the keys it needs and serves runs with the same
    or a smaller left window; one without serves every run.

    Splits a sequence's keys over several work items only where the batch leaves SMs idle.
    config (a kernels.decode.DecodeConfig) replaces the chip's table row: for tuning runs
    (benchmarks/decode.py --sweep) and tests.
    """
    lengths, tensor, cumulative = _lengths(seq_lens_k, cu_seqlens_k)
    name = "cu_seqlens_k" if cumulative else "seq_lens_k"
    if tensor is not None:
        device = tensor.device if device is None else device
        lengths = _host_lengths(tensor, cumulative, name)
    if device is None:
        raise ValueError("device is needed when the key counts are given as a list")
    device = checks.cuda_device("device", device)
    _check_lengths(lengths, name)
    for arg, value in (("num_q_heads", num_q_heads), ("num_kv_heads", num_kv_heads),
                       ("page_size", page_size)):
        _check_int(arg, value, 1)
    _check_int("q_len", q_len, 1, MAX_Q_LEN)
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads ({num_q_heads}) must be a multiple of num_kv_heads "
                         f"({num_kv_heads})")
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    checks.head_dim("head_dim", head_dim)
    checks.head_dim("head_dim_v", head_dim_v)
    if kv_dtype not in Q_DTYPES:
        raise TypeError(f"kv_dtype must be float16, bfloat16, float8_e4m3fn or float8_e5m2, "
                        f"got {kv_dtype}")
    window_left, _ = _check_window(window_size)
    arch = arch_of(device)
    config = config or decode_kernels.config_for(arch, head_dim, head_dim_v)
    block_n, page_aligned = decode_kernels.key_tile(config, page_size)
    group = num_q_heads // num_kv_heads
    return split_kv.make_decode_plan(
        lengths, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, q_len=q_len,
        page_size=page_size, head_dim=head_dim, head_dim_v=head_dim_v, kv_dtype=kv_dtype,
        window_left=window_left, config=config, block_n=block_n, page_aligned=page_aligned,
        rows_per_program=decode_kernels.rows_per_program(config, q_len * group), arch=arch,
        num_sms=num_sms(device), device=device)


def _is_jit_function(fn) -> bool:
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    return isinstance(fn, (JITFunction, InterpretedFunction))


def _check_decode_inputs(q, k_cache, v_cache, block_table, cu_seqlens_q, causal, softmax_scale,
                         score_mod, mask_mod, mod_args, q_descale, k_descale, v_descale, out,
                         out_dtype) -> None:
    check_tensor("q", q, 3)
    check_tensor("k_cache", k_cache, 4)
    check_tensor("v_cache", v_cache, 4)
    check_tensor("block_table", block_table, 2)
    if q.dtype not in Q_DTYPES:
        raise TypeError(f"q must be float16, bfloat16, float8_e4m3fn or float8_e5m2, got {q.dtype}")
    if k_cache.dtype != v_cache.dtype:
        raise TypeError(f"k_cache and v_cache must share one dtype, got {k_cache.dtype} and "
                        f"{v_cache.dtype}")
    if q.dtype in FP8_DTYPES and k_cache.dtype not in FP8_DTYPES:
        raise TypeError(f"an FP8 q needs an FP8 cache, got k_cache {k_cache.dtype}")
    if q.dtype not in FP8_DTYPES and k_cache.dtype not in (q.dtype,) + FP8_DTYPES:
        raise TypeError(f"k_cache must have q's dtype ({q.dtype}) or be float8_e4m3fn or "
                        f"float8_e5m2, got {k_cache.dtype}")
    if block_table.dtype != torch.int32:
        raise TypeError(f"block_table must be int32, got {block_table.dtype}")
    check_no_grad("attention_varlen", q=q, k_cache=k_cache, v_cache=v_cache, q_descale=q_descale,
                  k_descale=k_descale, v_descale=v_descale)
    total_q, num_q_heads, head_dim = q.shape
    num_pages, page_size, num_kv_heads, _ = k_cache.shape
    if tuple(v_cache.shape[:3]) != (num_pages, page_size, num_kv_heads):
        raise ValueError(f"v_cache must have k_cache's pages, page size and heads "
                         f"{(num_pages, page_size, num_kv_heads)}, got {tuple(v_cache.shape[:3])}")
    if num_q_heads % num_kv_heads:
        raise ValueError(f"q's heads ({num_q_heads}) must be a multiple of the cache's heads "
                         f"({num_kv_heads}) for GQA/MQA")
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"q and k_cache must have the same head_dim, got q {head_dim}, "
                         f"k_cache {k_cache.shape[3]}")
    checks.head_dim("q/k head_dim", head_dim)
    checks.head_dim("v head_dim", v_cache.shape[3])
    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache),
                    ("block_table", block_table)):
        if x.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last dim (stride 1), got strides "
                             f"{x.stride()}")
    batch = block_table.shape[0]
    if cu_seqlens_q is not None:
        check_tensor("cu_seqlens_q", cu_seqlens_q, 1)
        if cu_seqlens_q.dtype != torch.int32:
            raise TypeError(f"cu_seqlens_q must be int32, got {cu_seqlens_q.dtype}")
        if cu_seqlens_q.shape[0] != batch + 1:
            raise ValueError(f"cu_seqlens_q must have batch + 1 = {batch + 1} entries (one row "
                             f"of block_table per sequence), got {cu_seqlens_q.shape[0]}")
    if q.dtype not in FP8_DTYPES and q_descale is not None:
        raise ValueError(f"q_descale applies only to an FP8 q, got it with {q.dtype}")
    if k_cache.dtype not in FP8_DTYPES and (k_descale is not None or v_descale is not None):
        raise ValueError(f"k_descale/v_descale apply only to an FP8 cache, got them with "
                         f"{k_cache.dtype}")
    check_descale("q_descale", q_descale, batch, num_q_heads)
    check_descale("k_descale", k_descale, batch, num_kv_heads)
    check_descale("v_descale", v_descale, batch, num_kv_heads)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if softmax_scale is not None and not (isinstance(softmax_scale, (int, float))
                                          and not isinstance(softmax_scale, bool)
                                          and math.isfinite(softmax_scale) and softmax_scale > 0):
        raise ValueError(f"softmax_scale must be a positive finite float or None, "
                         f"got {softmax_scale!r}")
    for name, fn in (("score_mod", score_mod), ("mask_mod", mask_mod)):
        if fn is not None and not _is_jit_function(fn):
            raise TypeError(f"{name} must be a @triton.jit function or None, "
                            f"got {type(fn).__name__}")
    if not isinstance(mod_args, tuple):
        raise TypeError(f"mod_args must be a tuple, got {type(mod_args).__name__}")
    if out_dtype is not None and out_dtype not in OUTPUT_DTYPES:
        raise TypeError(f"out_dtype must be float16, bfloat16 or float32, got {out_dtype}")
    if out is not None:
        check_tensor("out", out, 3)
        want = (total_q, num_q_heads, v_cache.shape[3])
        if tuple(out.shape) != want:
            raise ValueError(f"out must have shape {want}, got {tuple(out.shape)}")
        if out.dtype not in OUTPUT_DTYPES:
            raise TypeError(f"out must be float16, bfloat16 or float32, got {out.dtype}")
        if out.stride(-1) != 1:
            raise ValueError(f"out must have a contiguous last dim, got strides {out.stride()}")
    check_same_device(q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table,
                      cu_seqlens_q=cu_seqlens_q, q_descale=q_descale, k_descale=k_descale,
                      v_descale=v_descale, out=out,
                      **{f"mod_args[{i}]": a for i, a in enumerate(mod_args)
                         if isinstance(a, torch.Tensor)})


def _check_plan(plan, q, k_cache, v_cache, block_table, cu_seqlens_q, kv_lens, cumulative,
                window_left: int) -> None:
    """A run's inputs against what its plan was made for: everything known on the host (the
    key counts themselves are compared on the device, by the kernel)."""
    if not isinstance(plan, split_kv.DecodePlan):
        raise TypeError(f"plan must come from tileattn.decode_plan, got {type(plan).__name__}")
    total_q, num_q_heads, head_dim = q.shape
    _, page_size, num_kv_heads, head_dim_v = v_cache.shape
    made_for = (plan.batch, plan.num_q_heads, plan.num_kv_heads, plan.page_size, plan.head_dim,
                plan.head_dim_v, plan.kv_dtype)
    given = (block_table.shape[0], num_q_heads, num_kv_heads, page_size, head_dim, head_dim_v,
             k_cache.dtype)
    if made_for != given:
        raise ValueError("plan was made for (batch, num_q_heads, num_kv_heads, page_size, "
                         f"head_dim, head_dim_v, kv_dtype) = {made_for}, but the inputs "
                         f"have {given}")
    if plan.device != q.device:
        raise ValueError(f"plan is on {plan.device} but q is on {q.device}")
    want_entries = plan.batch + 1 if cumulative else plan.batch
    if kv_lens.shape[0] != want_entries:
        raise ValueError(f"{'cu_seqlens_k' if cumulative else 'seq_lens_k'} must have "
                         f"{want_entries} entries for a batch of {plan.batch}, "
                         f"got {kv_lens.shape[0]}")
    if cu_seqlens_q is None and total_q != plan.batch * plan.q_len:
        raise ValueError(f"without cu_seqlens_q, q must hold batch x q_len = {plan.batch} x "
                         f"{plan.q_len} rows (the plan's), got {total_q}")
    if total_q > plan.batch * plan.q_len:
        raise ValueError(f"q has {total_q} rows, more than batch x q_len = {plan.batch} x "
                         f"{plan.q_len} (the plan's q_len is the most queries a sequence has)")
    if plan.window_left >= 0 and not 0 <= window_left <= plan.window_left:
        raise ValueError(f"plan was made for window_size[0] = {plan.window_left} and reads only "
                         f"the keys that window needs; a run with window_size[0] = {window_left} "
                         f"needs more: make the plan with window_size[0] = {window_left}")
    capacity = block_table.shape[1] * page_size
    if plan.max_kv_len > capacity:
        raise ValueError(f"the plan's key counts reach {plan.max_kv_len}, past block_table's "
                         f"capacity {block_table.shape[1]} pages x {page_size} = {capacity}")


def _check_query_offsets(cu_seqlens_q, total_q: int, max_q_len: int) -> None:
    """cu_seqlens_q read on the host (synchronises): from 0 to total_q, no sequence with fewer
    than 0 or more than max_q_len queries."""
    starts = cu_seqlens_q.tolist()
    if starts[0] != 0 or starts[-1] != total_q:
        raise ValueError(f"cu_seqlens_q must run from 0 to q's {total_q} rows, got {starts[0]} "
                         f"... {starts[-1]}")
    for b, (first, end) in enumerate(zip(starts, starts[1:])):
        if not 0 <= end - first <= max_q_len:
            raise ValueError(f"cu_seqlens_q gives sequence {b} {end - first} queries; at most "
                             f"{max_q_len} (the plan's q_len; more belong to the prefill kernel)")


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


# ---- the entry point ------------------------------------------------------------------------

def paged_decode(q, k_cache, v_cache, block_table, *, seq_lens_k=None, cu_seqlens_k=None,
                 cu_seqlens_q=None, plan=None, causal=False, softmax_scale=None,
                 window_size=(-1, -1), score_mod=None, mask_mod=None, mod_args=(),
                 q_descale=None, k_descale=None, v_descale=None, out=None, out_dtype=None,
                 return_lse=False, validate=False):
    """Attention of a few queries per sequence over a paged K/V cache (decode, speculative
    tokens), FlashAttention's varlen conventions.

    q [total_q, Hq, D]: sequence b's queries are rows cu_seqlens_q[b] ..< cu_seqlens_q[b+1]
    (int32 [B + 1]); without cu_seqlens_q every sequence has the plan's q_len queries, rows
    b * q_len onwards. k_cache [num_pages, page_size, Hkv, D], v_cache [..., Dv], Hq % Hkv == 0;
    block_table int32 [B, max_pages]: sequence b's keys are the first n_b rows of its pages in
    order, n_b from seq_lens_k (int32 [B]) or cu_seqlens_k (int32 [B + 1]; either may also
    be a list of ints, copied to the device each call: pass tensors to capture a CUDA graph).
    Any page_size.
    dtypes: q fp16/bf16 with a cache of q's dtype or FP8 (e4m3/e5m2, widened to q's dtype in
    registers), or an FP8 q with an FP8 cache (computed in fp16). Descales float32, [] or
    [B, heads]: q_descale only with an FP8 q, k/v_descale only with an FP8 cache.
    causal aligns bottom-right (query i of a sequence with m queries sees keys j <= i + n - m);
    window_size (left, right), -1 unbounded, keeps i + n - m - left <= j <= i + n - m + right
    (causal forces right = 0). score_mod / mask_mod: @triton.jit hooks of docs mods.md, with
    mod_args passed to them; `head` reaches them as an int32 [BLOCK_M, 1] tensor (a tile's rows
    are several query heads of one GQA group).
    Returns out [total_q, Hq, Dv] (into `out` if given; default dtype q's, bf16 for an FP8 q),
    and with return_lse=True lse float32 [Hq, total_q] (natural log). A query that sees no key
    outputs 0 with lse -inf.

    With a plan (tileattn.decode_plan for these key counts) nothing synchronises or allocates
    besides out/lse, so the call can be captured in a CUDA graph. Key counts that differ from
    the plan's, more queries than its q_len, or a page id outside the cache give NaN outputs
    and a flag (plan.check_errors() raises on it). validate=True checks all of that on the
    host (synchronising). Without a plan one is made here (a host synchronisation) and page
    ids are checked.
    """
    if out is not None:
        out_dtype = out.dtype
    _check_decode_inputs(q, k_cache, v_cache, block_table, cu_seqlens_q, causal, softmax_scale,
                         score_mod, mask_mod, mod_args, q_descale, k_descale, v_descale, out,
                         out_dtype)
    lengths, kv_lens, cumulative = _lengths(seq_lens_k, cu_seqlens_k)
    name = "cu_seqlens_k" if cumulative else "seq_lens_k"
    if kv_lens is None:   # given as a list: the kernel reads a tensor
        kv_lens = torch.tensor(seq_lens_k if not cumulative else cu_seqlens_k,
                               dtype=torch.int32, device=q.device)
    check_same_device(q=q, **{name: kv_lens})
    window_left, window_right = _check_window(window_size)
    if causal:
        window_right = 0
    total_q, num_q_heads, head_dim = q.shape
    num_pages, page_size, num_kv_heads, head_dim_v = v_cache.shape
    if validate and _capturing(q.device):
        raise ValueError("validate=True reads tensors on the host, which a CUDA graph capture "
                         "cannot do: validate before capturing")
    # Host-side tensors cost nothing to read: CPU runs always compare them with the plan.
    if plan is None or validate or kv_lens.device.type == "cpu":
        if lengths is None:
            lengths = _host_lengths(kv_lens, cumulative, name)
        _check_lengths(lengths, name)
        if len(lengths) != block_table.shape[0]:
            raise ValueError(f"{name} gives {len(lengths)} sequences but block_table has "
                             f"{block_table.shape[0]} rows")
        if max(lengths) > block_table.shape[1] * page_size:
            raise ValueError(f"{name} reaches {max(lengths)} keys, past block_table's capacity "
                             f"{block_table.shape[1]} pages x {page_size}")
        checks.pages(block_table, torch.tensor(lengths, dtype=torch.int32,
                                               device=block_table.device),
                     num_pages, page_size, table_name="block_table", cache_name="k_cache")
    if plan is None:
        batch = block_table.shape[0]
        if cu_seqlens_q is not None:
            q_starts = cu_seqlens_q.tolist()
            q_len = max(b - a for a, b in zip(q_starts, q_starts[1:]))
        elif total_q % batch == 0:
            q_len = total_q // batch
        else:
            raise ValueError(f"without cu_seqlens_q, q's {total_q} rows must be the same number "
                             f"of queries for each of the {batch} sequences")
        if q_len > MAX_Q_LEN:
            raise ValueError(f"a sequence has {q_len} queries; paged_decode takes at most "
                             f"{MAX_Q_LEN} (more belong to the prefill kernel)")
        plan = decode_plan(lengths, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads,
                           q_len=max(1, q_len),
                           page_size=page_size, head_dim=head_dim, head_dim_v=head_dim_v,
                           kv_dtype=k_cache.dtype, device=q.device,
                           window_size=(window_left, window_right))
    _check_plan(plan, q, k_cache, v_cache, block_table, cu_seqlens_q, kv_lens, cumulative,
                window_left)
    if lengths is not None and list(plan.kv_lens_host) != lengths:
        raise ValueError(f"plan was made from other key counts than the {name} given")
    if cu_seqlens_q is not None and (validate or cu_seqlens_q.device.type == "cpu"):
        _check_query_offsets(cu_seqlens_q, total_q, plan.q_len)

    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(head_dim)
    if out_dtype is None:
        out_dtype = torch.bfloat16 if q.dtype in FP8_DTYPES else q.dtype
    if out is None:
        out = torch.empty((total_q, num_q_heads, head_dim_v), dtype=out_dtype, device=q.device)
    lse = (torch.empty((num_q_heads, total_q), dtype=torch.float32, device=q.device)
           if return_lse else None)

    checks.runnable_device("q", q.device)
    with on_device(q.device):
        for launch in decode_kernels.decode_launches(
                q, k_cache, v_cache, block_table, kv_lens, cumulative, cu_seqlens_q, out,
                lse, plan, softmax_scale=softmax_scale, window_left=window_left,
                window_right=window_right, q_descale=q_descale, k_descale=k_descale,
                v_descale=v_descale, score_mod=score_mod, mask_mod=mask_mod,
                mod_args=mod_args, arch=arch_of(q.device)):
            launch.run()
    if validate:
        plan.check_errors()
    return (out, lse) if return_lse else out
