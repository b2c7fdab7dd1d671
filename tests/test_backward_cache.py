"""The backward's call cache (tileattn/ops/backward_cache.py), on the CPU: every tensor
argument of every backward launch maps to a role of the call by its name (a replay on the GPU
fills it from the new call's tensors; tests/gpu checks replays bit for bit), and signatures
take exactly the calls a replay can serve."""

import pytest
import torch

from tileattn.arch import arch_for_capability
from tileattn.kernels import mods, runtime
from tileattn.kernels.attention import bwd
from tileattn.ops import backward_cache


def _per_call(launch) -> set:
    """The arguments a BoundLaunch of this launch takes per call (runtime.BoundLaunch)."""
    return {name for name, value in launch.args.items()
            if runtime._holds_tensor(value) or type(value) is tuple}


def _call(head_dim=128, kv_heads=2, dlse=False):
    q = torch.empty(2, 300, 4, head_dim, dtype=torch.bfloat16)
    k = torch.empty(2, 280, kv_heads, head_dim, dtype=torch.bfloat16)
    v = torch.empty_like(k)
    out, dout = torch.empty_like(q), torch.empty_like(q)
    lse = torch.empty(2, 4, 300)
    delta, dq_accum = bwd.backward_workspace(q, lse, True)
    return dict(q=q, k=k, v=v, out=out, lse=lse, dout=dout, dlse=torch.empty_like(lse) if dlse else None,
                dq=torch.empty_like(q), dk=torch.empty_like(k), dv=torch.empty_like(v),
                delta=delta, dq_accum=dq_accum)


@pytest.mark.parametrize("kernel,capability", [("sm90", (9, 0)), ("portable", (9, 0)),
                                               ("portable", (8, 0))])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_every_tensor_argument_has_its_role(kernel, capability, head_dim, causal):
    call = _call(head_dim, dlse=causal)
    launches = bwd.backward_launches(
        call["q"], call["k"], call["v"], call["out"], call["lse"], call["dout"], call["dq"],
        call["dk"], call["dv"], call["delta"], call["dq_accum"], causal=causal, dlse=call["dlse"],
        softmax_scale=0.1, window_left=-1, window_right=-1,
        arch=arch_for_capability(capability), kernel=kernel)
    assert len(launches) == 3
    descriptors = 0
    for launch in launches:
        names = _per_call(launch)
        plan = backward_cache._argument_plan(launch, names, call)
        assert plan is not None and set(plan) == names, launch.kernel
        descriptors += sum(entry[0] == "descriptor" for entry in plan.values())
        # The cache keeps no tensor of the recorded call: a descriptor's entry is its role.
        assert all(len(entry) == 2 and type(entry[1]) is str
                   for entry in plan.values() if entry[0] == "descriptor")
    assert descriptors == (8 if kernel == "sm90" and head_dim == 128 else
                           4 if kernel == "sm90" and head_dim == 256 else 0)


def test_a_wrong_tensor_is_refused():
    call = _call()
    launches = bwd.backward_launches(
        call["q"], call["k"], call["v"], call["out"], call["lse"], call["dout"], call["dq"],
        call["dk"], call["dv"], call["delta"], None, causal=True, softmax_scale=0.1,
        window_left=-1, window_right=-1, arch=arch_for_capability((9, 0)), kernel="sm90")
    swapped = dict(call, k=call["v"], v=call["k"])     # k's tensor where v's was
    names = _per_call(launches[1])
    assert backward_cache._argument_plan(launches[1], names, swapped) is None


def test_signatures_take_cuda_tensors_only():
    x = torch.empty(1, 8, 2, 64, device="meta")
    options = dict(causal=True, softmax_scale=0.125, window_left=-1, window_right=0,
                   softcap=0.0, alibi_slopes=None, deterministic=True, settings=None)
    cpu = torch.empty(1, 8, 2, 64)
    assert backward_cache.signature(cpu, None, cpu, cpu, cpu, cpu, cpu, **options) is None
    assert backward_cache.signature(x, None, x, x, x, x, x, **options) is None    # not CUDA


@pytest.mark.parametrize("softcap, alibi", [(30.0, False), (0.0, True), (20.0, True)])
def test_hook_arguments_are_each_calls(softcap, alibi):
    """Softcap and ALiBi (portable kernels): mod_args is filled from each replayed call (the
    softcap's value is not in the signature), everything else by role."""
    call = _call(128)
    slopes = torch.rand(4) if alibi else None
    score_mod, score_mod_grad, mod_args = mods.builtin(softcap, slopes)
    call["mod_args"] = mod_args
    launches = bwd.backward_launches(
        call["q"], call["k"], call["v"], call["out"], call["lse"], call["dout"], call["dq"],
        call["dk"], call["dv"], call["delta"], None, causal=True, softmax_scale=0.1,
        window_left=-1, window_right=-1, score_mod=score_mod, score_mod_grad=score_mod_grad,
        mod_args=mod_args, arch=arch_for_capability((9, 0)), kernel="sm90")
    kinds = []
    for launch in launches:
        names = _per_call(launch)
        plan = backward_cache._argument_plan(launch, names, call)
        assert plan is not None and set(plan) == names, launch.kernel
        kinds += [entry[0] for entry in plan.values()]
    assert kinds.count("mod_args") == 2 and "descriptor" not in kinds   # dK/dV and dQ
    other = dict(call, mod_args=mods.builtin(softcap + 1.0, slopes)[2])
    names = _per_call(launches[1])
    if softcap:   # a plan recorded for other arguments than the launch's is refused
        assert backward_cache._argument_plan(launches[1], names, other) is None


