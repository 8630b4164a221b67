"""AfterImport runs its callback on the fully imported module, once, and leaves sys.meta_path; the
module's code and the callback can run inside a context (the collector paused for torch's import).
A look-up (``importlib.util.find_spec``, as transformers' ``is_torch_available`` does) is not an
import: the hook stays for the import that follows."""

from __future__ import annotations

import gc
import importlib
import importlib.util
import sys

import pytest

from ddpdoctor.rank.after_import import AfterImport
from ddpdoctor.rank.gc_pause import gc_paused


def _package(tmp_path, name: str) -> None:
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text("def save():\n    return 'original'\n")
    (tmp_path / name / "sub.py").write_text("from . import save\n")


def test_the_callback_runs_on_the_executed_module_and_the_hook_leaves(tmp_path, monkeypatch):
    _package(tmp_path, "fake_dcp_a")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []

    def patch(module):
        seen.append(module.save())
        module.save = lambda: "patched"

    hook = AfterImport("fake_dcp_a", patch)
    sys.meta_path.insert(0, hook)
    try:
        from fake_dcp_a import save  # the patch is in before the name is bound
        assert seen == ["original"]
        assert save() == "patched"
        assert hook not in sys.meta_path
        module = sys.modules["fake_dcp_a"]
        assert "exec_module" not in vars(module.__loader__)  # the loader is left as it was
        importlib.reload(module)  # a reload is the module's own business: no second callback
        assert seen == ["original"]
    finally:
        hook.remove()
        sys.modules.pop("fake_dcp_a", None)


def test_importing_a_submodule_first_patches_the_package(tmp_path, monkeypatch):
    _package(tmp_path, "fake_dcp_b")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    hook = AfterImport("fake_dcp_b", lambda module: seen.append(module.__name__))
    sys.meta_path.insert(0, hook)
    try:
        importlib.import_module("fake_dcp_b.sub")
        assert seen == ["fake_dcp_b"]
    finally:
        hook.remove()
        sys.modules.pop("fake_dcp_b", None)
        sys.modules.pop("fake_dcp_b.sub", None)


def test_a_callback_that_fails_never_breaks_the_import(tmp_path, monkeypatch):
    _package(tmp_path, "fake_dcp_c")
    monkeypatch.syspath_prepend(str(tmp_path))

    def broken(module):
        raise RuntimeError("probe bug")

    hook = AfterImport("fake_dcp_c", broken)
    sys.meta_path.insert(0, hook)
    try:
        assert importlib.import_module("fake_dcp_c").save() == "original"
    finally:
        hook.remove()
        sys.modules.pop("fake_dcp_c", None)


def _module_reporting_gc(tmp_path, name: str, body: str = "") -> None:
    (tmp_path / f"{name}.py").write_text(f"import gc\nGC_DURING_IMPORT = gc.isenabled()\n{body}")


def test_the_module_and_the_callback_run_with_the_collector_paused(tmp_path, monkeypatch):
    _module_reporting_gc(tmp_path, "fake_torch_gc")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    hook = AfterImport("fake_torch_gc", lambda module: seen.append(gc.isenabled()), around=gc_paused).insert()
    try:
        assert gc.isenabled()
        module = importlib.import_module("fake_torch_gc")
        assert module.GC_DURING_IMPORT is False and seen == [False]
        assert gc.isenabled()  # running again once the import returned
    finally:
        hook.remove()
        sys.modules.pop("fake_torch_gc", None)


def test_a_failed_import_restores_the_collector_and_a_disabled_one_stays_off(tmp_path, monkeypatch):
    _module_reporting_gc(tmp_path, "fake_torch_broken", "raise ImportError('broken install')\n")
    _module_reporting_gc(tmp_path, "fake_torch_off")
    monkeypatch.syspath_prepend(str(tmp_path))
    hook = AfterImport("fake_torch_broken", lambda module: None, around=gc_paused).insert()
    try:
        with pytest.raises(ImportError, match="broken install"):
            importlib.import_module("fake_torch_broken")
        assert gc.isenabled()
    finally:
        hook.remove()
        sys.modules.pop("fake_torch_broken", None)
    hook = AfterImport("fake_torch_off", lambda module: None, around=gc_paused).insert()
    gc.disable()  # the script turned the collector off itself
    try:
        importlib.import_module("fake_torch_off")
        assert not gc.isenabled()
    finally:
        gc.enable()
        hook.remove()
        sys.modules.pop("fake_torch_off", None)


def test_a_look_up_before_the_import_leaves_the_hook_for_the_import(tmp_path, monkeypatch):
    _package(tmp_path, "fake_torch_lookup")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    hook = AfterImport("fake_torch_lookup", lambda module: seen.append(module.save())).insert()
    try:
        assert importlib.util.find_spec("fake_torch_lookup") is not None
        assert importlib.util.find_spec("fake_torch_lookup") is not None  # libraries ask more than once
        assert seen == [] and hook in sys.meta_path and "fake_torch_lookup" not in sys.modules
        importlib.import_module("fake_torch_lookup")
        assert seen == ["original"]
        assert hook not in sys.meta_path
    finally:
        hook.remove()
        sys.modules.pop("fake_torch_lookup", None)


def test_a_module_executed_from_a_looked_up_spec_fires_once(tmp_path, monkeypatch):
    """``module_from_spec`` and ``spec.loader.exec_module`` by hand, as lazy importers do, is an import."""
    _package(tmp_path, "fake_torch_manual")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    hook = AfterImport("fake_torch_manual", lambda module: seen.append(module.__name__)).insert()
    try:
        first = importlib.util.find_spec("fake_torch_manual")
        second = importlib.util.find_spec("fake_torch_manual")
        module = importlib.util.module_from_spec(second)
        sys.modules["fake_torch_manual"] = module
        second.loader.exec_module(module)
        assert seen == ["fake_torch_manual"] and hook not in sys.meta_path
        again = importlib.util.module_from_spec(first)
        first.loader.exec_module(again)  # the other spec's loader, run later: no second callback
        assert seen == ["fake_torch_manual"] and again.save() == "original"
        assert "exec_module" not in vars(first.loader) and "exec_module" not in vars(second.loader)
    finally:
        hook.remove()
        sys.modules.pop("fake_torch_manual", None)
