"""FP8 scales, quantization and the V layout that FP8 tensor cores need."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

from .arch import FP8_DTYPES, arch_of, v_needs_k_major
from .kernels import quantize
from .kernels.attention.layout import (is_k_major, k_major_width, packed_v_width,
                                       transpose_packed_v_launch, transpose_v_launch)
from .kernels.runtime import interpreter_active, on_device


def quantize_fp8(x: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn,
                 per: str = "tensor") -> tuple[torch.Tensor, torch.Tensor]:
    """Scale x [B, S, H, D] into FP8's range; returns (x_fp8, descale) with x ≈ x_fp8 * descale.

    per="tensor": one float32 scalar descale. per="head": float32 [B, H], one per (batch, head),
    which keeps a quiet head from losing its precision to a loud one.
    """
    if dtype not in FP8_DTYPES:
        raise TypeError(f"dtype must be torch.float8_e4m3fn or torch.float8_e5m2, got {dtype}")
    if per not in ("tensor", "head"):
        raise ValueError(f"per must be 'tensor' or 'head', got {per!r}")
    if per == "head" and x.dim() != 4:
        raise ValueError(f"per='head' needs x of shape [batch, seqlen, heads, head_dim], got {tuple(x.shape)}")
    x32 = x.to(torch.float32)
    if not bool(torch.isfinite(x32).all()):
        raise ValueError("x holds non-finite values (inf or nan), which no FP8 scale can "
                         "represent: a scale from them would zero or poison every value")
    if x.numel() == 0:     # nothing to scale (torch's amax refuses empty reductions)
        amax = x32.new_zeros(() if per == "tensor" else (x.shape[0], x.shape[2]))
    elif per == "tensor":
        amax = x32.abs().amax()
    else:
        amax = x32.abs().amax(dim=(1, 3))
    # An all-zero or empty slice keeps scale 1 instead of dividing by zero.
    scale = torch.where(amax > 0, torch.finfo(dtype).max / amax, torch.ones_like(amax))
    broadcast_scale = scale if per == "tensor" else scale[:, None, :, None]
    x_fp8 = (x32 * broadcast_scale).clamp(torch.finfo(dtype).min, torch.finfo(dtype).max).to(dtype)
    return x_fp8, (1.0 / scale).to(torch.float32)


def prepare_v(v: torch.Tensor) -> torch.Tensor:
    """A K-major copy of V with the same logical shape [B, S, H, D] (v.stride(1) == 1).

    Pass the result to attention() in place of v to keep the transposition out of every call,
    e.g. when a KV cache is reused across many queries.
    """
    if v.dim() != 4:
        raise ValueError(f"v must have shape [batch, seqlen, heads, head_dim], got {tuple(v.shape)}")
    if is_k_major(v):
        return v
    if v.device.type != "cuda" or v.stride(3) != 1:
        return v.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
    return k_major_copy(v)


def k_major_copy(v: torch.Tensor, grouped: bool = False,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """V [B, S, H, D] (last dim contiguous) copied K-major by the transpose kernel: a view of a
    [B, H, D, width] buffer (kernels/attention/layout.py; keys in grouped order with
    `grouped`, which only the Hopper kernel reads). out: k_major_like(v)'s view to fill."""
    buffer = _k_major_buffer(v) if out is None else _k_major_storage(out)
    with on_device(v.device):
        transpose_v_launch(v, buffer, grouped).run()
    return _k_major_view(buffer, v.shape[1])


def k_major_like(v: torch.Tensor) -> torch.Tensor:
    """An unfilled view with the strides k_major_copy(v) will have (for kernel choices made
    before the copy; k_major_copy(v, out=...) fills it)."""
    return _k_major_view(_k_major_buffer(v), v.shape[1])


def packed_k_major_copy(v: torch.Tensor, cu_seqlens_k: torch.Tensor,
                        max_seqlen_k: int) -> torch.Tensor:
    """Packed V [total_k, H, D] (last dim contiguous) copied K-major with aligned sequence
    starts (kernels/attention/layout.py): a [width, H, D] view whose rows are keys, sequence
    b's first at row packed_v_start(b), of a contiguous [H, D, width] buffer."""
    total_k, heads, head_dim = v.shape
    width = packed_v_width(total_k, cu_seqlens_k.shape[0] - 1)
    out = torch.empty((heads, head_dim, width), dtype=v.dtype, device=v.device)
    with on_device(v.device):
        transpose_packed_v_launch(v, out, cu_seqlens_k, max_seqlen_k).run()
    return out.permute(2, 0, 1)


