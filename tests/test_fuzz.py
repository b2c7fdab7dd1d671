"""Randomised sweeps over the public API (the safety contract in the README).

Valid calls: seeded random shapes, dtypes, masks, descales and layouts (dense, packed varlen,
paged varlen) against the fp64 reference, on poison-free fresh inputs. Invalid calls: a random
valid call with one random corruption; it must raise ValueError or TypeError whose message
names the corrupted argument, never another exception and never a result.

The seeds are fixed so that a failure reproduces; the case id prints the seed.
"""

import random

import pytest
import torch

import tileattn
from tileattn.reference import (attention_reference, attention_varlen_reference,
                                mla_decode_reference)

from .test_attention import DEVICE
from .test_mla import LSE_TOLERANCE as MLA_LSE_TOLERANCE
from .test_mla import TOLERANCE as MLA_TOLERANCE
from .test_serving import assert_matches

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
DTYPES = (torch.float16, torch.bfloat16, *FP8)
HEAD_DIMS = (64, 96, 128)      # interpreter cost grows with D; 192/256 are in test_attention


def _quantized(x, dtype, per):
    if dtype in FP8:
        return tileattn.quantize_fp8(x, dtype, per=per)
    return x.to(dtype), None


def _strided(x: torch.Tensor, rng: random.Random) -> torch.Tensor:
    """x as it is, or the same values in a view of a larger buffer: a padded last dim (a fused
    QKV projection's slice) or heads before the sequence (a [B, H, S, D] tensor transposed)."""
    layout = rng.choice(["contiguous", "padded", "heads-first"])
    if layout == "contiguous" or x.dim() != 4:
        return x
    if layout == "padded":
        view = torch.empty(*x.shape[:3], x.shape[3] + 32, dtype=x.dtype, device=x.device)
        view = view[..., 16:16 + x.shape[3]]
    else:
        view = torch.empty(x.shape[0], x.shape[2], x.shape[1], x.shape[3], dtype=x.dtype,
                           device=x.device).transpose(1, 2)
    view.copy_(x)
    return view


def _mask_options(rng: random.Random, heads: int, batch: int) -> dict:
    options = {}
    if rng.random() < 0.5:
        options["causal"] = True
    if rng.random() < 0.4:
        options["window_size"] = (rng.choice([-1, 0, 1, 7, 20]), rng.choice([-1, 0, 3, 11]))
    if rng.random() < 0.3:
        options["softcap"] = rng.choice([0.5, 2.0, 30.0])
    if rng.random() < 0.3:
        shape = (heads,) if rng.random() < 0.5 else (batch, heads)
        options["alibi_slopes"] = torch.rand(shape).mul(0.5).to(DEVICE)
    if rng.random() < 0.3:
        options["softmax_scale"] = rng.uniform(0.02, 0.3)
    return options


