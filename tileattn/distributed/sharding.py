"""shard() and unshard(): a full tensor to this rank's part of its sequence and back
(layout.py says which positions each rank holds)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import checks
from .layout import LAYOUTS, chunks_per_rank, local_runs


def shard(x, *, group=None, layout="zigzag", seq_dim=1):
    """This rank's part of the full tensor x along dim seq_dim, a new contiguous tensor
    (differentiable: it is slicing). Every rank calls it with the same x shape; the sequence
    length must be a multiple of W (layout="contiguous") or 2W (layout="zigzag")."""
    group, rank, world_size = checks.group_and_size(group)
    description = _describe(x, layout, seq_dim)
    try:
        _check_sequence(x, layout, seq_dim, world_size, "x")
        error = None
    except Exception as raised:  # noqa: BLE001 (every rank must learn of it)
        error = raised
    checks.agree(group, rank, world_size, description, error, checks.exchange_device(group, x),
                 "shard")
    runs = local_runs(layout, rank, world_size, x.shape[seq_dim])
    return torch.cat([x.narrow(seq_dim, start, length) for start, length in runs], dim=seq_dim)


def unshard(x_local, *, group=None, layout="zigzag", seq_dim=1):
    """The full tensor, on every rank, from each rank's x_local (shard()'s inverse: an
    all-gather and a reorder). Not differentiable: refuses a tensor that requires grad
    while autograd records."""
    group, rank, world_size = checks.group_and_size(group)
    description = _describe(x_local, layout, seq_dim)
    try:
        _check_sequence(x_local, layout, seq_dim, 1, "x_local")
        if torch.is_grad_enabled() and x_local.requires_grad:
            raise ValueError("x_local requires grad, but unshard has no backward pass: pass "
                             "x_local.detach() or call it under torch.no_grad()")
        reason = checks.collective_error(str(dist.get_backend(group)), x_local.device.type)
        if reason is not None:
            raise ValueError(f"x_local is on {x_local.device}, but {reason}")
        error = None
    except Exception as raised:  # noqa: BLE001 (every rank must learn of it)
        error = raised
    checks.agree(group, rank, world_size, description, error,
                 checks.exchange_device(group, x_local), "unshard")

    local = x_local.contiguous()
    # Gathered as bytes: gloo and NCCL move every dtype that way (FP8 included).
    local_bytes = local.reshape(-1).view(torch.uint8)
    gathered = [local_bytes]
    if world_size > 1:
        gathered = [torch.empty_like(local_bytes) for _ in range(world_size)]
        dist.all_gather(gathered, local_bytes, group=group)
    shards = [part.view(local.dtype).view(local.shape) for part in gathered]
    full_shape = list(local.shape)
    full_shape[seq_dim] *= world_size
    full = torch.empty(full_shape, dtype=local.dtype, device=local.device)
    for source in range(world_size):
        offset = 0
        for start, length in local_runs(layout, source, world_size, full_shape[seq_dim]):
            full.narrow(seq_dim, start, length).copy_(shards[source].narrow(seq_dim, offset, length))
            offset += length
    return full


def _describe(x, layout, seq_dim) -> checks.Description:
    description = checks.Description()
    description.tensor("x", x)
    description.choice("layout", layout, LAYOUTS)
    if isinstance(x, torch.Tensor) and isinstance(seq_dim, int) and -x.dim() <= seq_dim < 0:
        seq_dim += x.dim()  # -3 and 1 name the same dim of a 4-D tensor
    description.integer("seq_dim", seq_dim)
    return description


def _check_sequence(x, layout, seq_dim, ranks: int, name: str) -> None:
    """x is a tensor with a dim seq_dim (negative counts from the end) whose length splits
    into `ranks` ranks' shards of chunks_per_rank(layout) equal chunks each."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if not isinstance(seq_dim, int) or isinstance(seq_dim, bool) or not -x.dim() <= seq_dim < x.dim():
        raise ValueError(f"seq_dim must be an int dim of {name} (shape {tuple(x.shape)}), "
                         f"got {seq_dim!r}")
    length, chunks = x.shape[seq_dim], chunks_per_rank(layout)
    if length == 0 or length % (ranks * chunks):
        split = (f"{ranks} ranks x {chunks} equal chunks" if ranks > 1
                 else f"{chunks} equal chunks")
        raise ValueError(f"{name}'s sequence length (dim {seq_dim}) must be a positive multiple "
                         f"of {ranks * chunks} ({split} for layout={layout!r}), got {length}")
