"""Where a rank's extra CPU goes, per step kind (issue #34): the 9.5M-parameter MLP of the user-overhead job
(AdamW, batch 64, one thread) trained in one process (1 gloo rank), with no probes, with every probe and
no fingerprint (an unfingerprinted step), or with fingerprints on every step; each step timed by the
main thread's CPU clock. Prints the median, the 10th percentile and the minimum: on a shared machine the
median moves by 10-20% between identical runs, the minimum by a few percent.

    python bench/step_kinds.py [--steps 150] [--rounds 2] [--profile] [--torch-profile] [--drop loss,wrapping]
                               [--model mlp|gpt|gpt-cuda] [--fused-stub] [--probe-times]

``--model gpt``: instead, the GPT-style decoder of bench/gpt_step.py (149 tensors) at a tiny width, so
that its arithmetic is cheap and a step's CPU is mostly Python and dispatch: what a GPU's host runs.
``--model gpt-cuda``: that decoder at full size (135M) on the GPU (NCCL, bf16 autocast, fused AdamW,
batch 16 x 512): the main thread's CPU per step, and the loop's mean wall step (the loop never waits
for the GPU). The main thread's clock misses autograd's device thread, which launches the backward
and runs the gradient hooks on a GPU: ``--torch-profile`` sees every thread.

``--fused-stub``: on the CPU, fingerprints take the fused kernel's path (rank/fused_word_sums.py) with
its launch replaced by zeros, so that a step times the probes' Python around the kernel as a GPU's
host runs it (the values are wrong: for timing only).

``--probe-times``: each probe function's own share of a step, timed in the loop by the main thread's
CPU clock around it (caches as cold as the training leaves them, unlike a function timed alone):
calls per step and ms per step, for the steps after the first eighth. Nested entries overlap (the
optimizer hooks include the fingerprint reads they launch).

``--profile``: also each variant's cProfile table restricted to ddpdoctor's functions (cumulative),
which names the probe code a step runs (its times are inflated by the profiler); with
STEP_KINDS_SORT=tottime, every function by its own time (torch's calls too, where a wait for the
device shows). ``--torch-profile``: torch.profiler over five steps of each variant: torch's ops by
their own CPU time on every thread, and on a GPU the kernels by device time. ``--drop``: probe
modules left out (ddpdoctor.rank.probes.PROBE_MODULES), to see one probe's share.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable

from common import one_rank_env, overhead_mlp

VARIANTS = {"no probes": ("none", 0), "probes, no fingerprint": ("probes", 10 ** 9),
            "probes, fingerprint every step": ("probes", 1)}


def _stub_fused_kernel() -> None:
    """The fused kernel's path on the CPU, its launch replaced by zeros (``--fused-stub``)."""
    import torch

    from ddpdoctor.rank import fused_word_sums

    def zeros(device, addresses, sizes, mode, **_):
        torch.tensor(addresses, dtype=torch.int64)  # the table of addresses, as the real launch builds it
        return (torch.zeros(len(sizes), dtype=torch.int64),
                torch.zeros(len(sizes), dtype=torch.int64) if mode == "both" else None)

    fused_word_sums.DEVICE_TYPES = ("cpu",)
    fused_word_sums.available = lambda: True
    fused_word_sums.word_sums = zeros


# (module, attribute, label): the probe functions --probe-times wraps, looked up at each call by their callers
TIMED_PROBE_FUNCTIONS = (
    ("ddpdoctor.rank.fingerprint", "start", "fingerprint reads (all calls)"),
    ("ddpdoctor.rank.probes.wrapping", "_snapshot", "all-reduce snapshot (sampled read)"),
    ("ddpdoctor.rank.probes.ddp", "_grad_arrived", "gradient hooks"),
    ("ddpdoctor.rank.probes.ddp", "_on_ddp_forward", "DDP forward hook"),
    ("ddpdoctor.rank.probes.loss", "record_grad", "loss probe: local-gradient samples"),
    ("ddpdoctor.rank.probes.loss", "close_window", "loss probe: window"),
    ("ddpdoctor.rank.probes.optimizer", "_capture_config", "optimizer: config digest"),
    ("ddpdoctor.rank.probes.optimizer", "_fingerprint_step", "optimizer: parameter read and step record"),
    ("ddpdoctor.rank.recorder", "Recorder._append", "event writes"),
    ("ddpdoctor.rank.probes.data", "_notify", "data probe: its listeners (the content probe's batch rows)"),
    ("ddpdoctor.rank.probes.content", "_ContentProbe.on_forward", "content probe: forward inputs' rows"),
    ("ddpdoctor.rank.clock", "CollectiveClock._sync", "collective clock: reads and books DDP's collectives"),
    ("ddpdoctor.rank.probes.optimizer", "_fill_step", "optimizer: the step record's filling, from the host values"),
    ("ddpdoctor.rank.probes.optimizer", "encode_fingerprints", "optimizer: fingerprints encoded for the record"),
    ("ddpdoctor.rank.fingerprint", "gather", "fingerprint: sums gathered for one host copy"),
    ("ddpdoctor.rank.fingerprint", "assign", "fingerprint: host values assigned"),
)


