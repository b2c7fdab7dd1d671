"""Argument checks that every rank of a group passes or fails together.

A rank that raised alone would leave the others waiting in the ring's first send, so each entry
point describes its arguments as a row of integers (shapes, dtypes, devices, flags and any local
check's error message), all-gathers the rows in one small collective, and then every rank raises
the same error: the first rank's local error, else the first field that differs across ranks.
"""

from __future__ import annotations

import math
import struct

import torch
import torch.distributed as dist

_MAX_DIMS = 6
_MESSAGE_BYTES = 512
_NOT_A_TENSOR = -2
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.float8_e4m3fn,
           torch.float8_e5m2, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
           torch.bool, torch.complex64, torch.complex128)
_DEVICE_TYPES = ("cpu", "cuda", "meta", "xpu", "mps", "hpu")
# Error kinds in a row's first slot (0: none).
_RAISED = (None, ValueError, TypeError, RuntimeError)


def group_and_size(group) -> tuple[object, int, int]:
    """(group, this rank's index in it, its size); group None is the default group."""
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("torch.distributed is not initialized: call "
                         "torch.distributed.init_process_group first")
    if group is None:
        group = dist.group.WORLD
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group must be a torch.distributed.ProcessGroup or None, "
                        f"got {type(group).__name__}")
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("this process is not a member of group")
    return group, rank, dist.get_world_size(group)


# ---- backends ---------------------------------------------------------------------------------

def backend_serving(spec: str, device_type: str) -> str | None:
    """The backend of a group whose dist.get_backend() is `spec` ("gloo", "nccl" or a
    "cpu:gloo,cuda:nccl" map) for tensors of `device_type`; None where it has none."""
    if ":" in spec:
        pairs = dict(part.split(":", 1) for part in spec.split(","))
        return pairs.get(device_type)
    return spec if device_type in dist.Backend.backend_capability.get(spec, ()) else None


def collective_error(spec: str, device_type: str) -> str | None:
    """Why a group with backend `spec` cannot all-gather `device_type` tensors, or None."""
    if backend_serving(spec, device_type) is None:
        return f"the group's backend ({spec}) has no collectives for {device_type} tensors"
    return None


def point_to_point_error(spec: str, device_type: str) -> str | None:
    """Why a group with backend `spec` cannot send and receive `device_type` tensors, or None.
    Gloo registers for CUDA, but its send/recv hand the tensor's pointer to a host socket."""
    backend = backend_serving(spec, device_type)
    if backend is None:
        return f"the group's backend ({spec}) cannot send {device_type} tensors"
    if backend == "gloo" and device_type != "cpu":
        return (f"the group's backend for {device_type} tensors is gloo, whose send/recv read "
                f"host memory only: use a group with a {device_type} backend (for CUDA, nccl, "
                "e.g. init_process_group('cpu:gloo,cuda:nccl'))")
    return None


def exchange_device(group, tensor) -> torch.device:
    """Where the check rows travel: the host where the group has a CPU backend (no GPU
    synchronisation), else the CUDA device of `tensor` or the current one."""
    spec = str(dist.get_backend(group))
    if backend_serving(spec, "cpu") is not None:
        return torch.device("cpu")
    if isinstance(tensor, torch.Tensor) and tensor.is_cuda:
        return tensor.device
    return torch.device("cuda", torch.cuda.current_device())


# ---- the row that describes one rank's arguments ------------------------------------------------

