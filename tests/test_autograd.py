"""Gradients through the public functions (eager: ops/backward.py's Functions; traced: the
custom ops' registered backward) against fp64 autograd, torch.compile of forward + backward, the refusals, and a short training run that must
track PyTorch's SDPA. The kernels themselves are tested in tests/test_attention_bwd.py."""

import pytest
import torch
import torch.nn.functional as F

import tileattn
from tileattn.ops import library
from tileattn.reference import attention_reference, attention_varlen_reference

from .conftest import GRAD_TOLERANCES
from .test_attention import DEVICE

SLOPES = torch.tensor([0.3, 0.1], device=DEVICE)
MASKS = {
    "causal": dict(causal=True),
    "window-softcap-alibi": dict(window_size=(7, 2), softcap=3.0, alibi_slopes=SLOPES),
}


def _relative(x, ref):
    return float((x.double() - ref).norm() / ref.norm())


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mask", MASKS)
def test_gradients_through_a_fused_qkv_buffer_and_lse(mask, dtype, deterministic):
    """q, k, v are slices of one [B, S, 3, H, D] buffer: their gradients land in its grad; the
    loss also reads lse, whose gradient the backward must carry."""
    gen = torch.Generator().manual_seed(1)
    qkv = torch.randn(1, 37, 3, 2, 64, generator=gen).to(DEVICE, dtype).requires_grad_()
    out, lse = tileattn.attention(*qkv.unbind(2), return_lse=True, deterministic=deterministic,
                                  **MASKS[mask])
    dout, dlse = torch.randn_like(out), torch.randn_like(lse)
    ((out.float() * dout.float()).sum() + (lse * dlse).sum()).backward()
    fp64 = qkv.detach().double().requires_grad_()
    ref_out, ref_lse = attention_reference(*fp64.unbind(2), **MASKS[mask])
    ((ref_out * dout.double()).sum() + (ref_lse * dlse.double()).sum()).backward()
    assert _relative(qkv.grad, fp64.grad) < GRAD_TOLERANCES[dtype]


def test_varlen_gradients():
    gen = torch.Generator().manual_seed(2)
    lengths_q, lengths_k = [5, 0, 19], [9, 3, 19]
    cu_q = torch.tensor([0, 5, 5, 24], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, 9, 12, 31], dtype=torch.int32, device=DEVICE)
    q, k, v = (torch.randn(n, h, 64, generator=gen).to(DEVICE, torch.float16).requires_grad_()
               for n, h in ((24, 4), (31, 2), (31, 2)))
    out = tileattn.attention_varlen(q, k, v, cu_q, cu_k, 19, 19, causal=True)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    ref, _ = attention_varlen_reference(*leaves, cu_q, cu_k, causal=True)
    expected = torch.autograd.grad(ref, leaves, dout.double())
    for grad, want in zip(grads, expected):
        assert _relative(grad, want) < GRAD_TOLERANCES[torch.float16]


@pytest.mark.parametrize("loss", ["out+lse", "out", "lse"])
@pytest.mark.parametrize("varlen", [False, True])
def test_eager_autograd_equals_the_ops_registered_autograd(varlen, loss):
    """Eager calls that need a gradient skip the custom op's dispatch (ops/backward.py's
    Functions, which leave an unused output's gradient unmade); calling the op itself runs
    its registered autograd. Same kernels, so the same outputs and gradients, bit for bit,
    whichever outputs the loss reads."""
    gen = torch.Generator().manual_seed(5)
    if varlen:
        cu = torch.tensor([0, 7, 7, 30], dtype=torch.int32, device=DEVICE)
        shapes, extra = ((30, 4), (30, 2), (30, 2)), (cu, cu, 23, 23)
    else:
        shapes, extra = ((1, 23, 4), (1, 23, 2), (1, 23, 2)), ()
    leaves = [torch.randn(*shape, 64, generator=gen).to(DEVICE, torch.bfloat16)
              for shape in shapes]
    public = tileattn.attention_varlen if varlen else tileattn.attention
    op = library.attention_varlen if varlen else library.attention
    options = (True, 0.125, 5, -1, 2.0, None) + ((None,) if varlen else ()) + (None,) * 4 + (False,)
    results = []
    for call in ("public", "op"):
        q, k, v = (x.clone().requires_grad_() for x in leaves)
        if call == "public":
            out, lse = public(q, k, v, *extra, causal=True, softmax_scale=0.125,
                              window_size=(5, -1), softcap=2.0, return_lse=True)
            assert type(out.grad_fn).__name__.startswith("EagerAttention"), out.grad_fn
        else:
            out, lse = op(q, k, v, *extra, *options)
        dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(6)).to(out)
        terms = {"out": (out.float() * dout.float()).sum(), "lse": lse.sum()}
        sum(terms[name] for name in loss.split("+")).backward()
        results.append((out, lse, q.grad, k.grad, v.grad))
    for got, want in zip(*results):
        assert torch.equal(got, want)