def dense_call(seed: int) -> dict:
    """A random valid attention() call: its arguments by name."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    batch, kv_heads, group = rng.randint(1, 2), rng.randint(1, 2), rng.randint(1, 3)
    seqlen_q, seqlen_k = rng.randint(1, 40), rng.randint(1, 40)
    head_dim, head_dim_v = rng.choice(HEAD_DIMS), rng.choice(HEAD_DIMS)
    dtype = rng.choice(DTYPES)
    per = rng.choice(["tensor", "head"])
    args = {}
    for name, seqlen, heads, dim in (("q", seqlen_q, kv_heads * group, head_dim),
                                     ("k", seqlen_k, kv_heads, head_dim),
                                     ("v", seqlen_k, kv_heads, head_dim_v)):
        x = torch.randn(batch, seqlen, heads, dim, generator=gen).to(DEVICE)
        if dtype in FP8 and rng.random() < 0.2:     # no descale: the values cast as they are
            args[name] = x.to(dtype)
            continue
        args[name], descale = _quantized(x, dtype, per)
        if descale is not None:
            args[f"{name}_descale"] = descale
    for name in ("q", "k", "v"):
        args[name] = _strided(args[name], rng)
    return args | _mask_options(rng, kv_heads * group, batch)


def varlen_call(seed: int) -> dict:
    """A random valid attention_varlen() call, packed or paged (random page size, shuffled
    pages, garbage in unused table slots), sequences of any length including empty ones."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    batch, kv_heads, group = rng.randint(1, 4), rng.randint(1, 2), rng.randint(1, 2)
    lengths_k = [rng.choice([0, 1, rng.randint(2, 35)]) for _ in range(batch)]
    lengths_q = [rng.randint(0, n) if rng.random() < 0.7 else rng.randint(0, 20)
                 for n in lengths_k]
    head_dim, head_dim_v = rng.choice(HEAD_DIMS), rng.choice(HEAD_DIMS)
    dtype = rng.choice(DTYPES)
    cu = lambda lengths: torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()],
                                      dtype=torch.int32, device=DEVICE)
    args = dict(cu_seqlens_q=cu(lengths_q), cu_seqlens_k=cu(lengths_k),
                max_seqlen_q=max(lengths_q) + rng.randint(0, 3),
                max_seqlen_k=max(lengths_k) + rng.randint(0, 3))
    for name, total, heads, dim in (("q", sum(lengths_q), kv_heads * group, head_dim),
                                    ("k", sum(lengths_k), kv_heads, head_dim),
                                    ("v", sum(lengths_k), kv_heads, head_dim_v)):
        x = torch.randn(1, total, heads, dim, generator=gen).to(DEVICE)
        x, descale = _quantized(x, dtype, "tensor")
        args[name] = x[0]
        if descale is not None:
            args[f"{name}_descale"] = descale
    if rng.random() < 0.6:
        page_size = rng.choice([1, 3, 16])
        pages_per_seq = [-(-n // page_size) for n in lengths_k]
        num_pages = sum(pages_per_seq) + 2
        order = torch.randperm(num_pages, generator=gen).tolist()
        table = torch.full((batch, max(max(pages_per_seq), 1) + 1), 10**6, dtype=torch.int32)
        caches = {name: torch.randn(num_pages, page_size, kv_heads, args[name].shape[-1],
                                    generator=gen).to(args[name].dtype).to(DEVICE)
                  for name in ("k", "v")}
        cu_k = args["cu_seqlens_k"].tolist()
        for b in range(batch):
            for p in range(pages_per_seq[b]):
                table[b, p] = page = order.pop()
                rows = slice(cu_k[b] + p * page_size, min(cu_k[b + 1], cu_k[b] + (p + 1) * page_size))
                for name, cache in caches.items():
                    cache[page, :rows.stop - rows.start] = args[name][rows]
        args.update(caches, block_table=table.to(DEVICE))
    return args | _mask_options(rng, kv_heads * group, batch)


def _reference_options(args: dict) -> dict:
    skip = {"q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"}
    return {name: value for name, value in args.items() if name not in skip}


@pytest.mark.parametrize("seed", range(80), ids=lambda s: f"seed{s}")
def test_random_dense_calls_match_reference(seed):
    check_dense(seed)


@pytest.mark.parametrize("seed", range(60), ids=lambda s: f"seed{s}")
def test_random_varlen_calls_match_reference(seed):
    check_varlen(1000 + seed)


@pytest.mark.parametrize("seed", range(24), ids=lambda s: f"seed{s}")
def test_random_mla_calls_match_reference(seed):
    check_mla(4000 + seed)


def check_dense(seed):
    args = dense_call(seed)
    out, lse = tileattn.attention(**args, return_lse=True)
    ref, ref_lse = attention_reference(args["q"], args["k"], args["v"], **_reference_options(args))
    assert out.shape == ref.shape and lse.shape == ref_lse.shape
    _assert_close(out, lse, ref, ref_lse, args["q"].dtype)


def check_varlen(seed):
    args = varlen_call(seed)
    out, lse = tileattn.attention_varlen(**args, return_lse=True)
    ref, ref_lse = attention_varlen_reference(args["q"], args["k"], args["v"], args["cu_seqlens_q"],
                                              args["cu_seqlens_k"], **_reference_options(args))
    assert out.shape == ref.shape and lse.shape == ref_lse.shape
    _assert_close(out, lse, ref, ref_lse, args["q"].dtype)


def _assert_close(out, lse, ref, ref_lse, dtype):
    if ref.numel() == 0 or float(ref.norm()) == 0:     # every row empty: zeros, lse -inf
        assert torch.equal(out.double(), ref) and torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
        return
    assert_matches(out, lse, ref, ref_lse, dtype)


# Corruptions: (argument it names, function of a valid call's arguments returning the bad
# value). Each keeps every other argument valid.
def _resized(x, dim):
    """x one shorter along dim, or one longer where it has at most one row there."""
    if x.shape[dim] > 1:
        return x.narrow(dim, 0, x.shape[dim] - 1)
    shape = list(x.shape)
    shape[dim] += 1
    return torch.zeros(shape, dtype=x.dtype, device=x.device)


def _wrong_dtype(x):
    if not x.is_floating_point():
        return x.long()
    return x.double() if x.dtype == torch.float32 else x.float()


TENSOR_CORRUPTIONS = [
    lambda x: x.tolist() if x.numel() < 64 else [1.0],        # not a tensor
    _wrong_dtype,
    lambda x: x[0],                                            # a dimension fewer
    lambda x: x[None],                                         # a dimension more
]

# Dimensions whose size may not change alone: (function, paged) -> tensor -> dims. Left out:
# q's seqlen and heads in attention() (free: any Sq, any multiple of Hkv), a paged cache's
# page count (spare pages are allowed).
SHAPE_TIED = {
    ("attention", False): {"q": (0, 3), "k": (0, 1, 2, 3), "v": (0, 1, 2, 3)},
    ("attention_varlen", False): {"q": (0, 2), "k": (0, 1, 2), "v": (0, 1, 2)},
    ("attention_varlen", True): {"q": (0, 2), "k": (1, 2, 3), "v": (1, 2, 3)},
}

SCALAR_CORRUPTIONS = {
    "softmax_scale": [-1.0, 0.0, float("nan"), float("inf"), "0.1", True, torch.ones(2)],
    "softcap": [-1.0, float("nan"), float("inf"), "1", True],
    "window_size": [(-2, 0), (0, -3), (1, 2, 3), "ab", 4, (1.5, 2), (True, 0)],
    "causal": [1, None, "yes"],
    "out_dtype": [torch.int8, "bfloat16", torch.float8_e4m3fn],
}

def _corrupt(args: dict, rng: random.Random, function: str) -> tuple[dict, tuple[str, ...]]:
    """One random corruption of a valid call; returns the call and the names any one of
    which the error message must contain."""
    args = dict(args)
    varlen = function == "attention_varlen"
    kind = rng.random()
    if kind < 0.4:
        # alibi [Hq] <-> [1, Hq] and 0-d <-> [B, H] descales change rank validly: only their
        # type and dtype are corrupted.
        name = rng.choice([name for name, value in args.items()
                           if isinstance(value, torch.Tensor)])
        flexible = name == "alibi_slopes" or name.endswith("descale")
        args[name] = rng.choice(TENSOR_CORRUPTIONS[:2] if flexible else TENSOR_CORRUPTIONS)(
            args[name])
        related = {"q": ("q",), "k": ("k",), "v": ("v",)}
        return args, related.get(name, (name,))
    if kind < 0.65:
        tied = SHAPE_TIED[(function, args.get("block_table") is not None)]
        name = rng.choice(sorted(tied))
        args[name] = _resized(args[name], rng.choice(tied[name]))
        return args, ("q", "k", "v", "cu_seqlens", "block_table")
    if kind < 0.75:
        name = rng.choice(["q_descale", "k_descale", "v_descale"])
        bad = rng.choice([torch.ones(3, 5), torch.ones((), dtype=torch.float64), 1.0]
                         if args["q"].dtype in FP8 else [torch.ones(())])   # FP8 only
        args[name] = bad.to(DEVICE) if isinstance(bad, torch.Tensor) else bad
        return args, (name,)
    if varlen and kind < 0.9:
        name = rng.choice(["cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"])
        value = args[name]
        if name.startswith("max"):
            args[name] = rng.choice([-1, 1.5, "8", None])
        else:
            choice = rng.randrange(4)
            if choice == 0:
                args[name] = value.long()
            elif choice == 1:
                args[name] = value[:-1] if len(value) > 2 else torch.cat([value, value[-1:]])
            elif choice == 2:
                args[name] = value + 1                           # no longer from 0
            else:
                args[name] = value.flip(0) if len(value) > 2 and value[-1] > 0 else value - 1
        return args, (name, "cu_seqlens", "max_seqlen", "block_table", "q", "k")
    name = rng.choice(sorted(SCALAR_CORRUPTIONS))
    args[name] = rng.choice(SCALAR_CORRUPTIONS[name])
    return args, (name,)


TRIALS = 300


@pytest.mark.parametrize("function", ["attention", "attention_varlen"])
def test_random_corruptions_raise_named_errors(function):
    """TRIALS corrupted calls per function; cheap, the checks run before any kernel."""
    varlen = function == "attention_varlen"
    rng = random.Random(7)
    caught = 0
    for trial in range(TRIALS):
        args = (varlen_call if varlen else dense_call)(2000 + trial % 10)
        bad, names = _corrupt(args, rng, function)
        try:
            getattr(tileattn, function)(**bad)
        except (ValueError, TypeError) as error:
            message = str(error)
            assert any(name in message for name in names), (trial, names, message)
            caught += 1
            continue
        except Exception as error:     # any other exception is a defect
            raise AssertionError(f"trial {trial}: {type(error).__name__}: {error}") from error
        changed = {name for name in args if bad.get(name) is not args[name]}
        raise AssertionError(f"trial {trial}: corrupting {changed} was accepted")
    assert caught == TRIALS


def test_invalid_page_ids_are_named_not_read():
    """Random out-of-range page ids in the used part of a block table: ValueError naming it."""
    checked = 0
    for seed in range(30):
        args = varlen_call(3000 + seed)
        if args.get("block_table") is None or int(args["cu_seqlens_k"][-1]) == 0:
            continue
        rng = random.Random(seed)
        table = args["block_table"].clone()
        lengths = (args["cu_seqlens_k"][1:] - args["cu_seqlens_k"][:-1]).tolist()
        b = rng.choice([i for i, n in enumerate(lengths) if n > 0])
        table[b, 0] = rng.choice([-1, args["k"].shape[0], 2**31 - 1])
        with pytest.raises(ValueError, match="block_table"):
            tileattn.attention_varlen(**(args | {"block_table": table}))
        checked += 1
    assert checked >= 10


def _mla_call(rng: random.Random) -> dict:
    batch, page_size, q_len = rng.randint(1, 3), rng.choice([1, 16, 64]), rng.randint(1, 4)
    seq_lens = [rng.randint(q_len, 80) for _ in range(batch)]
    pages = [-(-n // page_size) for n in seq_lens]
    dtype = rng.choice([torch.float16, torch.bfloat16])
    kv_dtype = rng.choice([dtype, torch.float8_e4m3fn])
    num_pages = sum(pages) + 2
    table = torch.randint(0, num_pages, (batch, max(pages) + 1), dtype=torch.int32)
    args = dict(q=torch.randn(batch, q_len, rng.choice([16, 32]), 576).to(dtype),
                kv_cache=torch.randn(num_pages, page_size, 576).to(kv_dtype),
                page_table=table,
                seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
                softmax_scale=rng.uniform(0.03, 0.1))
    if kv_dtype != dtype:
        args["kv_descale"] = torch.tensor(rng.uniform(0.1, 2.0))
    return {name: value.to(DEVICE) if isinstance(value, torch.Tensor) else value
            for name, value in args.items()}


def check_mla(seed):
    """Random batch, heads, q_len, page size, cache dtype and page table (pages shared between
    sequences, unused slots), with a plan whose workspace is poisoned, and without one."""
    rng = random.Random(seed)
    args = _mla_call(rng)
    q, kv, table, lens = (args.pop(name) for name in ("q", "kv_cache", "page_table", "seq_lens"))
    plan = None
    if rng.random() < 0.7:
        plan = tileattn.mla_plan(lens, num_heads=q.shape[2], q_len=q.shape[1],
                                 page_size=kv.shape[1], kv_dtype=kv.dtype, device=DEVICE)
        plan.partial_out.fill_(float("nan"))
        plan.partial_lse.fill_(float("nan"))
    out, lse = tileattn.mla_decode(q, kv, table, lens, plan=plan, return_lse=True, **args)
    ref, ref_lse = mla_decode_reference(q, kv, table, lens, softmax_scale=args["softmax_scale"],
                                        kv_descale=args.get("kv_descale"))
    assert out.shape == ref.shape and lse.shape == ref_lse.shape
    assert torch.isfinite(out).all()
    assert float((out.double() - ref).norm() / ref.norm()) < MLA_TOLERANCE[q.dtype]
    assert float(((lse.double() - ref_lse).abs() / ref_lse.abs().clamp(min=1)).max()) < MLA_LSE_TOLERANCE


# mla_decode's tied dimensions: q_len and the page size and count are free.
MLA_TIED = {"q": (0, 2, 3), "kv_cache": (2,), "page_table": (0,), "seq_lens": (0,)}


def test_random_mla_corruptions_raise_named_errors():
    rng = random.Random(11)
    for trial in range(TRIALS):
        args = _mla_call(rng)
        name = rng.choice([*MLA_TIED, "kv_descale", "softmax_scale"])
        if name in MLA_TIED:
            args[name] = (_resized(args[name], rng.choice(MLA_TIED[name])) if rng.random() < 0.5
                          else rng.choice(TENSOR_CORRUPTIONS)(args[name]))
        elif name == "kv_descale":
            args[name] = rng.choice([torch.ones(2), torch.ones((), dtype=torch.float64), 1.0]
                                    if "kv_descale" in args else [torch.ones(())])
        else:
            args[name] = rng.choice(SCALAR_CORRUPTIONS["softmax_scale"])
        with pytest.raises((ValueError, TypeError)) as error:
            tileattn.mla_decode(args.pop("q"), args.pop("kv_cache"), args.pop("page_table"),
                                args.pop("seq_lens"), **args)
        assert any(n in str(error.value) for n in (name, "q", "kv_cache", "page_table",
                                                   "seq_lens")), (trial, name, error.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="for a torch build without CUDA")
def test_plans_for_cuda_on_a_cpu_only_torch_are_refused():
    lens = torch.tensor([5, 7], dtype=torch.int32)
    with pytest.raises(ValueError, match="device is cuda"):
        tileattn.mla_plan(lens, num_heads=16, page_size=16, kv_dtype=torch.float16,
                          device="cuda")
    with pytest.raises(ValueError, match="device is cuda"):
        tileattn.decode_plan(lens, num_q_heads=4, num_kv_heads=2, page_size=16, head_dim=64,
                             kv_dtype=torch.float16, device="cuda")
