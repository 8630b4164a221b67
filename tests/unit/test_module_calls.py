"""The DDP probes watch the calls of the module DDP wraps without leaving anything on it: the
instance pickles, deep-copies, scripts and exports as if ddpdoctor were not there, a copy's
calls are not the original's, tracers' calls are not the job's, and the class gets its own
``__call__`` back at the end."""

from __future__ import annotations

import copy
import gc
import pickle

import torch
import torch.nn as nn

from ddpdoctor.rank.probes import module_calls
from ddpdoctor.rank.probes.sidetable import SideTable


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class Callable_(nn.Module):
    """A module with a __call__ of its own (some libraries wrap the call to add behaviour)."""

    def __call__(self, *args, **kwargs):
        return super().__call__(*args, **kwargs) * 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


def _watched(module: nn.Module) -> list:
    seen: list = []
    assert module_calls.watch(module, lambda m, args, kwargs: seen.append((m, args, kwargs)))
    return seen


def test_every_call_of_the_instance_is_seen_with_its_arguments():
    net = Net()
    seen = _watched(net)
    try:
        x = torch.randn(3, 4)
        net(x)
        net(x=x)
        assert [(m is net, len(a), sorted(k)) for m, a, k in seen] == [(True, 1, []), (True, 0, ["x"])]
    finally:
        module_calls.unwatch_all()


def test_nothing_is_left_on_the_instance_and_copies_are_not_watched():
    net = Net()
    seen = _watched(net)
    try:
        for name in ("_forward_pre_hooks", "_forward_hooks", "_forward_pre_hooks_with_kwargs"):
            assert not getattr(net, name)
        assert not [k for k in vars(net) if "ddpdoctor" in k]
        twin = copy.deepcopy(net)
        clone = pickle.loads(pickle.dumps(net))
        twin(torch.randn(2, 4))
        clone(torch.randn(2, 4))
        assert seen == []  # the copies' calls are theirs, not the watched module's
        other = Net()
        other(torch.randn(2, 4))  # another instance of the shimmed class
        assert seen == []
    finally:
        module_calls.unwatch_all()


def test_torchscript_and_export_see_the_module_as_it_was_and_are_not_forwards():
    net = Net().eval()
    grad_enabled: list[bool] = []
    module_calls.watch(net, lambda m, args, kwargs: grad_enabled.append(torch.is_grad_enabled()))
    try:
        x = torch.randn(2, 4)
        scripted = torch.jit.script(net)
        traced = torch.jit.trace(net, (x,))
        exported = torch.export.export(net, (x,))
        fx = torch.fx.symbolic_trace(net)
        # Tracing and compiling are not calls of the job; jit.trace checks its trace with one eager call
        # of the module under no_grad, which the DDP probes ignore as they ignore any evaluation forward.
        assert grad_enabled == [False]
        with torch.no_grad():
            expected = net(x)
            for other in (scripted, traced, exported.module(), fx):
                assert torch.allclose(other(x), expected)
        assert grad_enabled == [False, False]
    finally:
        module_calls.unwatch_all()


def test_a_class_with_its_own_call_keeps_it_and_gets_it_back():
    module = Callable_()
    own = Callable_.__dict__["__call__"]
    seen = _watched(module)
    try:
        assert torch.equal(module(torch.zeros(1)), torch.full((1,), 2.0))
        assert len(seen) == 1
    finally:
        module_calls.unwatch_all()
    assert Callable_.__dict__["__call__"] is own
    assert "__call__" not in vars(Net) and "__call__" not in vars(nn.Sequential)


def test_an_inherited_call_is_restored_by_removing_the_shim():
    net = Net()
    _watched(net)
    assert "__call__" in vars(Net)
    module_calls.unwatch_all()
    assert "__call__" not in vars(Net)
    assert Net.__call__ is nn.Module.__call__


def test_a_subclass_of_a_shimmed_class_calls_through_one_shim():
    class Sub(Net):
        pass

    base, sub = Net(), Sub()
    seen_base = _watched(base)
    seen_sub = _watched(sub)
    try:
        sub(torch.randn(2, 4))
        base(torch.randn(2, 4))
        assert len(seen_sub) == 1 and len(seen_base) == 1
        assert "__call__" not in vars(Sub)  # the base's shim serves it
    finally:
        module_calls.unwatch_all()


def test_a_failing_callback_never_breaks_the_call():
    net = Net()

    def broken(module, args, kwargs):
        raise RuntimeError("probe bug")

    module_calls.watch(net, broken)
    try:
        assert net(torch.randn(2, 4)).shape == (2, 2)
    finally:
        module_calls.unwatch_all()


def test_a_side_table_forgets_collected_objects_and_ignores_equality():
    class Equal:
        def __eq__(self, other):
            return True

        __hash__ = None  # unhashable, as a class defining __eq__ alone is

    table: SideTable[str] = SideTable()
    first, second = Equal(), Equal()
    assert table.set(first, "first") and table.set(second, "second")
    assert table.get(first) == "first" and table.get(second) == "second"
    assert not table.set(1, "an int takes no weak reference") and table.get(1) is None
    del first
    gc.collect()
    assert len(table) == 1 and table.values() == ["second"]
    assert table.pop(second) == "second" and second not in table
