"""Where a probed step's time goes, in one process (1 rank): the same training step with no probes,
with every probe, and with every probe but one kind, so each probe's share shows.

    python bench/probe_cost.py [--model gpt|mlp] [--steps 40] [--clock wall|cpu]

``--clock cpu`` times each step by the process's CPU time: on a CPU-only machine shared with other
jobs, one thread's CPU time is what the probes cost, where wall time mostly measures the others.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import one_rank_env  # noqa: E402


def build(kind: str, device: torch.device):
    if kind == "gpt":
        from gpt_step import GPT

        model = GPT(vocab=32000, width=768, depth=12, heads=12, context=512).to(device)

        def batch():
            tokens = torch.randint(0, 32000, (16, 513), device=device)
            return tokens[:, :-1], tokens[:, 1:]

        def loss_fn(out, target):
            return F.cross_entropy(out.float().flatten(0, 1), target.flatten())
    else:
        layers = []
        for _ in range(8):
            layers += [torch.nn.Linear(1120, 1120), torch.nn.ReLU()]
        model = torch.nn.Sequential(*layers, torch.nn.Linear(1120, 10)).to(device)

        def batch():
            return torch.randn(64, 1120, device=device), torch.randint(0, 10, (64,), device=device)

        loss_fn = F.cross_entropy
    return model, batch, loss_fn


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def measure(kind: str, steps: int, variant: str, clock: str = "wall") -> float:
    from torch.nn.parallel import DistributedDataParallel

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model, batch, loss_fn = build(kind, device)
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-4, fused=device.type == "cuda")
    times = []
    for step in range(steps):
        x, y = batch()
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = CLOCKS[clock]()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            out = ddp(x)
        loss_fn(out, y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if step >= 5:
            times.append((CLOCKS[clock]() - start) * 1000)
    return statistics.median(times)


def run_variant(kind: str, steps: int, variant: str, every: int, clock: str = "wall") -> float:
    """A fresh process per variant: probes cannot be uninstalled cleanly in between."""
    import subprocess

    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r}); import probe_cost; "
            f"probe_cost.child({kind!r}, {steps}, {variant!r}, {every}, {clock!r})")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    for line in out.stdout.splitlines():
        if line.startswith("MEDIAN_MS "):
            return float(line.split()[1])
    raise RuntimeError(out.stdout[-2000:] + out.stderr[-3000:])


def child(kind: str, steps: int, variant: str, every: int, clock: str = "wall") -> None:
    one_rank_env()
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    if variant != "no probes":
        from ddpdoctor.rank import probes
        from ddpdoctor.rank.recorder import Recorder
        from ddpdoctor.schema.settings import RankSettings

        if variant == "all probes but the gradient hooks":  # the DDP probe's registrations become no-ops
            torch.Tensor.register_post_accumulate_grad_hook = lambda self, hook: None  # type: ignore
        if "but #22's" in variant:
            _without_issue_22_probes()
        rec = Recorder(RankSettings(evidence_dir=tempfile.mkdtemp(), fingerprint_every=every))
        probes.install(rec)
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    print(f"MEDIAN_MS {measure(kind, steps, variant, clock):.3f}", flush=True)
    dist.destroy_process_group()


def _without_issue_22_probes() -> None:
    """Leave out what config-sync, optimizer-params and gradient-sync's causes added (issue #22): the
    config and wrapping probes, and the optimizer probe's param-group check, configuration digest
    and reuse of DDP's reduced gradients."""
    from ddpdoctor.rank import probes
    from ddpdoctor.rank.probes import optimizer as optimizer_probe
    from ddpdoctor.rank.probes import wrapping

    probes.PROBE_MODULES = tuple(m for m in probes.PROBE_MODULES if m not in ("config", "wrapping"))
    optimizer_probe._watch_param_groups = lambda *args: None
    optimizer_probe._capture_config = lambda *args: None
    wrapping.reduced_for = lambda *args: None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=("gpt", "mlp"), default="gpt" if torch.cuda.is_available() else "mlp")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall time, or the process's CPU time (robust on a shared machine)")
    args = parser.parse_args()
    variants = [("no probes", 0), ("all probes, fingerprint every step", 1),
                ("all probes but #22's, fingerprint every step", 1),
                ("all probes, fingerprint no step (schedule past step 200)", 10**9),
                ("all probes but #22's, fingerprint no step", 10**9),
                ("all probes but the gradient hooks", 10**9)]
    results: dict[str, list[float]] = {v: [] for v, _ in variants}
    for _ in range(args.rounds):
        for variant, every in variants:
            results[variant].append(run_variant(args.model, args.steps, variant, every, args.clock))
    base = statistics.median(results["no probes"])
    print(f"\nprobe cost per step ({args.clock} clock), {args.model}, 1 rank, "
          f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'CPU, 1 thread'}")
    for variant, values in results.items():
        value = statistics.median(values)
        print(f"  {variant:<58} {value:8.2f} ms  {value / base:6.3f}x")


if __name__ == "__main__":
    main()