class Description:
    """Named integer fields that must be equal on every rank, each with its decoder for the
    error message."""

    def __init__(self):
        self.fields: list[tuple[str, int, object]] = []  # (name, width, decode)
        self.values: list[int] = []

    def _add(self, name, values, decode) -> None:
        self.fields.append((name, len(values), decode))
        self.values.extend(int(v) for v in values)

    def tensor(self, name: str, x) -> None:
        """x's shape, dtype and device type (or that it is None / not a tensor)."""
        if isinstance(x, torch.Tensor) and x.dim() <= _MAX_DIMS:
            shape = [x.dim(), *x.shape] + [0] * (_MAX_DIMS - x.dim())
            dtype = _DTYPES.index(x.dtype) if x.dtype in _DTYPES else len(_DTYPES)
            device = (_DEVICE_TYPES.index(x.device.type) if x.device.type in _DEVICE_TYPES
                      else len(_DEVICE_TYPES))
        else:
            shape = [-1 if x is None else _NOT_A_TENSOR] + [0] * _MAX_DIMS
            dtype = device = -1
        self._add(f"{name}'s shape", shape, _decode_shape)
        self._add(f"{name}'s dtype", [dtype], lambda v: _name(_DTYPES, v[0]))
        self._add(f"{name}'s device type", [device], lambda v: _name(_DEVICE_TYPES, v[0]))

    def flag(self, name: str, value) -> None:
        self._add(name, [bool(value) if isinstance(value, bool) else -1],
                  lambda v: {1: "True", 0: "False"}.get(v[0], "not a bool"))

    def integer(self, name: str, value) -> None:
        number = value if isinstance(value, int) and abs(value) < 2 ** 62 else -2 ** 62
        self._add(name, [number], lambda v: str(v[0]) if v[0] != -2 ** 62 else "not an int")

    def number(self, name: str, value) -> None:
        """A float compared exactly (its bits); None and non-numbers have their own codes."""
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            bits = struct.unpack("<q", struct.pack("<d", float(value)))[0]
            code = 0
        else:
            bits, code = 0, (1 if value is None else 2)
        self._add(name, [code, bits], _decode_number)

    def choice(self, name: str, value, choices: tuple[str, ...]) -> None:
        self._add(name, [choices.index(value) if value in choices else -1],
                  lambda v: repr(choices[v[0]]) if v[0] >= 0 else "another value")


def _name(table, index: int) -> str:
    if index == -1:
        return "none"
    return str(table[index]) if index < len(table) else "another"


def _decode_shape(values) -> str:
    ndim = values[0]
    if ndim == -1:
        return "None"
    if ndim == _NOT_A_TENSOR:
        return "not a tensor"
    return str(tuple(values[1:1 + ndim]))


def _decode_number(values) -> str:
    code, bits = values
    if code:
        return "None" if code == 1 else "not a number"
    value = struct.unpack("<d", struct.pack("<q", bits))[0]
    return repr(value) if math.isfinite(value) else str(value)


def _encode_error(error: BaseException | None) -> list[int]:
    if error is None:
        return [0] + [0] * (_MESSAGE_BYTES // 8)
    kind = next((i for i, t in enumerate(_RAISED) if t is type(error)), 3)
    text = str(error).encode("utf-8")[:_MESSAGE_BYTES].ljust(_MESSAGE_BYTES, b"\0")
    return [kind] + list(struct.unpack(f"<{_MESSAGE_BYTES // 8}q", text))


def _decode_error(row: list[int]) -> str:
    text = struct.pack(f"<{_MESSAGE_BYTES // 8}q", *row[1:1 + _MESSAGE_BYTES // 8])
    return text.rstrip(b"\0").decode("utf-8", errors="replace")


def agree(group, rank: int, world_size: int, description: Description,
          local_error: BaseException | None, device: torch.device, function: str) -> None:
    """Raise on every rank, or on none: the first rank's local error (its type and message),
    else a ValueError naming the first field that differs across ranks."""
    row = _encode_error(local_error) + description.values
    if world_size == 1:
        rows = [row]
    else:
        mine = torch.tensor(row, dtype=torch.int64, device=device)
        gathered = [torch.empty_like(mine) for _ in range(world_size)]
        dist.all_gather(gathered, mine, group=group)
        rows = torch.stack(gathered).tolist()
    for source, other in enumerate(rows):
        if other[0]:
            if source == rank:
                raise local_error
            where = f" (raised on rank {source} of the group)" if world_size > 1 else ""
            raise _RAISED[other[0]](f"{_decode_error(other)}{where}")
    start = 1 + _MESSAGE_BYTES // 8
    for name, width, decode in description.fields:
        values = [tuple(other[start:start + width]) for other in rows]
        differing = next((r for r, v in enumerate(values) if v != values[0]), None)
        if differing is not None:
            raise ValueError(f"tileattn.distributed.{function}: {name} must be the same on every "
                             f"rank of the group, but rank 0 has {decode(values[0])} and rank "
                             f"{differing} has {decode(values[differing])}")
        start += width
