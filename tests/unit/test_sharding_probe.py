"""The sharding probe: fully_shard (1-D and 2-D meshes), FullyShardedDataParallel and replicate()
recorded once per call site at the user's line, with the module's own class and the mesh, when the
script imports them after torch; everything restored at the end. The tensors fully_shard replaced,
seen at the first step of an optimizer built before it. One process, a world of 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent("""
    import json, sys
    from ddpdoctor.rank import probes
    from ddpdoctor.rank.recorder import Recorder
    from ddpdoctor.schema.settings import RankSettings

    rec = Recorder(RankSettings.from_env())
    finish = probes.install(rec)
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard
    from torch.distributed._composable.replicate import replicate
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    for layer in model:
        fully_shard(layer)  # once for the loop
    fully_shard(model, reshard_after_forward=False)
    mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("replicate", "shard"))
    fully_shard(nn.Linear(4, 4), mesh=mesh)
    FullyShardedDataParallel(nn.Linear(4, 4), device_id=torch.device("cpu"))
    replicate(nn.Linear(4, 4))
    dist.destroy_process_group()
    finish()
    import torch.distributed.fsdp as fsdp
    print(json.dumps({"restored": not hasattr(fsdp.fully_shard, "__ddpdoctor_wrapped__")}))
    rec.close()
""")


def test_each_sharding_call_is_recorded_at_its_line_with_its_mesh(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "DDPDOCTOR_EVIDENCE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=True,
                         env=env, cwd=tmp_path).stdout
    assert json.loads(out.strip().splitlines()[-1]) == {"restored": True}
    events = [json.loads(line) for f in tmp_path.glob("events-*.jsonl") for line in f.read_text().splitlines()]
    assert not [e for e in events if e.get("kind") == "probe_error"], events
    found = [(e["api"], e["module"], e["mesh_shape"], e["mesh_dims"], e["hybrid"], e["reshard_after_forward"],
              e["sharding_strategy"], e["site"][0]["line"]) for e in events if e.get("kind") == "sharded_wrap"]
    assert found == [
        ("fully_shard", "Linear", [1], [""], False, None, None, _line("fully_shard(layer)")),
        ("fully_shard", "Sequential", [1], [""], False, False, None, _line("fully_shard(model")),
        ("fully_shard", "Linear", [1, 1], ["replicate", "shard"], True, None, None, _line("mesh=mesh")),
        # FSDP1 on a world of 1 falls back to NO_SHARD itself: the strategy as FSDP resolved it.
        ("FullyShardedDataParallel", "Linear", [1], [""], False, None, "NO_SHARD",
         _line("FullyShardedDataParallel(nn")),
        ("replicate", "Linear", [1], [""], False, None, None, _line("replicate(nn")),  # DDP over the world
    ]


def _line(text: str, script: str = SCRIPT) -> int:
    (number,) = [i for i, line in enumerate(script.splitlines(), 1) if text in line]
    return number


OPTIMIZER_SCRIPT = textwrap.dedent("""
    from ddpdoctor.rank import probes
    from ddpdoctor.rank.recorder import Recorder
    from ddpdoctor.schema.settings import RankSettings

    rec = Recorder(RankSettings.from_env())
    finish = probes.install(rec)
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    from torch.distributed.fsdp import fully_shard
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    early = torch.optim.AdamW(model.parameters(), lr=0.1)  # before fully_shard
    extra = nn.Linear(2, 2)
    mixed = torch.optim.SGD([*model[1].parameters(), *extra.parameters()], lr=0.1)
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    late = torch.optim.AdamW(model.parameters(), lr=0.1)  # after: correct
    for optimizer in (early, mixed, late):
        model(torch.ones(3, 4)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    dist.destroy_process_group()
    finish()
    rec.close()
""")


def test_an_optimizer_built_before_fully_shard_is_seen_holding_the_replaced_tensors(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(OPTIMIZER_SCRIPT)
    env = {**os.environ, "DDPDOCTOR_EVIDENCE_DIR": str(tmp_path)}
    subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=True, env=env,
                   cwd=tmp_path)
    events = [json.loads(line) for f in tmp_path.glob("events-*.jsonl") for line in f.read_text().splitlines()]
    assert not [e for e in events if e.get("kind") == "probe_error"], events
    types = {e["opt"]: e["type_name"] for e in events if e.get("kind") == "optimizer"}
    assert types == {0: "AdamW", 1: "SGD", 2: "AdamW"}
    found = {e["opt"]: (e["api"], e["positions"], e["names"], e["shapes"], [s[0]["line"] for s in e["sites"]])
             for e in events if e.get("kind") == "replaced_params"}
    layers = _line("fully_shard(layer)", OPTIMIZER_SCRIPT)
    assert found == {
        # Named as the model names the parameters that took their place, with the shapes they had.
        0: ("fully_shard", [0, 1, 2, 3], ["0.weight", "0.bias", "1.weight", "1.bias"], [[4, 4], [4], [2, 4], [2]],
            [layers]),
        1: ("fully_shard", [0, 1], ["1.weight", "1.bias"], [[2, 4], [2]], [layers]),  # not the unsharded extra
    }  # and nothing for the optimizer built after fully_shard
