"""Third-party checks through the ``ddpdoctor.checks`` entry points: the registry's rules, the
plugin event registration and the plugin API module, on fake entry points."""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

import ddpdoctor.analysis.registry as registry
from ddpdoctor import plugin
from ddpdoctor.analysis.api import Check, CheckResult
from ddpdoctor.schema import events
from ddpdoctor.schema.probes import ALL_CHECKS, checks_affected

BUILTINS = [ep for ep in importlib.metadata.entry_points(group=registry.GROUP) if registry.is_builtin(ep)]


@dataclass
class FakeEntryPoint:
    name: str
    value: str
    target: Any  # what load() returns, or the exception it raises

    def load(self) -> Any:
        if isinstance(self.target, Exception):
            raise self.target
        return self.target


def check(check_id: str, **fields: Any) -> Check:
    return Check(id=check_id, title=check_id.title(), docs="", analyze=lambda e: CheckResult(), **fields)


@pytest.fixture
def installed(monkeypatch):
    """installed(*fake entry points): the built-ins plus these, as entry_points() returns them."""
    monkeypatch.delenv(registry.DISABLE_PLUGINS_ENV, raising=False)

    def install(*fakes: FakeEntryPoint) -> None:
        monkeypatch.setattr(registry, "entry_points",
                            lambda group: [*fakes, *BUILTINS] if group == registry.GROUP else [])

    return install


def by_id(loaded: list[registry.LoadedCheck]) -> dict[str, registry.LoadedCheck]:
    return {c.id: c for c in loaded}


def test_a_plugin_loads_after_the_builtins(installed):
    installed(FakeEntryPoint("acme-thing", "acme:CHECK", check("acme-thing", probe="acme:install")))
    loaded = registry.load_checks()
    assert len(BUILTINS) == 15
    assert [c.id for c in loaded][-1] == "acme-thing"
    assert all(c.error is None for c in loaded)
    assert loaded[-1].check.probe == "acme:install"


def test_a_plugin_reusing_a_builtin_id_is_broken_and_the_builtin_stays(installed):
    installed(FakeEntryPoint("gradient-sync", "acme:CHECK", check("gradient-sync")))  # listed before the built-ins
    loaded = by_id(registry.load_checks())
    assert loaded["gradient-sync"].error is None
    assert loaded["gradient-sync"].check.analyze.__module__ == "ddpdoctor.checks.gradient_sync"
    duplicate = loaded["gradient-sync (acme:CHECK)"]
    assert duplicate.check is None
    assert duplicate.error == ("duplicate check id 'gradient-sync': ddpdoctor.checks.gradient_sync:CHECK "
                               "already provides it")


def test_two_plugins_with_one_id_keep_the_first(installed):
    installed(FakeEntryPoint("acme-thing", "acme:CHECK", check("acme-thing")),
              FakeEntryPoint("acme-thing", "other:CHECK", check("acme-thing")))
    loaded = by_id(registry.load_checks())
    assert loaded["acme-thing"].error is None
    assert "already provides it" in loaded["acme-thing (other:CHECK)"].error


def test_the_same_entry_point_seen_twice_is_one_check(installed):
    same = FakeEntryPoint("acme-thing", "acme:CHECK", check("acme-thing"))
    installed(same, same)
    assert [c.id for c in registry.load_checks()].count("acme-thing") == 1
    assert all(c.error is None for c in registry.load_checks())


def test_an_entry_point_name_other_than_the_id_is_broken(installed):
    installed(FakeEntryPoint("acme-thing", "acme:CHECK", check("acme-other")))
    broken = by_id(registry.load_checks())["acme-thing"]
    assert broken.check is None
    assert broken.error == ("entry point 'acme-thing' differs from the check's id 'acme-other'; "
                            "register it as acme-other = acme:CHECK")


def test_an_unsupported_api_version_is_broken(installed):
    installed(FakeEntryPoint("acme-thing", "acme:CHECK", check("acme-thing", api_version=2)))
    broken = by_id(registry.load_checks())["acme-thing"]
    assert broken.check is None
    assert broken.error == "written for check API version 2; this ddpdoctor supports version 1"


