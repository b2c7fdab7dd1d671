"""Triton helpers that translated hooks call where torch and Triton disagree on an op.

Triton's integer `//` and `%` truncate toward zero and its float `%` is C's fmod; torch's
floor_divide and remainder round toward minus infinity (the remainder takes the divisor's
sign). These reproduce ATen's CPU kernels step by step, so hooks match torch bit for bit.
"""

import triton
import triton.language as tl


@triton.jit
def floor_divide_int(a, b):
    quotient = a // b
    remainder = a % b
    return tl.where((remainder != 0) & ((remainder < 0) != (b < 0)), quotient - 1, quotient)


@triton.jit
def remainder_int(a, b):
    remainder = a % b
    return tl.where((remainder != 0) & ((remainder < 0) != (b < 0)), remainder + b, remainder)


@triton.jit
def remainder_float(a, b):
    remainder = a % b           # fmod
    return tl.where((remainder != 0) & ((remainder < 0) != (b < 0)), remainder + b, remainder)


@triton.jit
def exact_div(a, b):
    """IEEE division. fp32 `/` compiles to div.full.f32 (2 ulp), which can put 14 / 7 just
    below 2 and a floor() after it one lower than torch's."""
    if a.dtype == tl.float32:
        return tl.math.div_rn(a, b)
    else:
        return a / b


@triton.jit
def floor_divide_float(a, b):
    """ATen's div_floor_floating: the quotient of a - fmod(a, b), corrected to the floor."""
    remainder = a % b
    quotient = exact_div(a - remainder, b)
    quotient = tl.where((remainder != 0) & ((b < 0) != (remainder < 0)), quotient - 1, quotient)
    floored = tl.floor(quotient)
    floored = tl.where(quotient - floored > 0.5, floored + 1, floored)
    floored = tl.where(quotient == 0, 0.0 * exact_div(a, b), floored)
    return tl.where(b == 0, exact_div(a, b), floored)


@triton.jit
def trunc(x):
    return tl.where(x < 0, tl.ceil(x), tl.floor(x))


@triton.jit
def sqrt(x):
    if x.dtype == tl.float32:
        return tl.sqrt_rn(x)
    else:
        return tl.sqrt(x)


@triton.jit
def position_to_float(x):
    """float32(x) for a position 0 <= x < 2**23 on full-rate units: 2**23 + x holds x in its
    mantissa, so OR-ing x into 2**23's bits and subtracting 2**23 is exact (an int-to-float
    conversion would share the special-function unit with exp2)."""
    return (x.to(tl.int32) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
