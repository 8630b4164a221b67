"""ddpdoctor benchmarks; prints tables, asserts nothing. Run: python bench/run.py [--quick]

1. wall time of the reference job: plain torchrun vs `ddpdoctor check`;
2. per-step cost of the probes on a DDP MLP (median step, plain vs probed);
3. hang-to-report latency of the hang fixtures with --hang-timeout 5;
4. analysis time on synthetic evidence of 1024 ranks.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
PY = sys.executable
ENV = {**os.environ, "PYTHONWARNINGS": "ignore", "NO_COLOR": "1"}


def timed(cmd: list[str], cwd: str) -> tuple[float, str]:
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=cwd, env=ENV, capture_output=True, text=True)
    return time.monotonic() - start, proc.stdout + proc.stderr


def table(title: str, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    print(f"\n{title}")
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))


def bench_reference(repeats: int, cwd: str) -> None:
    script = str(FIXTURES / "reference.py")
    plain = [timed([PY, "-m", "torch.distributed.run", "--nproc-per-node", "2", script], cwd)[0] for _ in range(repeats)]
    doctor = [timed([PY, "-m", "ddpdoctor", "check", "--plain", "-q"], cwd)[0] for _ in range(repeats)]
    p, d = statistics.median(plain), statistics.median(doctor)
    table("reference job, 2 gloo ranks (median of %d runs)" % repeats, ["launch", "wall s", "ratio"],
          [["torchrun --nproc-per-node 2", f"{p:.1f}", "1.00"], ["ddpdoctor check", f"{d:.1f}", f"{d / p:.2f}"]])


def _step_ms(output: str) -> float:
    match = re.search(r"STEP_TIME_MS ([\d.]+) PARAMS (\d+)", output)
    if not match:
        raise RuntimeError(output[-2000:])
    return float(match.group(1))


def bench_steps(cwd: str, steps: int, repeats: int) -> None:
    script = str(ROOT / "bench" / "step_time.py")
    rows = []
    for width, depth in ((256, 4), (1024, 8)):
        args = ["--", "--steps", str(steps), "--width", str(width), "--depth", str(depth)]
        plain = statistics.median(
            _step_ms(timed([PY, "-m", "torch.distributed.run", "--nproc-per-node", "2", script, *args[1:]], cwd)[1])
            for _ in range(repeats))
        auto = statistics.median(
            _step_ms(timed([PY, "-m", "ddpdoctor", "check", script, "--plain", *args], cwd)[1]) for _ in range(repeats))
        every1 = statistics.median(
            _step_ms(timed([PY, "-m", "ddpdoctor", "check", script, "--plain", "--fingerprint-every", "1", *args], cwd)[1])
            for _ in range(repeats))
        params = (width * width + width) * depth + width * 10 + 10
        rows.append([f"MLP {depth}x{width} ({params / 1e6:.1f}M params)", f"{plain:.2f}", f"{auto:.2f}",
                     f"{100 * (auto / plain - 1):+.1f}%", f"{every1:.2f}", f"{100 * (every1 / plain - 1):+.1f}%"])
    table(f"mean training step over {steps} steps, 2 gloo ranks (median of {repeats} runs)",
          ["model", "plain ms", "probed (auto) ms", "cost", "every step ms", "cost"], rows)


def bench_hangs(cwd: str) -> None:
    rows = []
    for fixture in ("hang_barrier_rank0.py", "hang_collective_some_ranks.py", "early_stop_rank0.py", "uneven_manual_shard.py"):
        if not (FIXTURES / fixture).exists():
            continue
        evidence = tempfile.mkdtemp(prefix="bench-ev-")
        wall, output = timed([PY, "-m", "ddpdoctor", "check", str(FIXTURES / fixture), "--plain", "-q",
                              "--hang-timeout", "5", "--keep-evidence", evidence], cwd)
        finished = time.time()
        last_progress = 0.0
        for path in glob.glob(os.path.join(evidence, "events-*.jsonl")):
            with open(path) as f:
                events = [json.loads(line) for line in f if line.strip()]
            # Progress ends at the last event before the stack dump (the dump itself writes snapshots).
            times = [e["t"] for e in events if not e.get("snapshot") and e.get("kind") != "probe_error"]
            last_progress = max(last_progress, max(times, default=0.0))
        outcome = "hung" if "outcome hung" in output else "other"
        rows.append([fixture, outcome, f"{wall:.1f}", f"{finished - last_progress:.1f}"])
    table("hang fixtures with --hang-timeout 5", ["fixture", "outcome", "total wall s", "last progress -> report s"], rows)


def bench_fingerprint() -> None:
    """In one process, no contention: the fingerprint of grads + params against the work of a step."""
    import torch

    from ddpdoctor.rank.fingerprint import fingerprint

    torch.set_num_threads(1)
    rows = []
    for width, depth in ((256, 4), (1024, 8)):
        model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(depth)])
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x = torch.randn(32, width)

        def step() -> None:
            optimizer.zero_grad()
            model(x).square().mean().backward()
            optimizer.step()

        def probe() -> None:
            params = list(model.parameters())
            fingerprint([p.grad for p in params])
            fingerprint(params)

        step_ms, probe_ms = (_median_ms(f) for f in (step, probe))
        params = sum(p.numel() for p in model.parameters())
        rows.append([f"MLP {depth}x{width} ({params / 1e6:.1f}M params)", f"{step_ms:.2f}", f"{probe_ms:.2f}",
                     f"{100 * probe_ms / step_ms:.1f}%", f"{100 * probe_ms / step_ms * 38 / 200:.1f}%"])
    table("fingerprint cost per fingerprinted step (1 thread, batch 32)",
          ["model", "step ms", "fingerprint ms", "of a step", "amortized, auto schedule, 200 steps"], rows)


def _median_ms(fn, repeats: int = 30) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def bench_analysis() -> None:
    from ddpdoctor.analysis.evidence import Evidence, RankEvidence
    from ddpdoctor.analysis.runner import analyze
    from ddpdoctor.schema import events as ev
    from ddpdoctor.schema.indices import encode_indices
    from ddpdoctor.schema.observations import Observations

    world, steps, params, samples = 1024, 20, 50, 1_000_000
    names = [f"p{i}" for i in range(params)]
    ranks = {}
    for r in range(world):
        events: list[ev.Event] = [
            ev.InitProcessGroup(rank=r, backend="gloo", world_size=world),
            ev.DDPWrap(rank=r, params=names),
            ev.OptimizerInfo(rank=r, names=names, in_ddp=[True] * params, ddp_of=[0] * params)]
        for n in range(1, steps + 1):
            fp = [[float(i + n), float(i)] for i in range(params)]
            events.append(ev.Step(rank=r, t=float(n), n=n, grads=fp, params=fp,
                                  forwards={"0": {"synced": 1, "unsynced": 0, "inner": 1}}))
        shard = list(range(r, samples, world))
        events.append(ev.LoaderPass(
            rank=r, t=1.0, loader="train.py:10", complete=True, num_batches=len(shard) // 32,
            num_samples=len(shard), indices=encode_indices(shard), steps=steps, ddp_forwards=steps,
            dataset_len=samples, head=shard[:64], tail=shard[-64:],
            sampler=ev.SamplerInfo(type="DistributedSampler", distributed=True, shuffle=True, epoch=0,
                                   num_replicas=world, total_size=samples, num_samples=len(shard))))
        ranks[r] = RankEvidence(rank=r, events=events)
    evidence = Evidence(ranks=ranks, observations=Observations(world_size=world))
    start = time.monotonic()
    outcomes = analyze(evidence).outcomes
    elapsed = time.monotonic() - start
    table(f"analysis of synthetic evidence: {world} ranks, {steps} steps x {params} params, {samples:,} samples",
          ["checks", "statuses", "seconds"], [[len(outcomes), ",".join(o.status for o in outcomes), f"{elapsed:.2f}"]])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="one repeat, fewer steps")
    args = parser.parse_args()
    cwd = tempfile.mkdtemp(prefix="ddpdoctor-bench-")
    bench_analysis()
    bench_fingerprint()
    bench_reference(1 if args.quick else 3, cwd)
    bench_steps(cwd, 60 if args.quick else 200, 1 if args.quick else 3)
    bench_hangs(cwd)


if __name__ == "__main__":
    main()