@pytest.mark.parametrize("target, error", [
    (ImportError("no module named acme"), "ImportError: no module named acme"),
    ("not a check", "TypeError: acme:CHECK is a str, not a ddpdoctor.Check"),
    (check("acme-thing", probe="acme.install"), "probe 'acme.install' is not a \"module:function\" path"),
])
def test_a_plugin_that_cannot_be_used_is_broken_not_fatal(installed, target, error):
    installed(FakeEntryPoint("acme-thing", "acme:CHECK", target))
    loaded = by_id(registry.load_checks())
    assert loaded["acme-thing"].check is None and loaded["acme-thing"].error == error
    assert sum(c.error is None for c in loaded.values()) == 15


def test_disable_plugins_loads_the_builtins_only(installed, monkeypatch):
    installed(FakeEntryPoint("acme-thing", "acme:CHECK", check("acme-thing")),
              FakeEntryPoint("acme-broken", "acme:BROKEN", ImportError("x")))
    monkeypatch.setenv(registry.DISABLE_PLUGINS_ENV, "1")
    assert {c.id for c in registry.load_checks()} == {ep.name for ep in BUILTINS}
    monkeypatch.setenv(registry.DISABLE_PLUGINS_ENV, "0")
    assert "acme-thing" in by_id(registry.load_checks())


def test_plugins_only_skips_importing_the_builtins_but_keeps_their_ids(installed):
    builtins = [FakeEntryPoint(ep.name, ep.value, AssertionError("a built-in was imported")) for ep in BUILTINS]
    installed(*builtins, FakeEntryPoint("acme-thing", "acme:CHECK", check("acme-thing")),
              FakeEntryPoint("set-epoch", "acme:EPOCH", check("set-epoch")))
    loaded = registry.load_checks(builtins=False)
    assert [c.id for c in loaded] == ["acme-thing", "set-epoch (acme:EPOCH)"]
    assert loaded[1].check is None


def test_a_plugin_probe_failure_leaves_only_its_own_check_incomplete():
    declared = {c.id: c.check.probes for c in registry.load_checks() if c.check is not None}
    assert checks_affected("acme-thing", declared) == ("acme-thing",)
    assert checks_affected("lifecycle", declared) == (ALL_CHECKS,)
    assert checks_affected("data", declared) == ("sampler-disjoint", "set-epoch", "uneven-inputs")
    assert checks_affected("flight-recorder-dump", declared) == ()


def test_the_built_in_order_is_each_checks_declared_order():
    loaded = [c for c in registry.load_checks() if c.check is not None]
    assert [c.check.order for c in loaded] == sorted(c.check.order for c in loaded)
    assert loaded[0].id == "gradient-sync" and len({c.check.order for c in loaded}) == len(loaded)


@dataclass(kw_only=True, slots=True)
class Thing(events.Event):
    kind: ClassVar[str] = "acme.thing"
    count: int = 0


def test_a_registered_plugin_event_loads_typed(monkeypatch):
    monkeypatch.setattr(events, "EVENT_KINDS", dict(events.EVENT_KINDS))
    assert isinstance(events.event_from_json({"kind": "acme.thing", "count": 3}), events.UnknownEvent)
    assert events.register_event(Thing) is Thing
    loaded = events.event_from_json({"kind": "acme.thing", "count": 3, "rank": 1, "extra": "dropped"})
    assert loaded == Thing(count=3, rank=1)
    assert events.event_from_json(loaded.to_json()) == loaded


def test_registering_an_existing_kind_or_a_bare_kind_is_refused(monkeypatch):
    monkeypatch.setattr(events, "EVENT_KINDS", dict(events.EVENT_KINDS))
    events.register_event(Thing)
    with pytest.raises(ValueError, match="'acme.thing' is already registered by .*Thing"):
        events.register_event(Thing)

    @dataclass(kw_only=True, slots=True)
    class Bare(events.Event):
        kind: ClassVar[str] = "thing"

    with pytest.raises(ValueError, match="namespaced kind"):
        events.register_event(Bare)

    @dataclass(kw_only=True, slots=True)
    class Builtin(events.Event):
        kind: ClassVar[str] = "step"

    with pytest.raises(ValueError, match="namespaced kind"):
        events.register_event(Builtin)
    with pytest.raises(TypeError, match="not a dataclass subclass"):
        events.register_event(dict)  # type: ignore[arg-type]


def test_the_plugin_module_exports_the_versioned_api():
    assert plugin.CHECK_API_VERSION == 1
    assert set(plugin.__all__) >= {"Check", "CheckResult", "Finding", "Location", "Severity", "CHECK_API_VERSION",
                                   "Event", "register_event"}
    assert all(hasattr(plugin, name) for name in plugin.__all__)
    assert check("acme-thing").api_version == 1 and check("acme-thing").probe is None