def _k_major_buffer(v: torch.Tensor) -> torch.Tensor:
    batch, seqlen, heads, head_dim = v.shape
    return torch.empty((batch, heads, head_dim, k_major_width(seqlen)), dtype=v.dtype,
                       device=v.device)


def _k_major_view(buffer: torch.Tensor, seqlen: int) -> torch.Tensor:
    return buffer[..., :seqlen].permute(0, 3, 1, 2)


def _k_major_storage(view: torch.Tensor) -> torch.Tensor:
    """The whole [B, H, D, width] buffer behind a _k_major_view."""
    batch, seqlen, heads, head_dim = view.shape
    width = k_major_width(seqlen)
    return torch.as_strided(view, (batch, heads, head_dim, width),
                            (heads * head_dim * width, head_dim * width, width, 1))


def bind_k_major_copy(v: torch.Tensor, grouped: bool = False):
    """k_major_copy for later V tensors of v's shape, strides, dtype and alignment, with its
    launch bound (the ops' call caches); None where it cannot be bound. Call it once first."""
    bound = transpose_v_launch(v, _k_major_buffer(v), grouped).bind()
    if bound is None:
        return None

    def run(v: torch.Tensor) -> torch.Tensor:
        out = _k_major_buffer(v)
        bound.run(v_ptr=v, out_ptr=out)
        return _k_major_view(out, v.shape[1])
    return run


# ---------------------------------------------------------------------------------------------
# quantize_qkv_fp8: block scales, K smoothing, Hadamard rotation
# ---------------------------------------------------------------------------------------------

# Rows covered by one entry of a block descale: q_descale [B, Hq, ceil(Sq / 128)] and
# k_descale [B, Hkv, ceil(Sk / 128)], entry i for rows [128 i, 128 i + 128). Fixed, so that a
# 3-D descale names its block size without ambiguity and every attention tile (a power of two
# of at most 128 rows) lies inside one block.
SCALE_BLOCK = quantize.TILE_ROWS
# Seed of the rotation's random signs (Python's random.Random, whose sequence for a given seed
# is stable across Python versions): every call rotates a head dim with the same matrix, so K
# quantized today and q quantized tomorrow still meet in the same basis.
ROTATION_SEED = 19
QUANTIZE_INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
GRANULARITIES = ("tensor", "head", "block")
MAX_QUANTIZE_HEAD_DIM = 256


def hadamard_block(head_dim: int) -> int:
    """Width of the rotation's Hadamard blocks: the largest power of two dividing head_dim
    (the whole head for 64, 128, 256; 32 for 96; 64 for 192)."""
    return head_dim & -head_dim