def test_second_derivatives_raise():
    """The backward is not itself differentiable: a second derivative (a gradient penalty, whose
    dout depends on the inputs) raises instead of coming out as zero."""
    q, k, v = (torch.randn(1, 9, 2, 64).to(DEVICE, torch.bfloat16).requires_grad_()
               for _ in range(3))
    out = tileattn.attention(q, k, v, causal=True)
    dq, = torch.autograd.grad(out.float().square().sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        dq.float().sum().backward()


def test_compile_forward_and_backward_matches_eager():
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 21, 2, 64, generator=gen).to(DEVICE, torch.float16) for _ in range(3))

    def step(q, k, v):
        q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
        out = tileattn.attention(q, k, v, causal=True, softcap=5.0)
        (out.float().square().sum()).backward()
        return out, q.grad, k.grad, v.grad
    torch._dynamo.reset()
    compiled = torch.compile(step, backend="aot_eager")
    for got, want in zip(compiled(q, k, v), step(q, k, v)):
        assert torch.equal(got, want)


def test_attention_op_autograd_opcheck():
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 20, 2, 64, generator=gen).to(DEVICE, torch.float16)
               .requires_grad_() for _ in range(3))
    args = (q, k, v, True, 0.125, -1, -1, 0.0, None, None, None, None, None, False)
    torch.library.opcheck(library.attention, args,
                          test_utils=("test_schema", "test_autograd_registration",
                                      "test_faketensor", "test_aot_dispatch_dynamic"))


def test_what_has_no_backward_is_refused_by_name():
    q, k, v = (torch.randn(1, 8, 2, 64, device=DEVICE) for _ in range(3))
    q8 = q.to(torch.float8_e4m3fn)
    with pytest.raises(TypeError, match="q requires grad, but tileattn.attention has no backward"):
        tileattn.attention(q8.float().requires_grad_().to(torch.float8_e4m3fn), q8, q8)
    with pytest.raises(ValueError, match="alibi_slopes requires grad"):
        tileattn.attention(q.half(), k.half(), v.half(),
                           alibi_slopes=torch.ones(2, device=DEVICE, requires_grad=True))
    cache = torch.randn(2, 4, 2, 64, device=DEVICE).half().requires_grad_()
    cu = torch.tensor([0, 3], dtype=torch.int32, device=DEVICE)
    table = torch.tensor([[0, 1]], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="k requires grad"):
        tileattn.attention_varlen(q[0, :3].half(), cache, cache, cu, cu, 3, 3, block_table=table)


class _TinyCausalLM(torch.nn.Module):
    """One attention block over token embeddings; `attend` is the attention under test."""

    def __init__(self, attend, vocab=32, heads=2, head_dim=64):
        super().__init__()
        self.heads, self.head_dim, self.attend = heads, head_dim, attend
        width = heads * head_dim
        self.embed = torch.nn.Embedding(vocab, width)
        self.position = torch.nn.Embedding(64, width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, tokens):
        batch, seqlen = tokens.shape
        x = self.embed(tokens) + self.position(torch.arange(seqlen, device=tokens.device))
        q, k, v = self.qkv(x).view(batch, seqlen, 3, self.heads, self.head_dim).unbind(2)
        y = self.attend(q, k, v).reshape(batch, seqlen, -1)
        return self.head(x + self.proj(y))


def _train(attend, steps, dtype):
    """fp32 parameters (Adam), attention in `dtype` as under autocast."""
    torch.manual_seed(0)
    low = lambda q, k, v: attend(*(x.to(dtype) for x in (q, k, v))).float()
    model = _TinyCausalLM(low).to(DEVICE)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(5)
    losses = []
    for _ in range(steps):
        # A learnable task: each token repeats the one 3 positions back.
        start = torch.randint(0, 32, (4, 3), generator=gen)
        tokens = start.repeat(1, 6).to(DEVICE)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_training_tracks_sdpa():
    """The same tiny model and data trained with tileattn and with SDPA reach the same loss
    (the curves agree within noise all along); GPU runs train longer (tests/gpu)."""
    steps, model_dtype = (40, torch.float16) if DEVICE == "cpu" else (300, torch.bfloat16)
    sdpa = lambda q, k, v: F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2)
    ours = _train(lambda q, k, v: tileattn.attention(q, k, v, causal=True), steps, model_dtype)
    theirs = _train(sdpa, steps, model_dtype)
    assert ours[-1] < 0.5 * ours[0], ours            # it learns
    tail = slice(steps - 5, steps)
    mean = lambda xs: sum(xs[tail]) / 5
    assert abs(mean(ours) - mean(theirs)) < 0.1 * mean(theirs) + 0.05, (ours[-5:], theirs[-5:])
