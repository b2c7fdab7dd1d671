"""Context parallelism: attention over a sequence sharded across the ranks of a
torch.distributed group (ring attention, K/V blocks passed point to point)."""

from .attention import attention
from .sharding import shard, unshard

__all__ = ["attention", "shard", "unshard"]