def _signed_hadamard(head_dim: int) -> torch.Tensor:
    """diag(random signs) @ blockdiag(Sylvester Hadamard), ±1 entries, float64 [D, D]."""
    rng = random.Random(ROTATION_SEED)
    signs = torch.tensor([1.0 if rng.random() < 0.5 else -1.0 for _ in range(head_dim)],
                         dtype=torch.float64)
    block = torch.ones(1, 1, dtype=torch.float64)
    while block.shape[0] < hadamard_block(head_dim):
        block = torch.cat([torch.cat([block, block], 1), torch.cat([block, -block], 1)], 0)
    return signs[:, None] * torch.block_diag(*[block] * (head_dim // block.shape[0]))


def rotation_matrix(head_dim: int) -> torch.Tensor:
    """The orthogonal float64 [D, D] matrix R that rotate=True applies: rows x become x @ R.
    q @ R @ (k @ R).T = q @ k.T, and an outlier channel of x spreads over a whole Hadamard
    block of x @ R."""
    return _signed_hadamard(head_dim) / math.sqrt(hadamard_block(head_dim))


_ROTATION_OPERANDS: dict[tuple, torch.Tensor] = {}


def rotation_operand(head_dim: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The kernels' rotation for inputs of dtype: the ±1 matrix sqrt(block) * R (exact in 16
    bits; the 1/sqrt(block) goes into the descale), zero-padded to [head_dim_pad,
    head_dim_pad], in dtype (bf16 for fp32 inputs, which the kernels split into bf16 parts)."""
    dtype = torch.bfloat16 if dtype == torch.float32 else dtype
    key = (head_dim, dtype, device)
    if key not in _ROTATION_OPERANDS:
        padded = quantize.padded_head_dim(head_dim)
        operand = torch.zeros(padded, padded, dtype=dtype)
        operand[:head_dim, :head_dim] = _signed_hadamard(head_dim).to(dtype)
        _ROTATION_OPERANDS[key] = operand.to(device)
    return _ROTATION_OPERANDS[key]


class FP8Scales(dict):
    """quantize_qkv_fp8's scales: exactly attention()'s keyword arguments q_descale, k_descale,
    v_descale (so `attention(q8, k8, v8, **scales)`), plus, as attributes:

    lse_offset: None, or with smooth_k float32 [B, Hq, Sq]: q_i · mean(k) of each query row's
        head (unquantized). Smoothing shifts query i's logits by softmax_scale * lse_offset[i],
        which leaves attention's output unchanged but not its lse; true_lse() restores it.
    head_dim: q's head dim (for the default softmax scale).
    """

    def __init__(self, descales: dict, lse_offset: torch.Tensor | None, head_dim: int):
        super().__init__(descales)
        self.lse_offset = lse_offset
        self.head_dim = head_dim

    def true_lse(self, lse: torch.Tensor, softmax_scale: float | None = None) -> torch.Tensor:
        """attention(..., return_lse=True)'s lse [B, Hq, Sq] of the quantized inputs as the
        unsmoothed keys would give it (lse itself without smoothing)."""
        if self.lse_offset is None:
            return lse
        if softmax_scale is None:
            softmax_scale = 1.0 / math.sqrt(self.head_dim)
        return lse + softmax_scale * self.lse_offset


def descale_rows(descale: torch.Tensor, batch: int, seqlen: int, heads: int) -> torch.Tensor:
    """A descale ([], [B, H] or block [B, H, ceil(S / SCALE_BLOCK)]) as a tensor broadcasting
    against x [B, S, H, D]."""
    if descale.dim() == 0:
        return descale
    if descale.dim() == 2:
        return descale[:, None, :, None]
    rows = torch.arange(seqlen, device=descale.device) // SCALE_BLOCK
    return descale[:, :, rows].permute(0, 2, 1)[..., None].expand(batch, seqlen, heads, 1)


def dequantize(x_fp8: torch.Tensor, descale: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """x_fp8 [B, S, H, D] times its descale, in dtype. For rotate=True's q and k this is the
    rotated input (x @ rotation_matrix(D)), minus K's mean after smooth_k."""
    batch, seqlen, heads, _ = x_fp8.shape
    return x_fp8.to(dtype) * descale_rows(descale, batch, seqlen, heads).to(dtype)


def quantize_qkv_fp8(q, k, v, dtype=torch.float8_e4m3fn, *, per="tensor", smooth_k=False,
                     rotate=False, block_size=None, v_k_major=None):
    """Quantize attention inputs to FP8 with their descales: returns (q8, k8, v8, scales) for
    `tileattn.attention(q8, k8, v8, causal=..., **scales)`.

    q [B, Sq, Hq, D], k [B, Sk, Hkv, D], v [B, Sk, Hkv, Dv] (Hq % Hkv == 0, D and Dv <= 256),
    each float16, bfloat16 or float32, any strides; dtype float8_e4m3fn or float8_e5m2.
    per: "tensor" (float32 descales of shape []), "head" ([B, H]) or "block": q and k get one
    descale per SCALE_BLOCK (128) rows, q_descale [B, Hq, ceil(Sq / 128)] and k_descale
    [B, Hkv, ceil(Sk / 128)]; v keeps one per head ([B, Hkv]: a per-token V scale cannot be
    folded out of P @ V). block_size (per="block" only): the rows that share one scale, an int
    or a (block_q, block_k) pair of multiples of 128 (default 128); coarser blocks repeat
    their descale over their 128-row entries.
    smooth_k: subtract K's mean over its tokens, per (batch, head), before quantizing. Each
    query's logits shift by a constant, so attention's output is unchanged; its lse shifts
    by softmax_scale * scales.lse_offset (scales.true_lse undoes it).
    rotate: q and k both become x @ rotation_matrix(D) (a Hadamard transform with fixed random
    signs; q @ k.T is unchanged), which spreads outlier channels. D must be a multiple of 32.
    v_k_major: whether v8 comes back K-major (prepare_v's layout); None picks what attention()
    wants on v's device (sm89/sm90).
    Defaults equal quantize_fp8(x, dtype, per="tensor") on each tensor.

    Raises ValueError naming the tensor if q, k or v holds NaN or Inf (this reads one flag back
    to the host). Runs Triton kernels on CUDA (sm89 and newer) and in the interpreter, the
    same arithmetic in torch ops elsewhere.
    """
    block_q, block_k = _check_quantize_inputs(q, k, v, dtype, per, smooth_k, rotate, block_size,
                                              v_k_major)
    if v_k_major is None:
        v_k_major = v_needs_k_major(arch_of(v.device), dtype)
    head_dim = q.shape[3]
    common = dict(dtype=dtype, per=per, kernels=_runs_kernels(q.device))
    qk_common = dict(common)
    if rotate:
        block = hadamard_block(head_dim)
        # The ±1 operand scales rows by sqrt(block); float32(1/sqrt(block)) takes it back out.
        qk_common["descale_factor"] = float(torch.tensor(block ** -0.5, dtype=torch.float32))
        qk_common["row_dot_factor"] = 1.0 / block
    k_out = _quantize(k, block_rows=block_k, smooth=smooth_k,
                      rotation=rotation_operand(head_dim, k.dtype, k.device) if rotate else None,
                      **qk_common)
    q_out = _quantize(q, block_rows=block_q, key_mean=k_out.mean,
                      rotation=rotation_operand(head_dim, q.dtype, q.device) if rotate else None,
                      **qk_common)
    v_out = _quantize(v, k_major=v_k_major, **dict(common, per="head" if per == "block" else per))
    _check_finite({"q": q_out.flags, "k": k_out.flags, "v": v_out.flags})
    scales = FP8Scales(dict(q_descale=q_out.descale, k_descale=k_out.descale,
                            v_descale=v_out.descale), q_out.row_dot, head_dim)
    return q_out.x_fp8, k_out.x_fp8, v_out.x_fp8, scales


@dataclass
class _Quantized:
    x_fp8: torch.Tensor
    descale: torch.Tensor
    flags: list[torch.Tensor]       # abs-maxima; a non-finite one marks NaN/Inf in the input
    mean: torch.Tensor | None       # smoothing: [B, H, D] float32, in the rotated basis
    row_dot: torch.Tensor | None    # key_mean given: [B, H, S] float32


def _quantize(x, *, dtype, per, kernels, block_rows=SCALE_BLOCK, smooth=False, rotation=None,
              descale_factor=1.0, key_mean=None, row_dot_factor=1.0, k_major=False) -> _Quantized:
    """One tensor through the statistics pass (where needed) and the cast pass."""
    batch, seqlen, heads, head_dim = x.shape
    tiles = quantize.num_tiles(seqlen)
    fp8_max = torch.finfo(dtype).max
    device = x.device
    if k_major:
        out = torch.empty(batch, heads, head_dim, seqlen, dtype=dtype, device=device)
        out = out.permute(0, 3, 1, 2)
    else:
        out = torch.empty(x.shape, dtype=dtype, device=device)
    # A tile that is its own granule finds its scale itself: x is read once.
    own_amax = per == "block" and block_rows == SCALE_BLOCK
    if x.numel() == 0:
        zeros = torch.zeros((batch, heads, tiles) if per == "block" else
                            (batch, heads) if per == "head" else (), device=device)
        mean = torch.zeros(batch, heads, head_dim, device=device) if smooth else None
        row_dot = torch.zeros(batch, heads, seqlen, device=device) if key_mean is not None else None
        return _Quantized(out, quantize.scales_from_amax(zeros, fp8_max, descale_factor)[1], [],
                          mean, row_dot)
    config = quantize.config_for(arch_of(device), head_dim) if kernels else None
    flags, mean, tile_amax = [], None, None
    if own_amax and smooth:
        # The tiles take their own abs-max (and flag NaN/Inf), so only the mean is needed
        # first: torch's reduction over tokens, which streams x faster than the statistics
        # kernel's column reductions; the mean of the rotated rows is the rotated mean.
        mean = torch.sum(x, dim=1, dtype=torch.float32).double() / seqlen
        if rotation is not None:     # the ±1 operand, exact in any dtype (cached on device)
            mean = mean @ rotation[:head_dim, :head_dim].double()
        mean = mean.to(torch.float32)
    elif smooth or not own_amax:
        tile_amax, column_stats = _tile_stats(x, rotation, smooth, config)
        flags.append(tile_amax)
        if smooth:
            column_sum, column_max, column_min = column_stats
            mean = (column_sum.double().sum(dim=2) / seqlen).to(torch.float32)
            if not own_amax:
                # Rounding is monotonic: max |y - m| over a column is max(colmax - m, m - colmin).
                centre = mean[:, :, None, :]
                tile_amax = torch.maximum(column_max - centre, centre - column_min).amax(dim=3)
    tile_scale = descale = None
    if not own_amax:
        scale, descale = quantize.scales_from_amax(
            _granule_amax(tile_amax, per, block_rows // SCALE_BLOCK), fp8_max, descale_factor)
        tile_scale = _per_tile(scale, per, block_rows // SCALE_BLOCK, (batch, heads, tiles))
        if per == "block":
            descale = _per_tile(descale, per, block_rows // SCALE_BLOCK,
                                (batch, heads, tiles)).contiguous()
    row_dot = None
    if kernels:
        tile_descale = own_tile_amax = None
        if own_amax:
            own_tile_amax = torch.empty(batch, heads, tiles, dtype=torch.float32, device=device)
            tile_descale = torch.empty_like(own_tile_amax)
        if key_mean is not None:
            row_dot = torch.empty(batch, heads, seqlen, dtype=torch.float32, device=device)
        with on_device(device):
            quantize.cast_launch(x, rotation, mean, tile_scale, out, own_tile_amax, tile_descale,
                                 key_mean, row_dot, fp8_max, descale_factor, row_dot_factor,
                                 config).run()
    else:
        x_fp8, own_tile_amax, tile_descale, row_dot = quantize.cast_torch(
            x, rotation, mean, tile_scale, dtype, key_mean, fp8_max, descale_factor,
            row_dot_factor)
        out.copy_(x_fp8)
    if own_amax:
        flags.append(own_tile_amax)
        descale = tile_descale
    return _Quantized(out, descale, flags, mean, row_dot)


def _tile_stats(x, rotation, column_stats: bool, config):
    """(tile_amax [B, H, T], (sum, max, min) [B, H, T, D] or None): the kernel's with a
    config, else the torch mirror's."""
    if config is None:
        return quantize.tile_stats_torch(x, rotation, column_stats)
    batch, seqlen, heads, head_dim = x.shape
    tiles = quantize.num_tiles(seqlen)
    tile_amax = torch.empty(batch, heads, tiles, dtype=torch.float32, device=x.device)
    columns = None
    if column_stats:
        columns = tuple(torch.empty(batch, heads, tiles, head_dim, dtype=torch.float32,
                                    device=x.device) for _ in range(3))
    with on_device(x.device):
        quantize.tile_stats_launch(x, rotation, tile_amax, columns, config).run()
    return tile_amax, columns


def _granule_amax(tile_amax: torch.Tensor, per: str, tiles_per_block: int) -> torch.Tensor:
    """Tile abs-maxima [B, H, T] -> one per tensor [], head [B, H] or block [B, H, blocks]."""
    if per == "tensor":
        return tile_amax.amax()
    if per == "head":
        return tile_amax.amax(dim=2)
    batch, heads, tiles = tile_amax.shape
    blocks = -(-tiles // tiles_per_block)
    padded = tile_amax.new_zeros(batch, heads, blocks * tiles_per_block)
    padded[:, :, :tiles] = tile_amax
    return padded.view(batch, heads, blocks, tiles_per_block).amax(dim=3)


def _per_tile(values: torch.Tensor, per: str, tiles_per_block: int,
              shape: tuple[int, int, int]) -> torch.Tensor:
    """A granule's values ([], [B, H] or [B, H, blocks]) as [B, H, T], one per tile (views
    with stride 0 where granules span tiles)."""
    if per == "tensor":
        return values.expand(shape)
    if per == "head":
        return values[:, :, None].expand(shape)
    return values.repeat_interleave(tiles_per_block, dim=2)[:, :, :shape[2]]


def _check_finite(flags_by_name: dict[str, list[torch.Tensor]]) -> None:
    """One host read for all three tensors' flags."""
    names = [name for name, flags in flags_by_name.items() if flags]
    if not names:
        return
    bad = torch.stack([torch.stack([(~torch.isfinite(f)).any() for f in flags_by_name[name]]).any()
                       for name in names]).tolist()
    for name, is_bad in zip(names, bad):
        if is_bad:
            raise ValueError(f"{name} holds NaN or Inf values; FP8 scales need finite inputs")


def _runs_kernels(device: torch.device) -> bool:
    """Triton kernels on NVIDIA chips with FP8 conversions (sm89+) and in the interpreter;
    torch ops elsewhere (same arithmetic, tileattn/kernels/quantize.py)."""
    if device.type == "cuda":
        return torch.version.hip is None and arch_of(device).has_fp8_mma
    return interpreter_active()


def _check_quantize_inputs(q, k, v, dtype, per, smooth_k, rotate, block_size, v_k_major):
    """Every argument rule of quantize_qkv_fp8; returns (block_q, block_k) in rows."""
    from . import checks
    for name, x in (("q", q), ("k", k), ("v", v)):
        checks.tensor(name, x, 4)
        if x.dtype not in QUANTIZE_INPUT_DTYPES:
            raise TypeError(f"{name} must be float16, bfloat16 or float32, got {x.dtype}")
        if x.device.type not in ("cuda", "cpu"):
            raise ValueError(f"{name} must be on a CUDA device or the CPU, got {x.device}")
    checks.same_device(q=q, k=k, v=v)
    checks.no_grad("quantize_qkv_fp8", q=q, k=k, v=v)
    checks.dense_shapes(q, k, v)
    head_dim = q.shape[3]
    for name, dim in (("q/k head_dim", head_dim), ("v head_dim", v.shape[3])):
        if not 1 <= dim <= MAX_QUANTIZE_HEAD_DIM:
            raise ValueError(f"{name} must be in 1..{MAX_QUANTIZE_HEAD_DIM}, got {dim}")
    if dtype not in FP8_DTYPES:
        raise TypeError(f"dtype must be torch.float8_e4m3fn or torch.float8_e5m2, got {dtype}")
    if not isinstance(per, str) or per not in GRANULARITIES:
        raise ValueError(f"per must be one of {GRANULARITIES}, got {per!r}")
    for name, flag in (("smooth_k", smooth_k), ("rotate", rotate)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    if v_k_major is not None and not isinstance(v_k_major, bool):
        raise TypeError(f"v_k_major must be a bool or None, got {type(v_k_major).__name__}")
    if rotate and head_dim % 32 != 0:
        raise ValueError(f"rotate=True needs a q/k head_dim that is a multiple of 32 (Hadamard "
                         f"blocks of at least 32), got {head_dim}")
    return _check_block_size(block_size, per)


def _check_block_size(block_size, per: str) -> tuple[int, int]:
    if block_size is None:
        return SCALE_BLOCK, SCALE_BLOCK
    if per != "block":
        raise ValueError(f"block_size applies only to per='block', got it with per={per!r}")
    pair = block_size if isinstance(block_size, tuple) else (block_size, block_size)
    if len(pair) != 2 or not all(isinstance(b, int) and not isinstance(b, bool) for b in pair):
        raise TypeError(f"block_size must be an int or a (block_q, block_k) pair of ints, "
                        f"got {block_size!r}")
    if not all(b > 0 and b % SCALE_BLOCK == 0 for b in pair):
        raise ValueError(f"block_size must be a positive multiple of {SCALE_BLOCK} (the rows of "
                         f"one descale entry), got {block_size!r}")
    return pair
