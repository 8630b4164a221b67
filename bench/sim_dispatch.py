"""What the device simulation's mode costs a step (issue #34): the torch calls of one training step
that pass through its ``__torch_function__``, by function and by the frame that made them, on the
user-overhead job (bench/workloads/mlp_step.py's MLP with AdamW, batch 64, a DistributedSampler over a
TensorDataset) in one process, the simulation installed through its real entry point and the model
and batches placed on "cuda" as a GPU script places them; and the mode's own cost per call, timed on
a call that does nothing else (``Tensor.is_complex``) with and without it.

    python bench/sim_dispatch.py [--steps 12]

Counts are exact (no timing in them): what the mode's dispatch adds to a step is about the count
times the per-call cost.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time

from common import one_rank_env, overhead_mlp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12, help="steps run; the last one is counted")
    args = parser.parse_args()
    evidence = tempfile.mkdtemp()
    one_rank_env()
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from ddpdoctor.rank import devicesim
    from ddpdoctor.rank.devicesim.mode import CpuDeviceMode
    from ddpdoctor.rank.recorder import Recorder
    from ddpdoctor.schema.settings import RankSettings

    torch.set_num_threads(1)
    counting = [False]
    calls: collections.Counter = collections.Counter()
    dispatch = CpuDeviceMode.__torch_function__

    def counted(self, func, types, args=(), kwargs=None):
        if counting[0]:
            frame = sys._getframe(1)
            while frame is not None and "/torch/" in frame.f_code.co_filename and "/torch/utils/data/" not in \
                    frame.f_code.co_filename and "/torch/optim/" not in frame.f_code.co_filename:
                frame = frame.f_back  # the first frame outside torch's internals (the data and optim packages count)
            where = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}" if frame else "?"
            calls[(getattr(func, "__name__", repr(func)), where)] += 1
        return dispatch(self, func, types, args, kwargs)

    CpuDeviceMode.__torch_function__ = counted  # type: ignore[method-assign]
    finish = devicesim.install(Recorder(RankSettings(evidence_dir=evidence)), mode="simulate", nproc_per_node=1)
    dist.init_process_group("gloo")
    model = nn.parallel.DistributedDataParallel(overhead_mlp().to("cuda"))
    data = TensorDataset(torch.randn(args.steps * 64, 1024), torch.randint(0, 10, (args.steps * 64,)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = iter(DataLoader(data, batch_size=64, sampler=DistributedSampler(data)))
    for step in range(args.steps):
        counting[0] = step == args.steps - 1
        x, y = next(batches)
        x, y = x.to("cuda", non_blocking=True), y.to("cuda", non_blocking=True)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    counting[0] = False
    print(f"calls through the simulation's mode in one step: {sum(calls.values())}")
    for (name, where), count in calls.most_common():
        print(f"  {count:4d}  {name:40s} from {where}")
    CpuDeviceMode.__torch_function__ = dispatch  # type: ignore[method-assign]  # the mode as it runs
    probe = torch.ones(1)
    for label, inside in (("with the mode", True), ("without it", False)):
        if not inside:
            finish()
        start = time.perf_counter()
        for _ in range(100_000):
            probe.is_complex()
        print(f"Tensor.is_complex {label}: {(time.perf_counter() - start) * 10:.2f} us a call (warm)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
