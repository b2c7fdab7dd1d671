"""Triton kernels, one file per kernel family and architecture (kernel, config table, launcher)."""

from triton.runtime.interpreter import InterpretedFunction

from .attention_fwd import attention_fwd_kernel


def interpreter_active() -> bool:
    """True when TRITON_INTERPRET=1 was set before tileattn's kernels were defined."""
    return isinstance(attention_fwd_kernel, InterpretedFunction)
