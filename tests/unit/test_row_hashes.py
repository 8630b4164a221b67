"""Row fingerprints: equal rows hash equal wherever they sit; the script's computation is untouched."""

from __future__ import annotations

import torch

from ddpdoctor.rank.probes.content import first_tensor
from ddpdoctor.rank import row_hashes as module
from ddpdoctor.rank.row_hashes import MAX_ROWS, row_hashes


def test_the_same_row_hashes_the_same_in_any_batch_and_position():
    x = torch.randn(64, 1, 28, 28)
    hashes = row_hashes(x)
    assert len(set(hashes)) == 64 and all(0 <= h < 2**63 for h in hashes)
    assert row_hashes(x[10:13]) == hashes[10:13]
    assert row_hashes(x.flip(0)) == hashes[::-1]
    assert row_hashes(x.clone().contiguous(memory_format=torch.channels_last)) == hashes


def test_any_change_to_a_row_changes_its_hash():
    x = torch.randn(8, 300)
    y = x.clone()
    y[3, 17] = torch.nextafter(y[3, 17], torch.tensor(1e9))
    a, b = row_hashes(x), row_hashes(y)
    assert a[3] != b[3] and a[:3] == b[:3] and a[4:] == b[4:]


def test_dtypes_and_wide_rows():
    assert len(set(row_hashes(torch.randint(0, 50_000, (16, 256))))) == 16
    assert len(set(row_hashes(torch.randn(4, 8, dtype=torch.bfloat16)))) == 4
    assert len(set(row_hashes(torch.randn(4, 8, dtype=torch.float64)))) == 4
    flags = row_hashes(torch.tensor([[True, False], [True, False]]))
    assert flags[0] == flags[1]
    assert len(row_hashes(torch.randn(2, 3, 224, 224))) == 2
    assert len(row_hashes(torch.randn(4 * MAX_ROWS, 3))) == MAX_ROWS


def test_no_rng_use_no_autograd_and_not_model_outputs():
    state = torch.get_rng_state()
    x = torch.randn(8, 4)
    state_after_randn = torch.get_rng_state()
    row_hashes(x)
    assert torch.equal(torch.get_rng_state(), state_after_randn) and not torch.equal(state, state_after_randn)
    assert row_hashes(torch.randn(8, 4, requires_grad=True)) is None  # a model output, not data
    assert row_hashes(torch.tensor(3.0)) is None


def test_first_tensor_of_a_collated_batch():
    x, y = torch.zeros(2, 3), torch.ones(2)
    assert first_tensor((x, y)) is x
    assert first_tensor({"input_ids": y, "labels": x}) is y
    assert first_tensor([["text"], [x]]) is x
    assert first_tensor(["no tensor"]) is None


def _exact_hashes(batch: torch.Tensor) -> list[int]:
    """The hashes as the module's docstring defines them: each row's bit patterns projected by one
    plain float64 product (exact sums), then mixed (:func:`mix`, in Python's exact integers)."""
    flat = batch.reshape(batch.shape[0], -1)
    width = flat.shape[1]
    bits = flat.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[flat.element_size()])
    if bits.element_size() == 8:
        bits = (bits ^ (bits >> 32)) & 0xFFFFFFFF
    return module.mix((bits.to(torch.float64) @ module._projection(batch.device)[:width]).tolist(), width)


def test_the_hashes_equal_a_plain_projection_and_mix():
    """Negative sums (a float's sign bit read as an int32), sums near 2**52 and every element size,
    through the kept CPU buffer and the transposed projection."""
    batches = [torch.randn(64, 1024), -torch.rand(8, 300) * 1e30, torch.randint(-2**15, 2**15 - 1, (5, 7),
               dtype=torch.int16), torch.randn(4, 1024, dtype=torch.float64), torch.randn(3, 17, dtype=torch.bfloat16),
               torch.randint(0, 256, (6, 9), dtype=torch.uint8), torch.full((2, 1024), -1, dtype=torch.int32)]
    for batch in batches:
        assert row_hashes(batch) == _exact_hashes(batch), batch.dtype
