"""Row fingerprints: equal rows hash equal wherever they sit; the script's computation is untouched."""

from __future__ import annotations

import torch

from ddpdoctor.rank.probes.content import first_tensor
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
