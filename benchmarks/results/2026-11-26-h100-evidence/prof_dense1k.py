"""One Hopper forward for ncu: causal B=64 N=1024 H=32 D=128 bf16 (CAUSAL=0: not causal)."""
import os, torch, tileattn
torch.manual_seed(0)
causal = os.environ.get("CAUSAL", "1") == "1"
q, k, v = (torch.randn(64, 1024, 32, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
for _ in range(3):
    tileattn.attention(q, k, v, causal=causal)
torch.cuda.synchronize()
