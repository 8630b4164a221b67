"""Benchmark workload: a DDP training loop of an MLP (default 9.5M parameters) that times its own
steps; rank 0 prints the median and the mean step after 10 warm-up steps. ``--fsdp`` shards the same
MLP with FSDP2 instead (each Linear, then the root), for the probes' cost on a sharded model.

Run plain under torchrun and under `ddpdoctor check` to measure the probes' per-step cost: the
median is a step without a fingerprint, the mean counts the fingerprinted ones too. It also prints
the median of the odd and of the even steps (1-based): under `--fingerprint-every 2` the odd ones
are fingerprinted, so their ratio is a fingerprint's cost measured step beside step in one run,
where the machine's drift between runs cannot reach it (plain torchrun's ratio is the control).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def minor_faults() -> int:
    """This process's minor page faults so far (Linux; 0 elsewhere): the kernel time a step spends mapping
    memory that malloc gave back, which moves a whole run's wall time by more than the probes do."""
    try:
        with open("/proc/self/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[7])
    except OSError:
        return 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=9)
    parser.add_argument("--pin", action="store_true", help="pin each rank to its own core (steadier timings)")
    parser.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--dataset-steps", type=int, default=0,
                        help="size the dataset for this many steps (default --steps); the loop stops at --steps")
    parser.add_argument("--thread-cpu", action="store_true",
                        help="also print each step's main-thread CPU ms (STEP_CPU_MS rank [...]): the probes' own cost")
    parser.add_argument("--fsdp", action="store_true",
                        help="shard the MLP with FSDP2 (fully_shard per Linear, then the root) instead of DDP")
    args = parser.parse_args()
    if 0 < args.dataset_steps < args.steps:
        parser.error(f"--dataset-steps {args.dataset_steps} holds fewer than --steps {args.steps} steps' batches")
    torch.set_num_threads(1)
    if args.pin and hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[int(os.environ.get("LOCAL_RANK", "0")) % len(cores)]})
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(args.depth):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    net = nn.Sequential(*layers, nn.Linear(args.width, 10))
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard

        for layer in net:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        model: nn.Module = fully_shard(net)
    else:
        model = DistributedDataParallel(net)
    samples = (args.dataset_steps or args.steps) * args.batch * dist.get_world_size()
    data = TensorDataset(torch.randn(samples, args.width), torch.randint(0, 10, (samples,)))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler)
    optimizer = (torch.optim.AdamW(model.parameters(), lr=1e-3) if args.optimizer == "adamw"
                 else torch.optim.SGD(model.parameters(), lr=0.01))
    times, cpu = [], []
    loop_start, loop_cpu, loop_faults = time.perf_counter(), time.process_time(), minor_faults()
    for step, (x, y) in enumerate(loader):
        if step == args.steps:
            break
        start, start_cpu = time.perf_counter(), time.thread_time()
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
        cpu.append(time.thread_time() - start_cpu)
    loop_s, loop_cpu_s = time.perf_counter() - loop_start, time.process_time() - loop_cpu
    faults = minor_faults() - loop_faults
    # what a user sees: every step after the first 4 (fingerprinted ones included), the loop's wall time, and this
    # rank's CPU seconds in the loop and in the whole process so far (import and start-up included)
    print(f"RUN rank {dist.get_rank()} mean_ms {statistics.fmean(times[4:]) * 1000:.3f} loop_s {loop_s:.3f} "
          f"loop_cpu_s {loop_cpu_s:.3f} process_cpu_s {time.process_time():.3f} loop_faults {faults}", flush=True)
    if args.thread_cpu:
        print(f"STEP_CPU_MS {dist.get_rank()} {json.dumps([round(c * 1e3, 3) for c in cpu])}", flush=True)
    steady = times[10:]
    odd = [t for i, t in enumerate(times) if i >= 10 and i % 2 == 0]  # steps 11, 13, ... (1-based)
    even = [t for i, t in enumerate(times) if i >= 10 and i % 2 == 1]
    if dist.get_rank() == 0:
        params = sum(p.numel() for p in model.parameters())
        print(f"STEP_TIME_MS median {statistics.median(steady) * 1000:.3f} mean {statistics.fmean(steady) * 1000:.3f} "
              f"PARAMS {params} TENSORS {len(list(model.parameters()))}", flush=True)
        print(f"STEP_PARITY_MS odd {statistics.median(odd) * 1000:.3f} even {statistics.median(even) * 1000:.3f}",
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
