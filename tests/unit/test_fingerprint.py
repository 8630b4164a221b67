"""Fingerprints as word sums: exact values, the power to separate replicas down to the last bit,
any dtype, layout and alignment, and one host copy."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

from ddpdoctor.analysis.compare import differs, group_by_value  # noqa: E402
from ddpdoctor.rank import fingerprint as fp  # noqa: E402
from ddpdoctor.schema.fingerprints import decode_fingerprints, encode_fingerprints  # noqa: E402


def reference(t: torch.Tensor) -> int:
    """The wrapping sum of the tensor's bytes as little-endian 64-bit words, counting from its first
    element at its own storage alignment: what fingerprint() must compute."""
    raw = t.detach().contiguous().reshape(-1).numpy().tobytes() if t.dtype != torch.bfloat16 else \
        t.detach().contiguous().reshape(-1).view(torch.int16).numpy().tobytes()
    size = t.element_size()
    per_word = max(1, 8 // size)
    head = (-t.storage_offset()) % per_word if t.is_contiguous() else 0
    head_bytes, body = raw[:head * size], raw[head * size:]
    words = len(body) // 8
    total = int(np.frombuffer(body[:words * 8], dtype="<u8").astype(object).sum()) if words else 0
    small = {1: "<u1", 2: "<i2", 4: "<i4", 8: "<i8"}[size]
    for edge in (head_bytes, body[words * 8:]):
        total += int(np.frombuffer(edge, dtype=small).astype(object).sum()) if edge else 0
    total %= 2 ** 64
    return total - 2 ** 64 if total >= 2 ** 63 else total


def test_word_sums_of_every_dtype_match_the_bytes():
    tensors = [torch.randn(7, 5), torch.randn(6, dtype=torch.float64), torch.arange(11, dtype=torch.int64),
               torch.randn(9).to(torch.bfloat16), torch.randn(5, dtype=torch.float16),
               torch.tensor([True, False, True])]
    assert fp.fingerprint(tensors) == [[reference(t)] for t in tensors]


def test_views_at_any_offset_and_non_contiguous_tensors():
    flat = torch.randn(101)
    views = [flat[1:50], flat[3:98], flat[50:].view(3, 17)]  # bucket views at odd float32 offsets
    assert fp.fingerprint(views) == [[reference(v)] for v in views]
    transposed = torch.randn(6, 4).t()
    assert fp.fingerprint([transposed]) == fp.fingerprint([transposed.contiguous()])


def test_missing_empty_and_complex_tensors():
    values = fp.fingerprint([None, torch.empty(0), torch.tensor([3 + 4j])])
    assert values == [None, [0], [reference(torch.view_as_real(torch.tensor([3 + 4j])))]]


def test_identical_replicas_agree_and_the_last_bit_separates_them():
    torch.manual_seed(0)
    weights = [torch.randn(1000, 1000), torch.randn(1000)]
    base = fp.fingerprint(weights)
    assert fp.fingerprint([w.clone() for w in weights]) == base
    last_bit = weights[0].clone()
    last_bit.view(torch.int32)[123, 456] ^= 1  # one ulp of one element in a million
    assert torch.linalg.vector_norm(last_bit) == torch.linalg.vector_norm(weights[0]), "a float norm misses it"
    assert differs(fp.fingerprint([last_bit])[0], base[0])
    flipped = -weights[0]
    assert differs(fp.fingerprint([flipped])[0], base[0]), "a sign flip keeps the norm, not the bits"
    one_sample_off = weights[0].clone()
    one_sample_off[3] += 0.05 * torch.randn(1000)
    assert differs(fp.fingerprint([one_sample_off])[0], base[0])
    assert group_by_value({0: base[0], 1: base[0], 2: fp.fingerprint([last_bit])[0]}) == [[0, 1], [2]]


def test_the_sum_does_not_depend_on_the_thread_count():
    tensor = torch.randn(3_000_001)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = fp.fingerprint([tensor])
        torch.set_num_threads(max(2, threads))
        assert fp.fingerprint([tensor]) == one
    finally:
        torch.set_num_threads(threads)


def test_resolve_copies_several_pending_fingerprints_at_once():
    grads, params = [torch.ones(3), None], [torch.full((2,), -2.0)]
    got_grads, got_params = fp.resolve(fp.start(grads), fp.start(params))
    assert got_grads == [[reference(torch.ones(3))], None]
    assert got_params == [[reference(torch.full((2,), -2.0))]]


def test_the_wire_form_round_trips_and_keeps_missing_values():
    values = [[-(2 ** 63)], None, [2 ** 63 - 1], [0]]
    assert decode_fingerprints(encode_fingerprints(values)) == values


def test_small_tensors_summed_together_match_their_own_sums_in_any_mix():
    """Small aligned tensors go through one concatenated running sum; big, unaligned, missing and
    empty ones beside them keep their own positions and values, including sums that wrap."""
    generator = torch.Generator().manual_seed(1)
    big = torch.randn(fp._SMALL_WORDS * 2 + 2, generator=generator)
    huge_words = torch.full((16,), 2 ** 62, dtype=torch.int64)  # wraps modulo 2**64
    flat = torch.randn(301, generator=generator)
    tensors = [torch.randn(768, generator=generator), big, None, flat[1:200], huge_words, torch.empty(0),
               torch.randn(3, 4, generator=generator).to(torch.bfloat16), torch.tensor([True] * 8), big[2:]]
    expected = [None if t is None else [0] if t.numel() == 0 else [reference(t)] for t in tensors]
    assert fp.fingerprint(tensors) == expected
    assert fp.fingerprint(tensors) == expected, "the cached end positions give the same sums on the next step"
    assert fp.fingerprint(tensors[::-1]) == expected[::-1]


def _sampled_reference(t: torch.Tensor) -> int:
    """Runs of _SAMPLE_RUN words every _SAMPLE_STRIDE words, summed modulo 2**64."""
    words = t.detach().contiguous().reshape(-1).view(torch.int64).numpy().astype(object)
    total = sum(int(words[k:k + fp._SAMPLE_RUN].sum()) for k in range(0, len(words) - fp._SAMPLE_RUN + 1,
                                                                        fp._SAMPLE_STRIDE))
    total %= 2 ** 64
    return total - 2 ** 64 if total >= 2 ** 63 else total


def test_a_sampled_fingerprint_sums_a_strided_sample_of_big_tensors_and_all_of_small_ones():
    generator = torch.Generator().manual_seed(2)
    big = torch.randn(1000, 1000, generator=generator)
    bucket = torch.randn(fp._SMALL_WORDS * 2 + 700, generator=generator)
    view = bucket[2:]  # a bucket view at an 8-byte boundary
    small = torch.randn(300, generator=generator)
    values = fp.start([big, view, small, None], sampled=True).values()
    assert values == [[_sampled_reference(big)], [_sampled_reference(view)], [reference(small)], None]
    assert values[0] != fp.fingerprint([big])[0], "a sample, not the full sum"


def test_a_tensors_shape_does_not_change_its_fingerprints_full_or_sampled():
    """Rows of whole words are summed in the tensor's own shape (no reshape); other rows are
    flattened first. Either way the words, and their samples through the storage, are the same."""
    generator = torch.Generator().manual_seed(3)
    storage = torch.randn(2 + 40 * 33 * 64, generator=generator)
    shaped = [storage[2:].view(40, 33, 64),  # rows of 256 bytes, at an 8-byte offset in a bucket
              torch.randn(6, 3, generator=generator),  # rows of 12 bytes: flattened
              torch.randn(fp._SMALL_WORDS, 6, generator=generator).to(torch.float16),  # rows of 12 bytes, big
              torch.randn(5, 2, generator=generator, dtype=torch.float64)]
    flat = [t.reshape(-1) for t in shaped]
    assert fp.fingerprint(shaped) == fp.fingerprint(flat) == [[reference(t)] for t in flat]
    sampled = fp.start(shaped, sampled=True).values()
    assert sampled == fp.start(flat, sampled=True).values()
    assert sampled[0] == [_sampled_reference(flat[0])] and sampled[2] == [_sampled_reference(flat[2])]
    both = fp.start(shaped, also_sampled=True)
    assert both.values() == fp.fingerprint(flat) and both.sample is not None and both.sample.values() == sampled


def test_a_sampled_fingerprint_separates_the_changes_ddp_bugs_make():
    """What the reduced-gradient snapshot must see: a rank-dependent scaling, rounding drift of one
    ulp spread over the tensor, a sign flip, a few rows rewritten. A change confined to a few elements
    can fall between the samples: that is why the full fingerprint before the step stays."""
    torch.manual_seed(0)
    grad = torch.randn(1024, 1024)
    base = fp.start([grad], sampled=True).values()[0]

    def sampled(t: torch.Tensor) -> list:
        return fp.start([t], sampled=True).values()[0]

    assert sampled(grad.clone()) == base
    assert sampled(grad * 0.5) != base
    drift = grad.clone()
    drift.view(torch.int32)[:, ::7] ^= 1  # one ulp in one element of seven: a different rounding
    assert sampled(drift) != base
    assert sampled(-grad) != base
    rows = grad.clone()
    rows[516:520] = torch.randn(4, 1024)  # four rows of 4 KiB: samples fall every 8 KiB
    assert sampled(rows) != base
    one = grad.clone()
    one.view(-1)[1000] += 1.0  # word 500: between the samples at words 0-15 and 1021-1036
    assert sampled(one) == base and fp.fingerprint([one]) != fp.fingerprint([grad])


def test_a_wrapper_subclass_is_not_fingerprinted_and_breaks_nothing_else():
    from torch.testing._internal.two_tensor import TwoTensor

    plain = torch.arange(8, dtype=torch.float32)
    wrapped = TwoTensor(torch.ones(4), torch.ones(4))
    assert fp.readable(wrapped) is None
    assert fp.fingerprint([plain, wrapped, None]) == [[reference(plain)], None, None]


def _use_fused_stand_in(monkeypatch) -> None:
    """Fused reads on the CPU, by :func:`_fused_by_address`, as a GPU's would be; no plan kept from before."""
    from ddpdoctor.rank import fused_word_sums

    monkeypatch.setattr(fused_word_sums, "DEVICE_TYPES", ("cpu",))
    monkeypatch.setattr(fused_word_sums, "available", lambda: True)
    monkeypatch.setattr(fused_word_sums, "word_sums", _fused_by_address)
    monkeypatch.setattr(fp, "_PLANS", {})


