"""What both Gluon (sm90) kernel families share: the torch -> Gluon dtype map, the TMA
addressability check, the field type of runtime scalars in kernel-state aggregates, and the
online-softmax step of one score block (attention/sm90*.py, mla/sm90*.py)."""

from __future__ import annotations

import torch
from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

GL_DTYPES = {
    torch.float32: gl.float32, torch.float16: gl.float16, torch.bfloat16: gl.bfloat16,
    torch.float8_e4m3fn: gl.float8e4nv, torch.float8_e5m2: gl.float8e5,
}


# Kernel state is bundled in aggregates (triton.language.core._aggregate; Triton 3.6 does not
# export it as gl.aggregate). Their constructors are gluon.constexpr_functions: Triton 3.6's
# cache-key walker rejects a plain Python __init__ ("Unsupported function referenced"). A
# constexpr function receives constexprs unwrapped to Python values, so a constructor wraps
# constexpr fields again (gl.constexpr(...)) and stores runtime values through scalar().
#
# The type of an aggregate field that holds a kernel argument or a value computed from one: a
# tensor, or a constexpr where Triton specialized the argument (an integer equal to 1, a None
# pointer) or folded the computation.
Scalar = gl.tensor | gl.constexpr


@gluon.constexpr_function
def scalar(value):
    """value (a tensor, or a constexpr's Python value) as a Scalar field."""
    return value if isinstance(value, gl.tensor) else gl.constexpr(value)


@builtin
def tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """Add the shared-memory tile src into tensor_desc's box at coord by one TMA reduction
    (cp.reduce.async.bulk.tensor .add; elements outside the tensor are dropped). Triton 3.6's
    Gluon has the builder op but no wrapper; this mirrors tma.async_copy_shared_to_global: the
    caller fences its stores to src first and waits with tma.store_wait before reusing src."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle,
                                              coord, src.handle)


def tma_ready(x: torch.Tensor, dims: tuple[int, ...]) -> bool:
    """TMA needs a 16-byte aligned base and 16-byte aligned strides for all but the last dim."""
    size = x.element_size()
    return x.data_ptr() % 16 == 0 and all(x.stride(d) * size % 16 == 0 for d in dims)


@gluon.jit
def online_softmax(s, m_i, l_i, qk_scale, MASKED: gl.constexpr, row_offset=None,
                   P_OFFSET: gl.constexpr = 0.0, SUM_ROWS: gl.constexpr = True):
    """One block of the online softmax in base 2, on scores s whose invisible entries the
    caller has set to -inf (only when MASKED): returns (p, alpha, m_new, l_new). With
    row_offset (a row vector), row r's scores are s * qk_scale + row_offset[r]. P_OFFSET
    scales p and the sum by 2^P_OFFSET alike (FP8 P: kernels/softmax.online_softmax_step).
    SUM_ROWS False: l_i is returned as given (the caller sums P's rows itself)."""
    row_max = gl.max(s, 1) * qk_scale
    if row_offset is not None:
        row_max = row_max + row_offset
    m_new = gl.maximum(m_i, row_max)
    if MASKED:
        # A row that has seen no visible key keeps m = -inf; subtract 0 so exp2 gives 0, not NaN.
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_safe = m_new
    shift = m_safe
    if row_offset is not None:
        shift = m_safe - row_offset
    if P_OFFSET != 0.0:
        shift = shift - P_OFFSET
    p = gl.exp2(s * qk_scale - gl.expand_dims(shift, 1))
    alpha = gl.exp2(m_i - m_safe)
    l_new = l_i
    if SUM_ROWS:
        l_new = l_i * alpha + gl.sum(p, 1)
    return p, alpha, m_new, l_new


@gluon.jit
def release(bar, PER_THREAD: gl.constexpr):
    """Arrive on a barrier that says a warpgroup is done (its reads or GEMM issues already
    waited for). PER_THREAD: each thread arrives (the barrier counts 128 a warpgroup), so no
    warpgroup barrier comes before it; else one thread arrives, after the barrier Triton puts
    before each such arrive."""
    if PER_THREAD:
        # cp.async's arrive, with no copy pending, is an arrive by each thread at once.
        async_copy.mbarrier_arrive(bar, increment_count=False)
    else:
        mbarrier.arrive(bar, count=1)
