import math, sys, torch
from tileattn.arch import arch_of
from tileattn.kernels.attention import bwd
import tileattn
causal = sys.argv[1] == "causal"; D = int(sys.argv[2]); N = int(sys.argv[3])
dev = torch.device("cuda"); arch = arch_of(dev)
gen = torch.Generator(device=dev).manual_seed(0)
q, k, v, do = (torch.randn(4, N, 32, D, device=dev, generator=gen, dtype=torch.bfloat16) for _ in range(4))
out, lse = tileattn.attention(q, k, v, causal=causal, return_lse=True)
g = tuple(torch.empty_like(x) for x in (q, k, v))
for _ in range(2):
    bwd.attention_backward(q, k, v, out, lse, do, *g, causal=causal, softmax_scale=1 / math.sqrt(D), window_left=-1, window_right=-1, arch=arch, kernel="sm90", deterministic=False)
torch.cuda.synchronize()
