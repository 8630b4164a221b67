"""Benchmark workload on a GPU: a GPT-style decoder (~130M parameters, bf16 autocast, fused AdamW)
trained with DDP; rank 0 prints the mean step after the warm-up, as a user's loop sees it: the loop
never waits for the GPU (it reads no loss), so the host runs ahead and the steps' wall time is the
device's, plus whatever makes the host wait. ``--sync-every-step`` also times each step alone,
with a synchronisation at both ends (what the earlier figures measured: it hides a probe's waits).

    torchrun --nproc-per-node 1 bench/gpt_step.py --steps 60
    ddpdoctor check bench/gpt_step.py -n 1 -- --steps 60
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, width: int, depth: int, heads: int, context: int) -> None:
        super().__init__()
        self.embed, self.position = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        mask = torch.triu(torch.full((length, length), float("-inf"), device=tokens.device), diagonal=1)
        x = self.embed(tokens) + self.position(torch.arange(length, device=tokens.device))
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.norm(x))


def spread_of(values: list[float]) -> dict:
    """Mean, median, 90th percentile and maximum of per-step values."""
    if not values:
        return {}
    ordered = sorted(values)
    return {"mean": sum(ordered) / len(ordered), "median": ordered[len(ordered) // 2],
            "p90": ordered[len(ordered) * 9 // 10], "max": ordered[-1]}


def spread(clock: list[float], scale: float) -> dict:
    """The spread of the intervals between consecutive readings of a clock, scaled (s to ms)."""
    return spread_of([(b - a) * scale for a, b in zip(clock, clock[1:])])


def thread_cpu() -> list[dict]:
    """Each thread's name and CPU seconds so far (Linux), most first: which threads the host's time
    went to (autograd's device thread, NCCL's, a probe's)."""
    import threading

    python_names = {t.native_id: t.name for t in threading.enumerate()}
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    threads = []
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/stat") as f:
                stat = f.read()
            comm = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2:].split()
            cpu_s = (int(fields[11]) + int(fields[12])) / ticks  # utime + stime
            threads.append({"name": python_names.get(int(task), comm), "cpu_s": round(cpu_s, 2)})
    except OSError:
        return []
    return sorted(threads, key=lambda t: -t["cpu_s"])[:8]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--sync-every-step", action="store_true")
    args = parser.parse_args()
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    model = GPT(vocab=32000, width=768, depth=12, heads=12, context=args.context).to(device)
    params = sum(p.numel() for p in model.parameters())
    model = DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=device.type == "cuda")
    generator = torch.Generator(device=device).manual_seed(dist.get_rank())
    times = []
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    window_start = 0.0
    host = []  # each step's start on the host clock, in the window: the host runs ahead unless it waits
    main_cpu = []  # the main thread's CPU clock at each step's start: the host's own work
    process_cpu = []  # every thread's (autograd's device thread runs the backward and its hooks)
    marks = []  # a CUDA event at each step's start: where the device got to it
    for step in range(args.steps):
        tokens = torch.randint(0, 32000, (args.batch, args.context + 1), device=device, generator=generator)
        if step == args.warmup:
            synchronize()
            window_start = time.perf_counter()
        if args.sync_every_step:
            synchronize()
        start = time.perf_counter()
        if step >= args.warmup:
            host.append(start)
            main_cpu.append(time.thread_time())
            process_cpu.append(time.process_time())
            if device.type == "cuda":
                marks.append(torch.cuda.Event(enable_timing=True))
                marks[-1].record()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if args.sync_every_step:
            synchronize()
            if step >= args.warmup:
                times.append((time.perf_counter() - start) * 1000)
    synchronize()
    mean_ms = (time.perf_counter() - window_start) * 1000 / max(1, args.steps - args.warmup)
    # The host's time between step starts: near the device's step where the host keeps it busy; a
    # stall (a wait, a collection, a compile) shows as one long interval, a slow host as all of them.
    # Beside it, the CPU the host spent per step (main thread, and all threads), and the device's
    # time between step starts: a host slower than the device shows as CPU per step near the wall's.
    device_ms = [a.elapsed_time(b) for a, b in zip(marks, marks[1:])]
    if dist.get_rank() == 0:
        print("STEP_TIMES_MS " + json.dumps({
            "params": params, "tensors": len(list(model.parameters())), "mean_ms": mean_ms,
            "host_ms": spread(host, 1000), "main_cpu_ms": spread(main_cpu, 1000),
            "process_cpu_ms": spread(process_cpu, 1000), "device_ms": spread_of(device_ms),
            "threads": thread_cpu(), "times": times}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
