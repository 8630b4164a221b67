"""The collector is paused while torch and torch._dynamo import under the probes, and only then: no
automatic collection runs inside either import, and the script's collector works as before. What
torch's import made is frozen; nothing the script made is, not even by the later torch._dynamo import,
whose survivors reach the old generation before the script trains."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap

import pytest

from ddpdoctor.rank.gc_pause import gc_paused
from one_rank import free_port

SCRIPT = textwrap.dedent("""
    import gc, json, os, sys, weakref
    from ddpdoctor.rank import probes
    from ddpdoctor.rank.recorder import Recorder
    from ddpdoctor.schema.settings import RankSettings

    during = {"torch": 0, "torch._dynamo": 0}
    def count(phase, info):
        for name in during:
            module = sys.modules.get(name)
            if phase == "start" and module is not None and getattr(module.__spec__, "_initializing", False):
                during[name] += 1
    gc.callbacks.append(count)
    rec = Recorder(RankSettings.from_env())
    finish = probes.install(rec)
    import torch
    import torch.distributed as dist
    seen = {"enabled_after_import": gc.isenabled()}
    frozen_by_import = gc.get_freeze_count()
    scripts_tensor = torch.randn(3)  # made before the DDP constructor imports torch._dynamo
    cycle = [scripts_tensor]
    cycle.append(cycle)
    tensor_ref = weakref.ref(scripts_tensor)
    dist.init_process_group("gloo", rank=0, world_size=1)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
    seen["young_after_ddp"] = len(gc.get_objects(0)) + len(gc.get_objects(1))
    # A training loop's churn, until the middle generation has been collected 15 times: no full
    # collection. (The collector runs one once 10 middle ones have moved a quarter of what the last
    # full one counted to the old generation; with no full one since torch's import, that count is
    # stale, and the loop ran one: 55 ms in a GPT's training loop.)
    class Node:
        pass
    stats = gc.get_stats()
    middle, full, batch, rounds = stats[1]["collections"], stats[2]["collections"], [], 0
    while gc.get_stats()[1]["collections"] - middle < 15 and rounds < 100_000:
        batch = [Node() for _ in range(1000)]
        rounds += 1
    del batch
    seen["middle_collections_15"] = gc.get_stats()[1]["collections"] - middle >= 15
    seen["full_collections_in_loop"] = gc.get_stats()[2]["collections"] - full
    model(torch.randn(2, 4)).sum().backward()
    seen["enabled_after_ddp"] = gc.isenabled()
    seen["torch_frozen"] = frozen_by_import > 100_000
    seen["froze_more_later"] = gc.get_freeze_count() > frozen_by_import  # frees count it down
    del scripts_tensor, cycle
    gc.collect()
    seen["scripts_cycle_collected"] = tensor_ref() is None
    seen["dynamo_imported"] = "torch._dynamo" in sys.modules
    before = gc.get_stats()[0]["collections"]
    junk = [[i] for i in range(20000)]
    seen["collects_after"] = gc.get_stats()[0]["collections"] > before
    seen["during"] = during
    dist.destroy_process_group()
    finish()
    rec.close()
    print(json.dumps(seen))
""")


def test_no_collection_runs_inside_torchs_imports_torchs_objects_are_frozen_and_the_collector_runs_after(tmp_path):
    env = {**os.environ, "DDPDOCTOR_EVIDENCE_DIR": str(tmp_path), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port())}
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    during = seen.pop("during")
    # torch._dynamo's import left 200,000 objects in the young generations, for a collection in the
    # training loop to scan (65 ms): they are in the old one by the time DDP's constructor returns
    assert seen.pop("young_after_ddp") < 20_000
    assert seen == {"enabled_after_import": True, "enabled_after_ddp": True, "dynamo_imported": True,
                    "collects_after": True, "torch_frozen": True, "froze_more_later": False,
                    "scripts_cycle_collected": True, "middle_collections_15": True, "full_collections_in_loop": 0}
    # At most the one collection that runs as the pause ends, while importlib still marks the module
    # as importing; unpaused, each import runs hundreds.
    assert during["torch"] <= 1 and during["torch._dynamo"] <= 1, during


def test_freezing_happens_only_when_the_block_completes():
    before = gc.get_freeze_count()
    try:
        with pytest.raises(ImportError):
            with gc_paused(freeze=True):
                raise ImportError("a failed import is left as it was")
        assert gc.get_freeze_count() == before
        with gc_paused():
            pass
        assert gc.get_freeze_count() == before
        with gc_paused(freeze=True):
            pass
        assert gc.get_freeze_count() > before
        assert gc.isenabled()
    finally:
        gc.unfreeze()