@pytest.mark.parametrize("causal", [False, True])
def test_packed_backward_arguments_have_their_roles(causal):
    """Packed sequences (portable kernels): cu_seqlens map by name too."""
    q = torch.empty(700, 4, 128, dtype=torch.bfloat16)
    k = torch.empty(650, 2, 128, dtype=torch.bfloat16)
    v, out, dout = torch.empty_like(k), torch.empty_like(q), torch.empty_like(q)
    lse = torch.empty(4, 700)
    cu_q = torch.tensor([0, 300, 700], dtype=torch.int32)
    cu_k = torch.tensor([0, 250, 650], dtype=torch.int32)
    delta, dq_accum = bwd.backward_workspace(q, lse, True)
    call = dict(q=q, k=k, v=v, out=out, lse=lse, dout=dout, dlse=None, dq=torch.empty_like(q),
                dk=torch.empty_like(k), dv=torch.empty_like(v), delta=delta, dq_accum=dq_accum,
                cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    launches = bwd.backward_launches(
        q, k, v, out, lse, dout, call["dq"], call["dk"], call["dv"], delta, dq_accum,
        causal=causal, softmax_scale=0.1, window_left=-1, window_right=-1, cu_seqlens_q=cu_q,
        cu_seqlens_k=cu_k, max_seqlen_q=400, max_seqlen_k=400, arch=arch_for_capability((9, 0)),
        kernel="sm90")
    roles = set()
    for launch in launches:
        names = _per_call(launch)
        plan = backward_cache._argument_plan(launch, names, call)
        assert plan is not None and set(plan) == names, launch.kernel
        roles |= {entry[1] for entry in plan.values() if entry[0] == "tensor"}
    assert {"cu_seqlens_q", "cu_seqlens_k"} <= roles


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_fused_backward_arguments_have_their_roles(packed):
    """The fused Hopper backward (dQ by reductions): its descriptors (lse, delta and the dQ
    buffer's too when dense) and the packed call's row tensors map by name."""
    from tileattn.kernels.attention import sm90_bwd_fused
    if packed:
        q = torch.empty(701, 4, 128, dtype=torch.bfloat16)
        k = torch.empty(650, 2, 128, dtype=torch.bfloat16)
        lse = torch.empty(4, 701)
        cu_q = torch.tensor([0, 301, 701], dtype=torch.int32)
        cu_k = torch.tensor([0, 250, 650], dtype=torch.int32)
        rows = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=400, max_seqlen_k=400)
    else:
        q = torch.empty(2, 300, 4, 128, dtype=torch.bfloat16)
        k = torch.empty(2, 280, 2, 128, dtype=torch.bfloat16)
        lse = torch.empty(2, 4, 300)
        rows = {}
    v, out, dout = torch.empty_like(k), torch.empty_like(q), torch.empty_like(q)
    delta, dq_accum = bwd.backward_workspace(q, lse, False)
    call = dict(q=q, k=k, v=v, out=out, lse=lse, dout=dout, dlse=None, dq=torch.empty_like(q),
                dk=torch.empty_like(k), dv=torch.empty_like(v), delta=delta, dq_accum=dq_accum,
                cu_seqlens_q=rows.get("cu_seqlens_q"), cu_seqlens_k=rows.get("cu_seqlens_k"))
    launches = bwd.backward_launches(
        q, k, v, out, lse, dout, call["dq"], call["dk"], call["dv"], delta, dq_accum,
        causal=True, softmax_scale=0.1, window_left=-1, window_right=-1,
        arch=arch_for_capability((9, 0)), kernel="sm90", **rows)
    fused = [x for x in launches if x.kernel is sm90_bwd_fused.attention_bwd_fused_sm90_kernel]
    # Dense calls: key block 0 stores dQ (one launch), the other blocks add to it (the next).
    assert [(x.constexprs["DQ_STORE"], x.args["first_key_block"], x.grid[0]) for x in fused] == [
        (False, 0, 4 if packed else 3)]
    # Without a mask, dense calls run key block 0 (storing dQ), then the others (adding to it).
    split = bwd.backward_launches(
        q, k, v, out, lse, dout, call["dq"], call["dk"], call["dv"], delta, dq_accum,
        causal=False, softmax_scale=0.1, window_left=-1, window_right=-1,
        arch=arch_for_capability((9, 0)), kernel="sm90", **rows)
    fused = [x for x in split if x.kernel is sm90_bwd_fused.attention_bwd_fused_sm90_kernel]
    assert [(x.constexprs["DQ_STORE"], x.args["first_key_block"], x.grid[0]) for x in fused] == (
        [(False, 0, 4)] if packed else [(True, 0, 1), (False, 1, 2)])
    assert split[0].args["zero_rows"] == (400 if packed else 0)
    descriptors = set()
    for launch in launches:
        names = _per_call(launch)
        plan = backward_cache._argument_plan(launch, names, call)
        assert plan is not None and set(plan) == names, launch.kernel
        descriptors |= {name for name, entry in plan.items() if entry[0] == "descriptor"}
    # Packed lse and delta rows are read by the loader warp through their pointers.
    expected = {"q_desc", "k_desc", "v_desc", "do_desc", "dq_desc"}
    assert descriptors == (expected if packed else expected | {"lse_desc", "delta_desc"})
