"""Nothing a probe does prints a warning into the script's output: the optimizer probe's walk over
live objects (naming parameters outside DDP) must not touch torch.distributed.reduce_op, whose
every attribute access warns (an isinstance() mismatch reads ``__class__``)."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

import torch.distributed  # noqa: E402,F401,F811  (defines the deprecated reduce_op object)

from ddpdoctor.rank.probes.optimizer import _names_from_live_modules  # noqa: E402


def test_naming_parameters_from_live_modules_warns_about_nothing():
    model = torch.nn.Linear(2, 2)
    wanted = {id(p): name for name, p in model.named_parameters()}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a FutureWarning would raise here
        names = _names_from_live_modules(set(wanted))
    assert names == wanted
