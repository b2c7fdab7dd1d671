"""The ring's transport and the LSE merge of partial attention results.

Blocks move with torch.distributed's own point-to-point ops (batch_isend_irecv); nothing here
is a transport of its own. On CUDA, NCCL runs them on its internal stream, so a transfer
posted before a kernel overlaps it; Work.wait() then orders the current stream after the
transfer without blocking the host. Gloo (CPU) runs them on its own threads.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..kernels.lse_merge import lse_merge_launch
from ..kernels.runtime import on_device


def _dense_order(x: torch.Tensor) -> list[int] | None:
    """A permutation of x's dims under which x is contiguous (x is dense in memory, e.g. a
    K-major V from tileattn.prepare_v), or None."""
    order = sorted(range(x.dim()), key=lambda d: -x.stride(d))
    return order if x.permute(order).is_contiguous() else None


def dense(x: torch.Tensor) -> torch.Tensor:
    """x itself if its memory is dense in some dim order (so it can travel as one buffer and
    arrive in the same layout), else a contiguous copy."""
    return x if _dense_order(x) is not None else x.contiguous()


def _as_bytes(x: torch.Tensor) -> torch.Tensor:
    """x's memory (dense) as a flat uint8 tensor: the wire format for every dtype, since
    neither gloo nor every NCCL version reduces or even moves FP8 dtypes."""
    order = _dense_order(x)
    return x.permute(order).reshape(-1).view(torch.uint8)


def _empty_like_dense(x: torch.Tensor) -> torch.Tensor:
    """An uninitialised tensor with x's shape, dtype, device and dim order."""
    order = _dense_order(x)
    buffer = torch.empty([x.shape[d] for d in order], dtype=x.dtype, device=x.device)
    inverse = sorted(range(x.dim()), key=lambda d: order[d])
    return buffer.permute(inverse)


class InFlight:
    """Tensors being received; wait() returns them once their transfers (and this rank's
    sends of the same exchange) have completed."""

    def __init__(self, received: list[torch.Tensor], works: list, sent: list[torch.Tensor]):
        self._received, self._works = received, works
        self._sent = sent  # kept alive until the sends complete

    def wait(self) -> list[torch.Tensor]:
        for work in self._works:
            work.wait()
        self._sent = None
        return self._received


class Ring:
    """Ranks of a group in a ring: each step sends to the next rank and receives from the
    previous one, so that after s steps rank r holds what rank (r - s) mod W started with."""

    def __init__(self, group, rank: int, world_size: int):
        self.group, self.rank, self.world_size = group, rank, world_size
        self._next = dist.get_global_rank(group, (rank + 1) % world_size)
        self._previous = dist.get_global_rank(group, (rank - 1) % world_size)

    def source(self, step: int) -> int:
        """The rank whose block this rank holds after `step` exchanges."""
        return (self.rank - step) % self.world_size

    def pass_along(self, tensors: list[torch.Tensor], first_tag: int) -> InFlight:
        """Post sends of `tensors` (dense; not to be written until the returned InFlight is
        waited on) to the next rank and receives of the previous rank's into new buffers of
        the same shapes, dtypes and layouts. Tags keep concurrent exchanges apart on gloo."""
        received = [_empty_like_dense(x) for x in tensors]
        operations = []
        for tag, (outgoing, incoming) in enumerate(zip(tensors, received), start=first_tag):
            operations.append(dist.P2POp(dist.isend, _as_bytes(outgoing), self._next,
                                         self.group, tag))
            operations.append(dist.P2POp(dist.irecv, _as_bytes(incoming), self._previous,
                                         self.group, tag))
        return InFlight(received, dist.batch_isend_irecv(operations), list(tensors))


def merge_into(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor,
               block_lse: torch.Tensor) -> None:
    """out, lse <- the softmax-weighted union of (out, lse) and (block_out, block_lse), in
    place, in fp32: out = Σ exp(lse_i - lse) out_i with lse = logaddexp(lse_i), one kernel
    (kernels/lse_merge.py).

    out/block_out [B, S, H, D] and lse/block_lse [B, H, S] fp32 (natural log). A row that no
    key reached has lse -inf and output 0 on both sides and keeps them (no NaN).
    """
    with on_device(out.device):
        lse_merge_launch(out, lse, block_out, block_lse).run()
