"""Analysis at scale: every check over synthetic evidence of a 1024-rank job, timed, with its peak
memory. The evidence goes through the supervisor's own path (JSON lines, parsed one process at a
time). Prints one JSON line; bench/run.py runs it in a fresh process so the peak RSS is its own.

The evidence is what a healthy job of that size writes: a DistributedSampler over 1M samples,
200 fingerprinted optimizer steps of a 150-tensor model, DDP's gradient all-reduce in every backward
and a metric all_reduce every step, numbered as the process group numbers them.
"""

from __future__ import annotations

import argparse
import functools
import json
import resource
import time

from ddpdoctor.analysis.evidence import Evidence, parse_lines
from ddpdoctor.analysis.runner import analyze
from ddpdoctor.schema import events as ev
from ddpdoctor.schema.fingerprints import encode_fingerprints
from ddpdoctor.schema.indices import encode_indices
from ddpdoctor.schema.observations import Observations


@functools.lru_cache(maxsize=None)
def _fingerprints(n: int, params: int) -> str:
    """Step n's fingerprints: equal on every rank, as replicas in sync write them."""
    return encode_fingerprints([[(i + 1) * 1_000_003 + n] for i in range(params)])


def rank_lines(rank: int, world: int, steps: int, params: int, samples: int) -> list[str]:
    """One rank's evidence as the JSON lines its recorder writes."""
    names = [f"layers.{i}.weight" for i in range(params)]
    site = [{"file": "train.py", "line": 40, "function": "train"}]
    backward = [{"file": "train.py", "line": 38, "function": "train"}]
    events: list[ev.Event] = [
        ev.InitProcessGroup(rank=rank, backend="gloo", world_size=world, numbering="pg"),
        ev.DDPWrap(rank=rank, params=names),
        ev.OptimizerInfo(rank=rank, names=names, in_ddp=[True] * params, ddp_of=[0] * params)]
    for n in range(1, steps + 1):
        fp = _fingerprints(n, params)
        events.append(ev.InternalCollectives(rank=rank, t=float(n), seq=2 * n - 1, first=2 * n - 1, count=1,
                                             phase="ddp-backward", ddp=0, site=backward))
        events.append(ev.Step(rank=rank, t=float(n), seq=2 * n - 1, n=n, grads=fp, params=fp,
                              forwards={"0": {"synced": 1, "unsynced": 0, "inner": 1}}))
        events.append(ev.Collective(rank=rank, t=float(n), seq=2 * n, op="all_reduce", n=2 * n,
                                    tensors=[[[1], "float32"]], site=site))
    events.append(ev.DDPUsage(rank=rank, t=float(steps), seq=2 * steps, ddp=0, iterations=steps, backwards=steps,
                              final=True))
    shard = list(range(rank, samples, world))
    events.append(ev.LoaderPass(
        rank=rank, t=1.0, loader="train.py:10", complete=True, final=True, num_batches=len(shard) // 32,
        num_samples=len(shard), indices=encode_indices(shard), steps=steps, ddp_forwards=steps,
        dataset_len=samples, head=shard[:64], tail=shard[-64:],
        sampler=ev.SamplerInfo(type="DistributedSampler", distributed=True, shuffle=True, epoch=0,
                               num_replicas=world, total_size=samples, num_samples=len(shard))))
    return [json.dumps(e.to_json(), separators=(",", ":")) for e in events]


def load(world: int, steps: int, params: int, samples: int) -> tuple[Evidence, float]:
    """Parsed as the supervisor parses collected evidence: one process at a time, one shared pool.
    Returns the evidence and the seconds spent parsing (generating the lines is not counted)."""
    pool: dict[str, str] = {}
    parse_s = 0.0

    def processes():
        nonlocal parse_s
        for r in range(world):
            lines = rank_lines(r, world, steps, params, samples)
            start = time.perf_counter()
            events = parse_lines(lines, pool)
            parse_s += time.perf_counter() - start
            yield events

    evidence = Evidence.from_processes(processes(), observations=Observations(world_size=world))
    return evidence, parse_s


def profile(world: int = 256) -> None:
    """Where the analysis spends its time (python bench/analysis_scale.py --profile)."""
    import cProfile
    import pstats

    evidence, _ = load(world, 200, 150, 1_000_000)
    cProfile.runctx("analyze(evidence)", globals(), {"evidence": evidence}, "/tmp/analysis.prof")
    pstats.Stats("/tmp/analysis.prof").sort_stats("tottime").print_stats(15)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--world", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--params", type=int, default=150)
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--profile", action="store_true", help="print a cProfile of the analysis of 256 ranks")
    args = parser.parse_args()
    if args.profile:
        return profile()
    evidence, parse_s = load(args.world, args.steps, args.params, args.samples)
    start = time.perf_counter()
    outcomes = analyze(evidence).outcomes
    analysis_s = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"parse_s": parse_s, "analysis_s": analysis_s,
                      "peak_rss_mib": peak / 1024, "statuses": {o.id: o.status for o in outcomes}}))


if __name__ == "__main__":
    main()