@pytest.mark.parametrize("fused", [False, True], ids=["per-tensor", "fused"])
def test_a_plain_subclass_is_read_as_its_bytes(monkeypatch, fused):
    class Tagged(torch.Tensor):
        pass

    if fused:
        _use_fused_stand_in(monkeypatch)
    t = torch.randn(64)
    for _ in range(2):  # the second call as a step after the first: a subclass's plan is made anew
        assert fp.fingerprint([t.as_subclass(Tagged), torch.nn.Parameter(t.clone())]) == [[reference(t)]] * 2


@pytest.mark.parametrize("fused", [False, True], ids=["per-tensor", "fused"])
def test_a_dtensor_is_fingerprinted_by_its_local_shard_without_a_collective(monkeypatch, fused):
    """Also read by the fused kernel (FSDP2 on a GPU): at its shard's address, not the DTensor's
    (which has none), at every call."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        local = torch.randn(16, 4)
        sharded = torch.nn.Parameter(DTensor.from_local(local, mesh, [Shard(0)]))
        sharded.grad = DTensor.from_local(local * 2, mesh, [Shard(0)])
        assert fp.readable(sharded).data_ptr() == local.data_ptr()  # the shard itself, no copy
        if fused:
            _use_fused_stand_in(monkeypatch)
        for _ in range(2):
            assert fp.fingerprint([sharded, sharded.grad, torch.ones(8)]) == [
                [reference(local)], [reference(local * 2)], [reference(torch.ones(8))]]
    finally:
        dist.destroy_process_group()


def _fused_by_address(device, addresses, sizes, mode, **_):
    """A stand-in for the fused kernel on the CPU that reads the words at the given addresses, as the
    kernel does: a plan with a stale address or size gives the wrong sum here too."""
    import ctypes

    sums = [int(np.ctypeslib.as_array((ctypes.c_int64 * n).from_address(a)).astype(object).sum()) % 2 ** 64
            for a, n in zip(addresses, sizes)]
    out = torch.tensor([s - 2 ** 64 if s >= 2 ** 63 else s for s in sums], dtype=torch.int64)
    return out, (out.clone() if mode == "both" else None)


def test_a_cached_plan_reads_each_calls_tensors_as_they_are_now(monkeypatch):
    """start() keeps how it reads a list of tensors from one call to the next (the same parameters
    come every step, and gradients of the same sizes). Values changed in place, and a tensor at a new
    address, are read anew with the same plan; a tensor resized, seen through a non-contiguous view
    at the same address, or gone, gets a new plan."""
    _use_fused_stand_in(monkeypatch)
    generator = torch.Generator().manual_seed(5)
    tensors = [torch.randn(64, 64, generator=generator), torch.randn(5, generator=generator),  # 20 bytes: per tensor
               torch.randn(8, 6, generator=generator)]

    def check(given):
        want = [[reference(t)] if t is not None else None for t in given]
        assert fp.fingerprint(given) == want
        return want

    first = check(tensors)
    assert len(fp._PLANS) == 1
    tensors[0].mul_(2)  # in place: the same plan, new values
    assert check(tensors) != first and len(fp._PLANS) == 1
    tensors[2].data = torch.randn(8, 6, generator=generator)  # p.data replaced: another address, same plan
    check(tensors)
    assert len(fp._PLANS) == 1
    tensors[0].resize_(32, 64)  # smaller in place: the same address, fewer bytes
    check(tensors)
    square = torch.randn(8, 8, generator=generator)
    check([square, tensors[1]])
    check([square.t(), tensors[1]])  # the same address and size, not contiguous: read per tensor
    check([None, tensors[1], torch.empty(0)])
    assert len(fp._PLANS) == 5
    zero = fp.start([None, torch.empty(0)]).values()
    zero[1].append(1)  # a consumer's change to a value stays its own
    assert fp.start([None, torch.empty(0)]).values() == [None, [0]]
