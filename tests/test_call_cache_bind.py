"""The call caches' bound runs (fwd.bind_attention, sm90.bind_attention), on the CPU: the
launch they replay gets every tensor argument from the new call (the new tensors, Hopper
descriptors re-based on them, a packed call's work lists from its own cu_seqlens) and every
other argument as recorded or from the call's scale. A stand-in for the compiled kernel records
the arguments; the GPU tests replay the real ones (tests/gpu)."""

import pytest
import torch

from tileattn.arch import arch_for_capability
from tileattn.kernels import runtime
from tileattn.kernels.attention import fwd, sm90
from tileattn.scheduler import varlen_work_lists


class _Recorder:
    """What BoundLaunch.run hands the compiled kernel: its arguments in order."""
    function = packed_metadata = None

    def __init__(self):
        self.calls = []

    def run(self, *args):
        self.calls.append(args[9:])


def _bound(launch, monkeypatch):
    """launch.bind() as a BoundLaunch over a recorder instead of the compiled kernel."""
    recorder = _Recorder()
    ordered = [launch.constexprs[name] if name in launch.constexprs else launch.args[name]
               for name in launch.kernel.arg_names]
    bound = runtime.BoundLaunch(recorder, (*launch.grid, 1, 1)[:3], ordered,
                                launch.kernel.arg_names)
    monkeypatch.setattr(launch, "bind", lambda: bound)
    monkeypatch.setattr(runtime, "current_stream_handle", lambda: 0)
    return recorder


def _arguments(launch, recorded) -> dict:
    return dict(zip(launch.kernel.arg_names, recorded))


def _packed(total_q=300, total_k=280, dtype=torch.bfloat16):
    q = torch.randn(total_q, 4, 128).to(dtype)
    k, v = (torch.randn(total_k, 2, 128).to(dtype) for _ in range(2))
    return q, k, v, torch.empty(total_q, 4, 128, dtype=torch.bfloat16), torch.empty(4, total_q)


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_hopper_replays_rebase_descriptors_and_rebuild_lists(packed, monkeypatch):
    cu_q = torch.tensor([0, 100, 300], dtype=torch.int32)
    cu_k = torch.tensor([0, 120, 280], dtype=torch.int32)
    if packed:
        q, k, v, out, lse = _packed()
        sequences = fwd.Sequences(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=200,
                                  max_seqlen_k=160)
    else:
        q, k, v = (torch.randn(2, 200, h, 128).bfloat16() for h in (4, 2, 2))
        out, lse, sequences = torch.empty(2, 200, 4, 128).bfloat16(), torch.empty(2, 4, 200), None
    launch = sm90.attention_sm90_launch(q, k, v, out, lse, 0.1, True, sequences=sequences)
    recorder = _bound(launch, monkeypatch)
    run = sm90.bind_attention(launch)
    new = [torch.randn_like(x) for x in (q, k, v, out)] + [torch.randn_like(lse)]
    new_cu_q = torch.tensor([0, 250, 300], dtype=torch.int32)     # other sequences
    run(*new, None, None, None, 0.25, (), new_cu_q if packed else None, cu_k if packed else None)
    args = _arguments(launch, recorder.calls[0])
    for name, tensor in zip(("q_desc", "k_desc", "v_desc"), new[:3]):
        assert args[name].base.data_ptr() == tensor.data_ptr(), name
        assert args[name].block_shape == launch.args[name].block_shape
        assert launch.args[name].base.data_ptr() != tensor.data_ptr()
    assert args["out_ptr"].data_ptr() == new[3].data_ptr() and args["lse_ptr"] is new[4]
    assert args["softmax_scale_log2"] == pytest.approx(0.25 * 1.4426950408889634)
    if packed:
        assert args["cu_seqlens_q_ptr"] is new_cu_q
        expected = varlen_work_lists(new_cu_q, cu_k, 4, k.shape[-2], launch.args["num_m_blocks"],
                                     launch.constexprs["BLOCK_M"], launch.constexprs["BLOCK_N"],
                                     True, launch.grid[0])
        for name, tensor in zip(("tile_ids_ptr", "tile_starts_ptr", "tile_ends_ptr"), expected):
            assert torch.equal(args[name], tensor), name
    else:
        assert args["tile_ids_ptr"] is launch.args["tile_ids_ptr"]


