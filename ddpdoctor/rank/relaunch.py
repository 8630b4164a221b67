"""A wrong guess of the launch mode, corrected: relaunch under torchrun.

With ``--launch auto`` the supervisor runs a script whose source calls ``mp.spawn`` as its own
launcher (spawn mode). Scripts such as pytorch/examples' imagenet main.py spawn only when asked
(``--multiprocessing-distributed``) and otherwise read torchrun's variables. Such a launcher
process that reads them (``os.environ["WORLD_SIZE"]``) or sets up its process group from the
environment, before spawning anything, would crash where plain torchrun runs it: the rank says so
to the supervisor, which starts the job again under torchrun.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ddpdoctor.schema import settings

__all__ = ["Relaunch", "expects_torchrun", "missed_torchrun", "ask"]

# What torchrun sets and a spawn launcher has not: a script that reads one of them expects torchrun.
TORCHRUN_VARIABLES = frozenset({"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"})


class Relaunch(BaseException):
    """Raised into the launcher process at its init_process_group: the bootstrap ends it quietly."""


def expects_torchrun(args: tuple, kwargs: dict, *, spawned: bool) -> bool:
    """Whether this init_process_group call reads torchrun's variables in a spawn-mode launcher that
    the supervisor only guessed to be one (and that spawned nothing yet)."""
    if os.environ.get(settings.SPAWN_GUESSED) != "1" or spawned:
        return False
    if "RANK" in os.environ or "WORLD_SIZE" in os.environ:
        return False
    init_method = kwargs.get("init_method", args[1] if len(args) > 1 else None)
    explicit = any(kwargs.get(name) is not None for name in ("store", "rank", "world_size")) or len(args) > 3
    return init_method in (None, "env://") and not explicit


def missed_torchrun(exc: BaseException, *, spawned: bool) -> bool:
    """Whether ``exc``, ending a guessed spawn launcher that spawned nothing, is the script reaching for
    torchrun's variables: ``os.environ["WORLD_SIZE"]`` (KeyError), or env:// rendezvous without them."""
    if os.environ.get(settings.SPAWN_GUESSED) != "1" or spawned:
        return False
    if isinstance(exc, KeyError):
        return bool(exc.args) and exc.args[0] in TORCHRUN_VARIABLES
    text = str(exc)
    return isinstance(exc, ValueError) and "env://" in text and "expected, but not set" in text


def ask(evidence_dir: str, site: list[Any]) -> None:
    """Leave the supervisor the request (with the line that asked for torchrun), then stop the script."""
    with open(os.path.join(evidence_dir, settings.RELAUNCH_UNDER_TORCHRUN), "w") as f:
        json.dump({"site": site}, f)
    raise Relaunch("the script sets up its process group from torchrun's environment: relaunching under torchrun")
