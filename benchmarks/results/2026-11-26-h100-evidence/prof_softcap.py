"""One Hopper forward for ncu: causal N=16k D=128 bf16, softcap CAP (0: none)."""
import os, torch, tileattn
torch.manual_seed(0)
cap = float(os.environ.get("CAP", "0"))
q, k, v = (torch.randn(1, 16384, 32, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
for _ in range(3):
    tileattn.attention(q, k, v, causal=True, softcap=cap)
torch.cuda.synchronize()