@pytest.mark.parametrize("paged", [False, True], ids=["packed", "paged"])
def test_portable_varlen_replays_take_the_calls_index_tensors(paged, monkeypatch):
    q, k, v, out, lse = _packed()
    table = torch.zeros(2, 20, dtype=torch.int32) if paged else None
    if paged:
        k, v = (torch.randn(40, 16, 2, 128).bfloat16() for _ in range(2))
    cu = torch.tensor([0, 100, 300], dtype=torch.int32)
    sequences = fwd.Sequences(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=200,
                              max_seqlen_k=200, block_table=table)
    launch = fwd.attention_launch(q, k, v, out, lse, None, None, None, 0.1, True,
                                  arch_for_capability((9, 0)), sequences=sequences)
    recorder = _bound(launch, monkeypatch)
    run = fwd.bind_attention(launch)
    new = [torch.randn_like(x) for x in (q, k, v, out, lse)]
    new_cu_q = torch.tensor([0, 10, 300], dtype=torch.int32)
    new_cu_k = torch.tensor([0, 20, 300], dtype=torch.int32)
    new_table = torch.ones_like(table) if paged else None
    run(*new, None, None, None, 0.5, (), new_cu_q, new_cu_k, new_table)
    args = _arguments(launch, recorder.calls[0])
    for name, tensor in zip(("q_ptr", "k_ptr", "v_ptr", "out_ptr", "lse_ptr"), new):
        assert args[name] is tensor, name
    assert args["cu_seqlens_q_ptr"] is new_cu_q and args["cu_seqlens_k_ptr"] is new_cu_k
    assert args["block_table_ptr"] is new_table
    assert args["softmax_scale_log2"] == pytest.approx(0.5 * 1.4426950408889634)


def test_clear_all_forgets_every_call_cache():
    """call_cache.clear_all empties the forward, varlen and backward caches alike (an A/B that
    toggles a kernel setting must not replay the first variant's launch)."""
    from tileattn.ops import attention as attention_op
    from tileattn.ops import backward_cache
    from tileattn.ops.call_cache import clear_all
    caches = (attention_op._CALLS, attention_op._VARLEN_CALLS, backward_cache.CALLS)
    for number, cache in enumerate(caches):
        cache.put(("test signature", number), lambda: None)
        assert cache.get(("test signature", number)) is not None
    clear_all()
    for number, cache in enumerate(caches):
        assert cache.get(("test signature", number)) is None


class _RawLauncher:
    """Stands in for Triton's compiled C launcher: records the argument list it is given."""

    def __init__(self):
        self.calls = []

    def __call__(self, *args):
        self.calls.append(args)


def _fill_tma_descriptor(pointer, *fields):
    """Stands in for the driver's CUtensorMap: the fields it is filled from, comparable."""
    return ("tensor map", pointer) + tuple(tuple(f) if isinstance(f, list) else f
                                          for f in fields)


