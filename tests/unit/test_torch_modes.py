"""Probe code runs outside torch function modes (rank/torch_modes.py): a mode of the script's sees the
script's own torch calls, as many with every probe installed and every step fingerprinted as without
ddpdoctor, and the evidence is the same with the script's mode on or off."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

from ddpdoctor.rank.torch_modes import outside_torch_modes
from one_rank import run_one_rank

_SCRIPT = textwrap.dedent("""
    import json, os, sys
    probed, counted = sys.argv[1] == "probes", sys.argv[2] == "counted"
    if probed:
        from ddpdoctor.rank import probes
        from ddpdoctor.rank.recorder import Recorder
        from ddpdoctor.schema.settings import RankSettings
        rec = Recorder(RankSettings(evidence_dir=os.environ["EVIDENCE"], fingerprint_every=1, device="native"))
        finish = probes.install(rec)
    import torch
    import torch.distributed as dist
    from torch.overrides import TorchFunctionMode
    from torch.utils.data import DataLoader, TensorDataset

    class Counting(TorchFunctionMode):  # the script's own mode, as a profiler or a device context is
        calls = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            Counting.calls += 1
            return func(*args, **(kwargs or {}))

    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                                                          torch.nn.Linear(16, 3)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(96, 8), torch.randint(0, 3, (96,)))
    mode = Counting()
    for x, y in DataLoader(data, batch_size=16):
        if counted:  # the steps: a DataLoader's pass calls the dataset's __len__ for the probes, the script's code
            mode.__enter__()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if counted:
            mode.__exit__(None, None, None)
    print(json.dumps({"calls": Counting.calls}))
    if probed:
        finish()
        rec.close()
    dist.destroy_process_group()
""")


def _run(tmp_path, probed: bool, counted: bool) -> tuple[int, dict[str, list[dict]]]:
    """The script above: the calls its mode saw, and its evidence by kind (without what varies run to run)."""
    stdout, events = run_one_rank(_SCRIPT, "probes" if probed else "plain", "counted" if counted else "quiet",
                                  evidence=tmp_path / f"{probed}-{counted}")
    kinds: dict[str, list[dict]] = {}
    for event in events:
        kinds.setdefault(event["kind"], []).append({k: v for k, v in event.items()
                                                    if k not in {"t", "timing", "pid", "seq"}})
    return json.loads(stdout.strip().splitlines()[-1])["calls"], kinds


def test_the_scripts_own_mode_sees_its_calls_only_and_the_evidence_does_not_change(tmp_path):
    plain_calls, _ = _run(tmp_path, probed=False, counted=True)
    probed_calls, counted = _run(tmp_path, probed=True, counted=True)
    _, quiet = _run(tmp_path, probed=True, counted=False)
    assert plain_calls > 100  # the forwards, losses, backwards and optimizer steps
    assert probed_calls == plain_calls
    steps = counted["step"]
    assert len(steps) == 6 and all(s["grads"] and s["params"] for s in steps) and "probe_error" not in counted
    assert counted == quiet


def test_inside_no_mode_sees_a_call():
    seen: list = []

    class Recording(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with Recording():
        with outside_torch_modes():
            torch.ones(3).sum()
        torch.ones(3).sum()
    assert len(seen) == 2


@pytest.mark.parametrize("factory", [torch.zeros, torch.ones])
def test_a_device_context_of_the_script_does_not_place_a_probes_tensors(factory):
    with torch.device("meta"):
        with outside_torch_modes():
            made = factory(2)
        theirs = factory(2)
    assert made.device.type == "cpu" and theirs.is_meta