def _time_probe_functions() -> tuple[Callable[[], None], Callable[[int], None]]:
    """Wrap :data:`TIMED_PROBE_FUNCTIONS` (at once) and the optimizer's global step hooks (by the
    returned function, once the probes registered them) with the main thread's CPU clock; the second
    returned function prints each one's calls and ms per step."""
    import functools
    import importlib

    spent: dict[str, list[float]] = {}

    def timed(label: str, function: Callable) -> Callable:
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            start = time.thread_time()
            try:
                return function(*args, **kwargs)
            finally:
                spent.setdefault(label, []).append(time.thread_time() - start)
        return wrapper

    for module_name, attribute, label in TIMED_PROBE_FUNCTIONS:
        owner: object = importlib.import_module(module_name)
        *path, name = attribute.split(".")
        for part in path:
            owner = getattr(owner, part)
        setattr(owner, name, timed(label, getattr(owner, name)))

    def wrap_hooks() -> None:
        from torch.optim import optimizer

        for hooks, label in ((optimizer._global_optimizer_pre_hooks, "optimizer: pre-step hook (gradient read)"),
                             (optimizer._global_optimizer_post_hooks, "optimizer: post-step hook")):
            for key in list(hooks):
                hooks[key] = timed(label, hooks[key])

    def report(steps: int) -> None:
        skipped = steps // 8
        for label, values in sorted(spent.items()):
            tail = values[len(values) * skipped // max(1, steps):]
            print(f"PROBE_TIME {label}: {len(values) / steps:.1f} calls/step, "
                  f"{sum(tail) * 1e3 / max(1, steps - skipped):.3f} ms/step", flush=True)

    return wrap_hooks, report


def child(kind: str, every: int, steps: int, profile: bool, drop: str, model_kind: str, torch_profile: bool,
          fused_stub: bool = False, probe_times: bool = False) -> None:
    one_rank_env()
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(1)
    cuda = model_kind == "gpt-cuda"
    if cuda:
        torch.cuda.set_device(0)
    if kind == "probes":
        if fused_stub:
            _stub_fused_kernel()
        from ddpdoctor.rank import probes
        from ddpdoctor.rank.recorder import Recorder
        from ddpdoctor.schema.settings import RankSettings

        if probe_times:
            wrap_hooks, report_times = _time_probe_functions()
        probes.PROBE_MODULES = tuple(m for m in probes.PROBE_MODULES if m not in drop.split(","))
        probes.install(Recorder(RankSettings(evidence_dir=tempfile.mkdtemp(), fingerprint_every=every,
                                             device="native")))
    if kind == "probes" and probe_times:
        wrap_hooks()
    dist.init_process_group("nccl" if cuda else "gloo")
    torch.manual_seed(0)
    if model_kind.startswith("gpt"):
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from gpt_step import GPT

        width, depth, heads, context, vocab, batch = (768, 12, 12, 512, 32000, 16) if cuda else (64, 12, 4, 32, 512, 8)
        net: nn.Module = GPT(vocab=vocab, width=width, depth=depth, heads=heads, context=context)
        tokens = torch.randint(0, vocab, (steps * batch, context + 1))
        data = TensorDataset(tokens[:, :-1], tokens[:, 1:])
    else:
        net = overhead_mlp()
        data = TensorDataset(torch.randn(steps * 64, 1024), torch.randint(0, 10, (steps * 64,)))
        batch = 64
    model = nn.parallel.DistributedDataParallel(net.cuda() if cuda else net)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=cuda)
    profiler = cProfile.Profile()
    traced = None
    if torch_profile:  # five steps after the warm-up, every thread's torch ops and the device's kernels
        activities = [torch.profiler.ProfilerActivity.CPU, *([torch.profiler.ProfilerActivity.CUDA] if cuda else [])]
        traced = torch.profiler.profile(activities=activities, schedule=torch.profiler.schedule(wait=0, warmup=2,
                                                                                                 active=5, repeat=1))
    times = []
    window = 0.0
    for i, (x, y) in enumerate(DataLoader(data, batch_size=batch, pin_memory=cuda)):
        if i == 10:
            if cuda:
                torch.cuda.synchronize()
            window = time.perf_counter()
            if profile:
                profiler.enable()
        start = time.thread_time()
        if cuda:
            x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        optimizer.zero_grad()
        with torch.autocast("cuda" if cuda else "cpu", dtype=torch.bfloat16, enabled=cuda):
            logits = model(x)
        nn.functional.cross_entropy(logits.float().flatten(0, -2), y.flatten()).backward()
        optimizer.step()
        times.append(time.thread_time() - start)
        if traced is not None and i == 13:
            traced.start()
        if traced is not None and 13 <= i < 20:
            traced.step()
        if traced is not None and i == 20:
            traced.stop()
            for sort in (["self_cuda_time_total"] if cuda else []) + ["self_cpu_time_total"]:
                print(traced.key_averages().table(sort_by=sort, row_limit=25), flush=True)
    if cuda:
        torch.cuda.synchronize()
    if kind == "probes" and probe_times:
        report_times(len(times))
    print(f"LOOP_MEAN_MS {(time.perf_counter() - window) * 1e3 / max(1, len(times) - 10):.2f}", flush=True)
    profiler.disable()
    ordered = sorted(times[10:])
    print(f"STEP_CPU_MS {statistics.median(ordered) * 1e3:.2f} {ordered[len(ordered) // 10] * 1e3:.2f} "
          f"{ordered[0] * 1e3:.2f}", flush=True)
    if profile:
        out = io.StringIO()
        own_time = os.environ.get("STEP_KINDS_SORT") == "tottime"  # every function by its own time, torch's too
        stats = pstats.Stats(profiler, stream=out).sort_stats("tottime" if own_time else "cumulative")
        stats.print_stats(*([] if own_time else ["ddpdoctor"]), 30)
        print(out.getvalue(), flush=True)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--drop", default="")
    parser.add_argument("--model", choices=("mlp", "gpt", "gpt-cuda"), default="mlp")
    parser.add_argument("--torch-profile", action="store_true",
                        help="torch.profiler over five steps: ops by their own CPU time, kernels by device time")
    parser.add_argument("--fused-stub", action="store_true",
                        help="the fused fingerprint kernel path on the CPU, its launch replaced by zeros (timing)")
    parser.add_argument("--probe-times", action="store_true",
                        help="each probe function's ms per step, timed in the loop by the main thread's CPU clock")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), args.steps, args.profile, args.drop, args.model, args.torch_profile,
              args.fused_stub, args.probe_times)
        return
    print("| round | variant | median CPU ms per step | p10 | min | loop's mean wall ms per step |\n"
          "|---|---|---|---|---|---|")
    for round_number in range(1, args.rounds + 1):
        for name, (kind, every) in VARIANTS.items():
            cmd = [sys.executable, __file__, "--child", kind, str(every), "--steps", str(args.steps),
                   "--drop", args.drop, "--model", args.model, *(["--profile"] if args.profile else []),
                   *(["--torch-profile"] if args.torch_profile else []),
                   *(["--fused-stub"] if args.fused_stub else []), *(["--probe-times"] if args.probe_times else [])]
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=900).stdout
            line = next((ln for ln in out.splitlines() if ln.startswith("STEP_CPU_MS")), None)
            median, p10, low = line.split()[1:] if line else ("-", "-", "-")
            mean = next((ln.split()[1] for ln in out.splitlines() if ln.startswith("LOOP_MEAN_MS")), "-")
            print(f"| {round_number} | {name} | {median} | {p10} | {low} | {mean} |", flush=True)
            if args.profile or args.torch_profile:
                print(out.split("\n", 1)[1] if line else out[-3000:])
            for timing in (ln for ln in out.splitlines() if ln.startswith("PROBE_TIME")):
                print(f"  {timing[len('PROBE_TIME '):]}")


if __name__ == "__main__":
    main()