def test_direct_launch_hands_the_c_launcher_what_triton_3_6_would(monkeypatch):
    """runtime.DirectLaunch builds the C launcher's argument list once; a call must hand it
    exactly what CudaLauncher.__call__ and its descriptor wrapper build from the same values
    (the new tensors, each descriptor's map filled for its new base, the stream)."""
    import types

    import triton
    from triton.backends.nvidia import driver as nvidia

    monkeypatch.setattr(triton.runtime.driver, "_active", types.SimpleNamespace(
        utils=types.SimpleNamespace(fill_tma_descriptor=_fill_tma_descriptor)))
    q, k, v = (torch.randn(2, 200, h, 128).bfloat16() for h in (4, 2, 2))
    out, lse = torch.empty(2, 200, 4, 128).bfloat16(), torch.empty(2, 4, 200)
    launch = sm90.attention_sm90_launch(q, k, v, out, lse, 0.1, True)
    names = launch.kernel.arg_names
    ordered = [launch.constexprs[name] if name in launch.constexprs else launch.args[name]
               for name in names]
    signature = {i: "tensordesc<bf16>" if runtime.is_tma_descriptor(value) else "i32"
                 for i, value in enumerate(ordered)}
    metas = [dict(swizzle=3, elem_size=2, elem_type=10, block_size=list(value.block_shape),
                  fp4_padded=False) for value in ordered if runtime.is_tma_descriptor(value)]
    raw = _RawLauncher()
    launcher = object.__new__(nvidia.CudaLauncher)
    launcher.__dict__.update(launch=nvidia.wrap_handle_tensordesc(raw, signature, metas),
                             num_ctas=1, global_scratch_size=0, global_scratch_align=1,
                             profile_scratch_size=0, profile_scratch_align=1,
                             launch_cooperative_grid=False, launch_pdl=False)
    compiled = types.SimpleNamespace(run=launcher, function=1234, packed_metadata=(4, 1))
    bound = runtime.BoundLaunch(compiled, (132, 1, 1), ordered, names)
    # q, k, v and out (a dense 16-bit call this short stores O by TMA: sm90.Output)
    assert bound.direct is not None and len(bound.direct.descriptors) == 4
    # The template keeps no tensor of the call it was made from.
    assert not any(isinstance(x, torch.Tensor) for x in bound.direct.template)

    monkeypatch.setattr(runtime, "current_stream_handle", lambda: 77)
    new = dict(out_ptr=torch.empty_like(out), lse_ptr=torch.empty_like(lse),
               softmax_scale_log2=0.5, tile_ids_ptr=launch.args["tile_ids_ptr"].clone(),
               tile_starts_ptr=launch.args["tile_starts_ptr"].clone(), mod_args=())
    # Descriptor slots given as descriptors, or as the tensors to re-base them on.
    as_descriptors = dict(new)
    for name, tensor in (("q_desc", q), ("k_desc", k), ("v_desc", v)):
        new[name] = torch.randn_like(tensor)
        as_descriptors[name] = runtime.rebased_descriptor(launch.args[name], new[name])
    new["o_desc"] = new["out_ptr"]
    as_descriptors["o_desc"] = runtime.rebased_descriptor(launch.args["o_desc"], new["out_ptr"])
    direct = bound.direct
    runs = []
    for values in (new, as_descriptors):
        for path in (direct, None):             # None: CudaLauncher's own path
            bound.direct = path
            bound.run(**values)
            runs.append(raw.calls.pop())
    first = runs[0]
    for other in runs[1:]:
        assert len(first) == len(other)
        for position, (mine, theirs) in enumerate(zip(first, other)):
            assert mine is theirs or mine == theirs, position
    assert first[3] == 77
    assert ("tensor map", new["q_desc"].data_ptr()) == first[
        nvidia._BASE_ARGS_FORMAT_LEN + names.index("q_desc")][:2]


def test_direct_launch_stays_off_for_other_launchers():
    """A launcher not laid out as Triton 3.6's (here a stand-in) keeps CudaLauncher's path."""
    q, k, v = (torch.randn(1, 64, h, 64).bfloat16() for h in (2, 1, 1))
    launch = sm90.attention_sm90_launch(q, k, v, torch.empty(1, 64, 2, 64).bfloat16(), None,
                                        0.1, False)
    ordered = [launch.constexprs[name] if name in launch.constexprs else launch.args[name]
               for name in launch.kernel.arg_names]
    bound = runtime.BoundLaunch(_Recorder(), (1, 1, 1), ordered, launch.kernel.arg_names)
    assert bound.direct is None
