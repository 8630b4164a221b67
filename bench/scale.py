"""Scale: the sampler probes on a 10M-sample dataset, the analysis of a 1024-rank job, and the
evidence a 100,000-step run writes per rank."""

from __future__ import annotations

import collections
import glob
import json
import os
import re
import tempfile

from common import PY, ROOT, WORKLOADS, doctor, run, table, torchrun
from evidence_dir import timed_analysis


def _peak_rss(output: str) -> dict[int, float]:
    return {int(r): float(m) for r, m in re.findall(r"PEAK_RSS_MIB rank (\d+) ([\d.]+)", output)}


def bench_sampler(cwd: str, samples: int) -> None:
    """Extra peak RSS per rank from the probes (same job plain vs checked) and the analysis time."""
    args = ("--samples", str(samples), "--epochs", "2")
    plain = run(torchrun(WORKLOADS / "big_sampler.py", *args), cwd)
    evidence = tempfile.mkdtemp(prefix="bench-ev-")
    checked = run(doctor(WORKLOADS / "big_sampler.py", "--keep-evidence", evidence, script_args=args), cwd)
    base, probed = _peak_rss(plain.output), _peak_rss(checked.output)
    parse_s, analysis_s, outcomes = timed_analysis(evidence)
    statuses = {o.id: o.status for o in outcomes}
    rows = [[f"rank {r}", f"{base[r]:.0f}", f"{probed[r]:.0f}", f"{probed[r] - base[r]:+.0f}"]
            for r in sorted(base) if r in probed]
    table(f"sampler evidence at scale: {samples:,} samples, 2 epochs, 2 ranks, batch 8192, tiny model "
          f"(wall: plain {plain.wall_s:.1f} s, checked {checked.wall_s:.1f} s)",
          ["rank", "plain peak RSS MiB", "checked peak RSS MiB", "extra MiB"], rows)
    table("analysis of that evidence (every check, in one process)", ["parse s", "analysis s", "sampler-disjoint",
                                                                      "set-epoch"],
          [[f"{parse_s:.2f}", f"{analysis_s:.2f}", statuses.get("sampler-disjoint"), statuses.get("set-epoch")]])


def bench_analysis(cwd: str, world: int) -> None:
    """Synthetic evidence of a large job, analyzed in a fresh process (bench/analysis_scale.py)."""
    result = run([PY, str(ROOT / "bench" / "analysis_scale.py"), "--world", str(world)], cwd)
    data = json.loads(result.output.strip().splitlines()[-1])
    failed = sorted(k for k, v in data["statuses"].items() if v not in ("pass", "skip"))
    table(f"analysis at scale: {world} ranks, 1M samples, 200 fingerprinted steps x 150 tensors, "
          "an all_reduce every step (target <= 10 s, <= 2 GiB)",
          ["parse s", "analysis s", "peak RSS MiB", "checks not passing"],
          [[f"{data['parse_s']:.1f}", f"{data['analysis_s']:.1f}", f"{data['peak_rss_mib']:.0f}",
            ", ".join(failed) or "none"]])


def bench_volume(cwd: str, steps: int) -> None:
    """Bytes of evidence per rank on disk after a long run, by event kind."""
    evidence = tempfile.mkdtemp(prefix="bench-ev-")
    result = run(doctor(WORKLOADS / "long_run.py", "-q", "--keep-evidence", evidence,
                        script_args=("--steps", str(steps))), cwd, timeout=3600)
    rows = []
    for path in sorted(glob.glob(os.path.join(evidence, "events-*.jsonl"))):
        by_kind: collections.Counter = collections.Counter()
        with open(path) as f:
            for line in f:
                by_kind[json.loads(line).get("kind")] += len(line)
        total = sum(by_kind.values())
        top = ", ".join(f"{k} {v / 2**20:.1f}" for k, v in by_kind.most_common(3))
        rows.append([os.path.basename(path), f"{total / 2**20:.1f}", top])
    table(f"evidence volume: {steps:,} optimizer steps, 2 ranks, 1000 steps per epoch, auto schedule "
          f"(wall {result.wall_s:.0f} s; target <= 100 MiB per rank)",
          ["file (one rank)", "MiB", "largest kinds, MiB"], rows)
