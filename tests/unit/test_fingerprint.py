"""Fingerprints in fused kernels: the values, the comparison power, mixed tensors, one host copy."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ddpdoctor.analysis.compare import differs  # noqa: E402
from ddpdoctor.rank import fingerprint as fp  # noqa: E402


def test_norm_and_max_per_tensor():
    a, b = torch.tensor([3.0, -4.0]), torch.tensor([[1.0, 2.0], [2.0, -0.5]])
    assert fp.fingerprint([a, b]) == [[5.0, 3.0], [pytest.approx(3.0413812651), 2.0]]


def test_missing_empty_integer_complex_and_low_precision_tensors():
    values = fp.fingerprint([None, torch.empty(0), torch.tensor([3, 4]), torch.tensor([3 + 4j]),
                             torch.tensor([3.0, 4.0], dtype=torch.bfloat16)])
    assert values == [None, [0.0, 0.0], [5.0, 4.0], [5.0, 4.0], [5.0, 4.0]]


def test_identical_tensors_give_bit_identical_values_and_changes_show():
    torch.manual_seed(0)
    weights = [torch.randn(64, 32), torch.randn(32)]
    reference = fp.fingerprint(weights)
    assert fp.fingerprint([w.clone() for w in weights]) == reference
    flipped = fp.fingerprint([-weights[0], weights[1]])
    assert differs(flipped[0], reference[0]), "a sign flip keeps the norm but changes the max"
    one_sample_off = weights[0].clone()
    one_sample_off[3] += 0.05 * torch.randn(32)  # one row of the gradient from a different sample
    assert differs(fp.fingerprint([one_sample_off])[0], reference[0])


def test_resolve_copies_several_pending_fingerprints_at_once():
    grads, params = [torch.ones(3), None], [torch.full((2,), -2.0)]
    got_grads, got_params = fp.resolve(fp.start(grads), fp.start(params))
    assert got_grads == [[pytest.approx(3 ** 0.5), 1.0], None]
    assert got_params == [[pytest.approx(8 ** 0.5), -2.0]]


def test_float64_and_float32_in_one_call_are_grouped():
    values = fp.fingerprint([torch.tensor([1.0], dtype=torch.float64), torch.tensor([2.0]), torch.tensor([-1.0])])
    assert values == [[1.0, 1.0], [2.0, 2.0], [1.0, -1.0]]
