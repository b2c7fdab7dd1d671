"""FP8 quantization of attention inputs (tileattn.quantize_qkv_fp8): two Triton kernels and
their torch mirror.

A program owns one tile of TILE_ROWS rows of one (batch, head). Both kernels first form the
tile's float32 rows y: x itself, or x @ rotation (a ±1 Hadamard-with-random-signs operand,
fp8.rotation_operand) through tl.dot, so a rotation costs no extra pass over memory.
- fp8_tile_stats_kernel writes the tile's abs-max (+inf where the tile holds NaN or Inf: the
  caller's non-finite check) and, for smoothing, its per-column sum, max and min. From those
  the host forms the smoothing mean and every granule's scale without another pass: rounding
  is monotonic, so max|y - m| over a column is exactly max(colmax - m, m - colmin).
- fp8_cast_kernel subtracts the mean (SMOOTH), multiplies by its granule's scale, clamps and
  casts to FP8. With OWN_AMAX the tile is its own granule (per="block", 128-row blocks): it
  takes its abs-max itself and writes its descale, so x is read once. ROW_DOT writes each
  row's dot product with K's mean (the smoothing's lse offset, fp8.FP8Scales.lse_offset).

The torch mirror (tile_stats_torch, cast_torch) does the same float32 arithmetic in the same
order of operations for CPU tensors without the interpreter. Its sums (column sums, the
rotation's matmul, row dots) add in a different order, so they agree with the kernels' to
float32 rounding only; everything else is bit-identical (tests/test_quantize_qkv.py).

Pointer layouts (element strides):
    x             [batch, seqlen, heads, head_dim]    any strides
    rotation      [head_dim_pad, head_dim_pad]        contiguous, x's dtype (bf16 for fp32 x),
                                                      ±1 entries, 0 past head_dim
    tile_amax     [batch, heads, num_tiles] float32   contiguous
    column_sum/_max/_min [batch, heads, num_tiles, head_dim] float32, contiguous
    mean          [batch, heads, head_dim] float32    contiguous
    scale         [batch, heads, num_tiles] float32   any strides (0 where one scale is shared)
    out           [batch, seqlen, heads, head_dim]    FP8, any strides (row-major or K-major)
    descale       [batch, heads, num_tiles] float32   contiguous
    key_mean      [batch, kv_heads, head_dim] float32 contiguous (K's mean, rotated like q)
    row_dot       [batch, heads, seqlen] float32      contiguous
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..arch import Arch
from .runtime import KernelLaunch

# Rows per program, and the rows one block descale covers (fp8.SCALE_BLOCK): the attention
# kernels' tiles (at most 128 queries or keys, powers of two) then never straddle two blocks.
TILE_ROWS = 128
FLOAT32_MAX = 3.4028234663852886e38
_FLOAT32_MAX = tl.constexpr(FLOAT32_MAX)  # the same number, readable inside kernels


@dataclass(frozen=True)
class QuantizeConfig:
    num_warps: int
    rotate_chunk: int       # head-dim columns of 16-bit x per tl.dot step of the rotation
    rotate_chunk_fp32: int  # the same for fp32 x, which takes two bf16 dots a step


# (arch, padded head_dim) -> config. First guesses that fit, not tuned on a GPU yet. The
# rotation's tl.dot stages a [TILE_ROWS, chunk] slice of x and a [chunk, head_dim_pad] slice
# of the rotation in shared memory; D=256 holds a [128, 256] fp32 tile, up to 255 registers a
# thread at 8 warps. tests/test_quantize_cross_compile.py compiles every row for its chip and
# checks that 16-bit inputs do not spill, but for 40 bytes in sm90 D=256's smoothing
# statistics; fp32 inputs rotated at D=256 spill 40-72 bytes (no chunk, warp count or
# reduction order tried avoids either).
CONFIGS: dict[tuple[str, int], QuantizeConfig] = {
    ("sm89", 64): QuantizeConfig(4, 64, 64),
    ("sm89", 128): QuantizeConfig(8, 64, 32),
    ("sm89", 256): QuantizeConfig(8, 64, 16),
    ("sm90", 64): QuantizeConfig(4, 64, 64),
    ("sm90", 128): QuantizeConfig(8, 64, 64),
    ("sm90", 256): QuantizeConfig(8, 32, 32),
    ("cpu", 64): QuantizeConfig(4, 64, 64),
    ("cpu", 128): QuantizeConfig(4, 64, 64),
    ("cpu", 256): QuantizeConfig(4, 64, 64),
}
# Only chips with FP8 conversions run these kernels (fp8._runs_kernels): Triton cannot convert
# to e4m3 on sm80/sm86, whose calls take the torch mirror.
_SAME_CONFIGS_AS = {"sm100": "sm90", "sm120": "sm89"}


def padded_head_dim(head_dim: int) -> int:
    return max(64, 1 << (head_dim - 1).bit_length())


def config_for(arch: Arch, head_dim: int) -> QuantizeConfig:
    return CONFIGS[(_SAME_CONFIGS_AS.get(arch.name, arch.name), padded_head_dim(head_dim))]


@triton.jit
def _tile_rows(x_base, stride_xs, stride_xd, offs_s, seqlen, rotation_ptr,
               HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, TILE_ROWS: tl.constexpr,
               ROTATE: tl.constexpr, ROTATE_CHUNK: tl.constexpr):
    """The tile's rows as float32 [TILE_ROWS, HEAD_DIM_PAD] (times the rotation operand with
    ROTATE); rows past seqlen and columns past HEAD_DIM are 0."""
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    row_ok = offs_s[:, None] < seqlen
    rows = x_base + offs_s[:, None].to(tl.int64) * stride_xs
    if ROTATE:
        offs_c = tl.arange(0, ROTATE_CHUNK)
        y = tl.zeros([TILE_ROWS, HEAD_DIM_PAD], dtype=tl.float32)
        for chunk in tl.static_range((HEAD_DIM + ROTATE_CHUNK - 1) // ROTATE_CHUNK):
            cols = chunk * ROTATE_CHUNK + offs_c
            x = tl.load(rows + cols[None, :].to(tl.int64) * stride_xd,
                        mask=row_ok & (cols[None, :] < HEAD_DIM), other=0.0)
            rotation = tl.load(rotation_ptr + cols[:, None] * HEAD_DIM_PAD + offs_d[None, :])
            if x.dtype == tl.float32:
                # Two bf16 parts (x = high + low to 2^-17) on 16-bit tensor cores, each product
                # with the ±1 operand exact (tf32x3 spilled up to 1.4 KB on sm89).
                high = x.to(tl.bfloat16)
                y = tl.dot(high, rotation, y)
                y = tl.dot((x - high.to(tl.float32)).to(tl.bfloat16), rotation, y)
            else:
                y = tl.dot(x, rotation, y)
    else:
        y = tl.load(rows + offs_d[None, :].to(tl.int64) * stride_xd,
                    mask=row_ok & (offs_d[None, :] < HEAD_DIM), other=0.0).to(tl.float32)
    return y


@triton.jit
def _abs_max(y):
    """max |y| over the tile, +inf if any element is NaN or Inf (NaN never reaches tl.max,
    whose NaN handling differs between chips)."""
    return tl.max(tl.where(tl.abs(y) < float("inf"), tl.abs(y), float("inf")))


@triton.jit
def fp8_tile_stats_kernel(
    x_ptr, rotation_ptr, tile_amax_ptr, column_sum_ptr, column_max_ptr, column_min_ptr,
    stride_xb, stride_xs, stride_xh, stride_xd,
    seqlen, num_heads, num_tiles,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, TILE_ROWS: tl.constexpr,
    ROTATE: tl.constexpr, ROTATE_CHUNK: tl.constexpr, COLUMN_STATS: tl.constexpr,
):
    pid = tl.program_id(0)          # = (batch * num_heads + head) * num_tiles + tile
    tile = pid % num_tiles
    batch_head = pid // num_tiles
    batch = batch_head // num_heads
    head = batch_head % num_heads
    offs_s = tile * TILE_ROWS + tl.arange(0, TILE_ROWS)
    x_base = x_ptr + batch.to(tl.int64) * stride_xb + head.to(tl.int64) * stride_xh
    y = _tile_rows(x_base, stride_xs, stride_xd, offs_s, seqlen, rotation_ptr,
                   HEAD_DIM, HEAD_DIM_PAD, TILE_ROWS, ROTATE, ROTATE_CHUNK)
    if COLUMN_STATS:
        offs_d = tl.arange(0, HEAD_DIM_PAD)
        row_ok = offs_s[:, None] < seqlen
        finite = tl.abs(y) < float("inf")
        column_max = tl.max(tl.where(row_ok, tl.where(finite, y, float("inf")), float("-inf")), 0)
        column_min = tl.min(tl.where(row_ok, tl.where(finite, y, float("-inf")), float("inf")), 0)
        columns = pid.to(tl.int64) * HEAD_DIM + offs_d
        column_ok = offs_d < HEAD_DIM
        tl.store(column_sum_ptr + columns, tl.sum(y, 0), mask=column_ok)
        tl.store(column_max_ptr + columns, column_max, mask=column_ok)
        tl.store(column_min_ptr + columns, column_min, mask=column_ok)
        # = _abs_max(y) from the column extremes, one tile-sized temporary fewer.
        tl.store(tile_amax_ptr + pid, tl.max(tl.maximum(column_max, -column_min)))
    else:
        tl.store(tile_amax_ptr + pid, _abs_max(y))


@triton.jit
def fp8_cast_kernel(
    x_ptr, rotation_ptr, mean_ptr, scale_ptr, out_ptr, tile_amax_ptr, descale_ptr,
    key_mean_ptr, row_dot_ptr,
    stride_xb, stride_xs, stride_xh, stride_xd,
    stride_ob, stride_os, stride_oh, stride_od,
    stride_scale_b, stride_scale_h, stride_scale_t,
    seqlen, num_heads, num_tiles, gqa_group_size,
    fp8_max, descale_factor, row_dot_factor,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, TILE_ROWS: tl.constexpr,
    ROTATE: tl.constexpr, ROTATE_CHUNK: tl.constexpr,
    SMOOTH: tl.constexpr, OWN_AMAX: tl.constexpr, ROW_DOT: tl.constexpr,
):
    pid = tl.program_id(0)          # = (batch * num_heads + head) * num_tiles + tile
    tile = pid % num_tiles
    batch_head = pid // num_tiles
    batch = batch_head // num_heads
    head = batch_head % num_heads
    offs_s = tile * TILE_ROWS + tl.arange(0, TILE_ROWS)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    row_ok = offs_s < seqlen
    column_ok = offs_d < HEAD_DIM
    x_base = x_ptr + batch.to(tl.int64) * stride_xb + head.to(tl.int64) * stride_xh
    y = _tile_rows(x_base, stride_xs, stride_xd, offs_s, seqlen, rotation_ptr,
                   HEAD_DIM, HEAD_DIM_PAD, TILE_ROWS, ROTATE, ROTATE_CHUNK)
    if ROW_DOT:
        kv_head = batch * (num_heads // gqa_group_size) + head // gqa_group_size
        key_mean = tl.load(key_mean_ptr + kv_head.to(tl.int64) * HEAD_DIM + offs_d,
                           mask=column_ok, other=0.0)
        row_dot = tl.sum(y * key_mean[None, :], 1) * row_dot_factor
        tl.store(row_dot_ptr + batch_head.to(tl.int64) * seqlen + offs_s, row_dot, mask=row_ok)
    if SMOOTH:
        mean = tl.load(mean_ptr + batch_head.to(tl.int64) * HEAD_DIM + offs_d, mask=column_ok,
                       other=0.0)
        y = tl.where(row_ok[:, None], y - mean[None, :], 0.0)
    if OWN_AMAX:
        amax = _abs_max(y)
        tl.store(tile_amax_ptr + pid, amax)
        # scales_from_amax's arithmetic: a correctly rounded reciprocal, then a multiply.
        scale = tl.minimum(tl.math.div_rn(1.0, amax) * fp8_max, _FLOAT32_MAX)
        scale = tl.where(amax > 0, scale, 1.0)
        tl.store(descale_ptr + pid, tl.math.div_rn(1.0, scale) * descale_factor)
    else:
        scale = tl.load(scale_ptr + batch * stride_scale_b + head * stride_scale_h
                        + tile * stride_scale_t)
    x_fp8 = tl.clamp(y * scale, -fp8_max, fp8_max).to(out_ptr.dtype.element_ty)
    out = (out_ptr + batch.to(tl.int64) * stride_ob + head.to(tl.int64) * stride_oh
           + offs_s[:, None].to(tl.int64) * stride_os + offs_d[None, :].to(tl.int64) * stride_od)
    tl.store(out, x_fp8, mask=row_ok[:, None] & column_ok[None, :])


def scales_from_amax(amax: torch.Tensor, fp8_max: float, descale_factor: float = 1.0):
    """(scale, descale) float32 for abs-maxima amax: x * scale spans FP8's range and
    x ≈ x_fp8 * descale / descale_factor. An all-zero granule keeps scale 1; a tiny one gets
    at most float32's largest scale rather than inf. The scale is 1/amax rounded, times
    fp8_max, as torch computes `fp8_max / amax` (so per="tensor" equals quantize_fp8's)."""
    scale = torch.where(amax > 0, (amax.reciprocal() * fp8_max).clamp(max=FLOAT32_MAX), 1.0)
    return scale, scale.reciprocal() * descale_factor


# ---- launchers ---------------------------------------------------------------------------------

def _x_args(x: torch.Tensor, num_tiles: int) -> dict:
    return dict(stride_xb=x.stride(0), stride_xs=x.stride(1), stride_xh=x.stride(2),
                stride_xd=x.stride(3), seqlen=x.shape[1], num_heads=x.shape[2],
                num_tiles=num_tiles)


def _row_constexprs(x: torch.Tensor, rotation, config: QuantizeConfig) -> dict:
    head_dim = x.shape[3]
    chunk = config.rotate_chunk_fp32 if x.dtype == torch.float32 else config.rotate_chunk
    return dict(HEAD_DIM=head_dim, HEAD_DIM_PAD=padded_head_dim(head_dim), TILE_ROWS=TILE_ROWS,
                ROTATE=rotation is not None, ROTATE_CHUNK=chunk)


def num_tiles(seqlen: int) -> int:
    return -(-seqlen // TILE_ROWS)


def tile_stats_launch(x, rotation, tile_amax, column_stats, config: QuantizeConfig) -> KernelLaunch:
    """x [B, S, H, D] (non-empty) -> tile_amax [B, H, T]; column_stats: None, or the three
    [B, H, T, D] float32 outputs (sum, max, min)."""
    batch, seqlen, heads, _ = x.shape
    tiles = num_tiles(seqlen)
    column_sum, column_max, column_min = column_stats or (None, None, None)
    args = dict(x_ptr=x, rotation_ptr=rotation, tile_amax_ptr=tile_amax,
                column_sum_ptr=column_sum, column_max_ptr=column_max, column_min_ptr=column_min,
                **_x_args(x, tiles))
    constexprs = dict(**_row_constexprs(x, rotation, config), COLUMN_STATS=column_stats is not None)
    return KernelLaunch(fp8_tile_stats_kernel, (batch * heads * tiles,), args, constexprs,
                        config.num_warps, 1)


def cast_launch(x, rotation, mean, scale, out, tile_amax, descale, key_mean, row_dot,
                fp8_max: float, descale_factor: float, row_dot_factor: float,
                config: QuantizeConfig) -> KernelLaunch:
    """x [B, S, H, D] (non-empty) -> out. scale [B, H, T] (any strides) unless the tiles take
    their own (tile_amax and descale [B, H, T] given, scale None); mean [B, H, D] or None;
    key_mean [B, Hkv, D] and row_dot [B, H, S] together or None."""
    batch, seqlen, heads, _ = x.shape
    tiles = num_tiles(seqlen)
    own_amax = scale is None
    scale_strides = (0, 0, 0) if own_amax else scale.stride()
    args = dict(
        x_ptr=x, rotation_ptr=rotation, mean_ptr=mean, scale_ptr=scale, out_ptr=out,
        tile_amax_ptr=tile_amax, descale_ptr=descale, key_mean_ptr=key_mean, row_dot_ptr=row_dot,
        **_x_args(x, tiles),
        stride_ob=out.stride(0), stride_os=out.stride(1), stride_oh=out.stride(2),
        stride_od=out.stride(3),
        stride_scale_b=scale_strides[0], stride_scale_h=scale_strides[1],
        stride_scale_t=scale_strides[2],
        gqa_group_size=heads // key_mean.shape[1] if key_mean is not None else 1,
        fp8_max=fp8_max, descale_factor=descale_factor, row_dot_factor=row_dot_factor,
    )
    constexprs = dict(**_row_constexprs(x, rotation, config), SMOOTH=mean is not None,
                      OWN_AMAX=own_amax, ROW_DOT=row_dot is not None)
    return KernelLaunch(fp8_cast_kernel, (batch * heads * tiles,), args, constexprs,
                        config.num_warps, 1)


# ---- the torch mirror (CPU tensors without the interpreter) -------------------------------------

def _tiled_rows(x: torch.Tensor, rotation) -> torch.Tensor:
    """_tile_rows for every tile: float32 [B, H, T, TILE_ROWS, D], padding rows 0."""
    batch, seqlen, heads, head_dim = x.shape
    y = x.to(torch.float32)
    if rotation is not None:
        operand = rotation[:head_dim, :head_dim].to(torch.float32)
        if x.dtype == torch.float32:
            high = y.to(torch.bfloat16).to(torch.float32)
            y = high @ operand + (y - high).to(torch.bfloat16).to(torch.float32) @ operand
        else:
            y = y @ operand
    padded = y.new_zeros(batch, num_tiles(seqlen) * TILE_ROWS, heads, head_dim)
    padded[:, :seqlen] = y
    return padded.view(batch, -1, TILE_ROWS, heads, head_dim).permute(0, 3, 1, 2, 4)


def _row_mask(seqlen: int) -> torch.Tensor:
    """[T, TILE_ROWS, 1]: True for rows below seqlen."""
    rows = torch.arange(num_tiles(seqlen) * TILE_ROWS).view(-1, TILE_ROWS, 1)
    return rows < seqlen


def _abs_max_torch(y: torch.Tensor) -> torch.Tensor:
    magnitude = y.abs()
    return torch.where(magnitude < float("inf"), magnitude, float("inf")).amax(dim=(-2, -1))


def tile_stats_torch(x, rotation, column_stats: bool):
    """(tile_amax [B, H, T], (sum, max, min) [B, H, T, D] each or None) as the kernel
    writes them."""
    y = _tiled_rows(x, rotation)
    if not column_stats:
        return _abs_max_torch(y), None
    row_ok = _row_mask(x.shape[1]).to(y.device)
    finite = y.abs() < float("inf")
    high = torch.where(row_ok, torch.where(finite, y, float("inf")), float("-inf"))
    low = torch.where(row_ok, torch.where(finite, y, float("-inf")), float("inf"))
    return _abs_max_torch(y), (y.sum(dim=3), high.amax(dim=3), low.amin(dim=3))


def cast_torch(x, rotation, mean, scale, out_dtype, key_mean, fp8_max: float,
               descale_factor: float, row_dot_factor: float):
    """fp8_cast_kernel's results: (out [B, S, H, D] row-major, tile_amax and descale [B, H, T]
    where scale is None (else None, None), row_dot [B, H, S] where key_mean is given)."""
    batch, seqlen, heads, head_dim = x.shape
    y = _tiled_rows(x, rotation)
    row_ok = _row_mask(seqlen).to(y.device)
    row_dot = None
    if key_mean is not None:
        group = heads // key_mean.shape[1]
        per_head = key_mean.repeat_interleave(group, dim=1)[:, :, None, None, :]
        row_dot = ((y * per_head).sum(dim=-1) * row_dot_factor).flatten(2)[:, :, :seqlen]
    if mean is not None:
        y = torch.where(row_ok, y - mean[:, :, None, None, :], 0.0)
    tile_amax = descale = None
    if scale is None:
        tile_amax = _abs_max_torch(y)
        scale, descale = scales_from_amax(tile_amax, fp8_max, descale_factor)
    tile_scale = scale.expand(batch, heads, y.shape[2])[..., None, None]
    x_fp8 = (y * tile_scale).clamp(-fp8_max, fp8_max).to(out_dtype)
    out = x_fp8.permute(0, 2, 3, 1, 4).reshape(batch, -1, heads, head_dim)[:, :seqlen]
    return out, tile_amax, descale, row_dot
