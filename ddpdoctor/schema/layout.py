"""File names inside an evidence directory: the file channel between ranks and the supervisor.

Each rank process appends its events to ``events-<pid>.jsonl`` and rewrites ``hb-<pid>.json``
every heartbeat; the supervisor writes a token into ``dump-request`` and each rank answers once
per token with ``stack-<pid>.json``.
"""

from __future__ import annotations

import os

EVENTS_GLOB = "events-*.jsonl"
HEARTBEAT_PREFIX = "hb-"
DUMP_REQUEST = "dump-request"


def events_path(directory: str, pid: int) -> str:
    return os.path.join(directory, f"events-{pid}.jsonl")


def heartbeat_path(directory: str, pid: int) -> str:
    return os.path.join(directory, f"{HEARTBEAT_PREFIX}{pid}.json")


def stack_path(directory: str, pid: int) -> str:
    return os.path.join(directory, f"stack-{pid}.json")


def dump_request_path(directory: str) -> str:
    return os.path.join(directory, DUMP_REQUEST)
