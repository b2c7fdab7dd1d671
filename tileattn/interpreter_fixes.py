"""Corrections to Triton 3.6.0's CPU interpreter, so that kernels run on the CPU round and
multiply as they do on the GPU. tileattn applies them around each of its own launches in the
interpreter (`corrected()`, used by kernels/runtime.py) and takes them away afterwards, so a
user's own interpreted kernels see Triton unchanged; importing tileattn patches nothing.
Checked by tests/test_interpreter_fixes.py. Under another Triton version the corrections are
not applied (that interpreter may differ) and the first interpreted launch warns.

What the interpreter gets wrong (triton/runtime/interpreter.py, 3.6.0):
- Float downcasts to FP8 with round-to-nearest-even add the rounding bit to the mantissa field
  without carrying into the exponent: a value that rounds up to the next power of two comes
  out halved when its exponent is odd (0.49 -> 0.25 in e4m3). Ties round up, not to even, and
  there is no saturation (the GPU's cvt.rn.satfinite clamps to the largest finite value).
- FP8 upcasts read e4m3's NaN (0x7f / 0xff) as 480.
- fp32 -> bf16 truncates (the GPU's fptrunc rounds to nearest even).
- tl.dot on bf16 operands multiplies their raw uint16 storage as integers, so any bf16 dot is
  wrong (the reason bf16 was untested on the CPU).
- libdevice functions (triton.language.extra.libdevice) are stubs that return None: a
  kernel calling libdevice.tanh fails. tanh and pow, which translated flex hooks use, are
  given numpy's (within an ulp or two of libdevice's on the GPU).
Each is replaced by torch's conversion (round to nearest even, NaN kept), by an fp32 matmul
of the bf16 values, or by numpy's function.
"""

from __future__ import annotations

import contextlib
import threading
import warnings

import numpy as np
import torch
import triton
import triton.language as tl
from triton.runtime import interpreter

TRITON_VERSION = "3.6.0"

_TORCH_DTYPES = {
    tl.float64: torch.float64, tl.float32: torch.float32, tl.float16: torch.float16,
    tl.bfloat16: torch.bfloat16, tl.float8e4nv: torch.float8_e4m3fn,
    tl.float8e5: torch.float8_e5m2,
}
# Storage of each dtype's bits as the interpreter holds them (bf16 and FP8 as unsigned ints).
_BITS = {8: (np.uint8, torch.uint8), 16: (np.uint16, torch.uint16), 32: (np.uint32, torch.uint32),
         64: (np.uint64, torch.uint64)}

_original_convert_float = interpreter._convert_float
_original_create_dot = interpreter.InterpreterBuilder.create_dot


def _to_torch(data: np.ndarray, dtype) -> torch.Tensor:
    """The interpreter's array of `dtype` values (any storage of the right width) as a torch
    tensor of that dtype."""
    np_bits, torch_bits = _BITS[dtype.primitive_bitwidth]
    bits = np.ascontiguousarray(data).view(np_bits)
    return torch.from_numpy(bits.copy()).view(torch_bits).view(_TORCH_DTYPES[dtype])


def _convert_float(input, input_dtype, output_dtype, rounding_mode):
    if (input_dtype not in _TORCH_DTYPES or output_dtype not in _TORCH_DTYPES
            or rounding_mode == interpreter._ir.ROUNDING_MODE.RTZ):
        return _original_convert_float(input, input_dtype, output_dtype, rounding_mode)
    values = _to_torch(input, input_dtype)
    target = _TORCH_DTYPES[output_dtype]
    if output_dtype.primitive_bitwidth == 8:
        # cvt.rn.satfinite: out-of-range values clamp to the largest finite value; NaN stays.
        finite = torch.finfo(target).max
        values = torch.where(values.isnan(), values, values.double().clamp(-finite, finite))
    out = values.to(target).view(_BITS[output_dtype.primitive_bitwidth][1])
    return out.numpy().reshape(np.shape(input))


def _create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    if tl.bfloat16 not in (a.dtype.scalar, b.dtype.scalar):
        return _original_create_dot(self, a, b, d, input_precision, max_num_imprecise_acc)
    a_data, b_data = (_to_torch(x.data, x.dtype.scalar).float().numpy() for x in (a, b))
    return interpreter.TensorHandle(np.matmul(a_data, b_data, dtype=d.data.dtype) + d.data,
                                    d.dtype.scalar)


def _numpy_libdevice(function):
    """A libdevice function for interpreted kernels: numpy's `function` on the tensors'
    values, in the first tensor's dtype."""
    def run(*args):
        first = next(a for a in args if isinstance(a, tl.tensor))
        values = [a.handle.data if isinstance(a, tl.tensor) else a for a in args]
        result = np.asarray(function(*values)).astype(first.handle.data.dtype)
        scalar = first.dtype.scalar
        kind = tl.block_type(scalar, list(result.shape)) if result.shape else scalar
        return tl.tensor(interpreter.TensorHandle(result, scalar), kind)
    run.__name__ = function.__name__
    return run


_LIBDEVICE = {"tanh": np.tanh, "pow": np.power}


def apply() -> bool:
    """Install the corrections for good (idempotent); False, and nothing changed, under another
    Triton version, whose interpreter may differ: the fixes must be re-checked against it."""
    if triton.__version__ != TRITON_VERSION:
        return False
    interpreter._convert_float = _convert_float
    interpreter.InterpreterBuilder.create_dot = _create_dot
    from triton.language.extra import libdevice
    for name, function in _LIBDEVICE.items():
        setattr(libdevice, name, _numpy_libdevice(function))
    return True


def _remove() -> None:
    interpreter._convert_float = _original_convert_float
    interpreter.InterpreterBuilder.create_dot = _original_create_dot


_lock = threading.Lock()
_depth = 0
_warned = False


@contextlib.contextmanager
def corrected():
    """The corrections installed for the duration of a `with` block (nested and threaded
    blocks share one installation), unless they were applied for good already."""
    global _depth, _warned
    if triton.__version__ != TRITON_VERSION:
        if not _warned:
            _warned = True
            warnings.warn(f"tileattn's corrections of Triton's CPU interpreter are verified for "
                          f"triton {TRITON_VERSION}, not {triton.__version__}: bf16 and FP8 "
                          f"results in the interpreter may be wrong", RuntimeWarning, stacklevel=3)
        yield
        return
    with _lock:
        installed_for_good = (_depth == 0 and interpreter._convert_float is _convert_float)
        if not installed_for_good:
            _depth += 1
            apply()
    try:
        yield
    finally:
        if not installed_for_good:
            with _lock:
                _depth -= 1
                if _depth == 0:
                    _remove()
