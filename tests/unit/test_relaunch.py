"""A spawn-mode launcher that ddpdoctor only guessed to be one asks for torchrun when it sets up its
process group from torchrun's variables, and only then."""

from __future__ import annotations

import json

import pytest

from ddpdoctor.rank import relaunch
from ddpdoctor.schema import settings


@pytest.fixture
def guessed(monkeypatch):
    monkeypatch.setenv(settings.SPAWN_GUESSED, "1")
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


def test_an_env_init_in_a_guessed_launcher_expects_torchrun(guessed):
    assert relaunch.expects_torchrun(("gloo",), {}, spawned=False)
    assert relaunch.expects_torchrun(("nccl", "env://"), {}, spawned=False)
    assert relaunch.expects_torchrun((), {"backend": "gloo", "init_method": "env://"}, spawned=False)


def test_what_does_not_expect_torchrun(guessed, monkeypatch):
    assert not relaunch.expects_torchrun(("gloo",), {}, spawned=True)  # a spawned worker, or after spawning
    assert not relaunch.expects_torchrun(("gloo", "tcp://127.0.0.1:1234"), {"rank": 0, "world_size": 2},
                                         spawned=False)
    assert not relaunch.expects_torchrun(("gloo",), {"store": object(), "rank": 0, "world_size": 2}, spawned=False)
    assert not relaunch.expects_torchrun(("gloo", None, None, 2, 0), {}, spawned=False)  # positional world, rank
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert not relaunch.expects_torchrun(("gloo",), {}, spawned=False)
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.setenv(settings.SPAWN_GUESSED, "0")  # --launch spawn chosen by the user: never second-guessed
    assert not relaunch.expects_torchrun(("gloo",), {}, spawned=False)


def test_asking_leaves_the_request_and_stops_the_script(tmp_path):
    site = [{"file": "/x/train.py", "line": 12, "function": "worker"}]
    with pytest.raises(relaunch.Relaunch):
        relaunch.ask(str(tmp_path), site)
    assert json.loads((tmp_path / settings.RELAUNCH_UNDER_TORCHRUN).read_text()) == {"site": site}
    assert not issubclass(relaunch.Relaunch, Exception)  # the script's `except Exception` lets it through


def test_a_guessed_launcher_reaching_for_torchruns_variables_missed_torchrun(guessed):
    assert relaunch.missed_torchrun(KeyError("WORLD_SIZE"), spawned=False)
    assert relaunch.missed_torchrun(ValueError("Error initializing torch.distributed using env:// rendezvous: "
                                               "environment variable RANK expected, but not set"), spawned=False)
    assert not relaunch.missed_torchrun(KeyError("WORLD_SIZE"), spawned=True)
    assert not relaunch.missed_torchrun(KeyError("learning_rate"), spawned=False)
    assert not relaunch.missed_torchrun(ValueError("bad batch"), spawned=False)
