"""Time the fingerprint kernels of a fingerprinted step inside a real probed training loop.

    python bench/fingerprint_reads.py [--steps 60] [--every 1]

One process (1 rank, gloo, one thread), the probe-cost MLP with AdamW, every probe installed,
``ddpdoctor.rank.fingerprint.start`` wrapped in a timer: per step, how many full and sampled
fingerprint calls ran and the milliseconds they took (issue #19: the gradients and the parameters
read in full once each, the all-reduce snapshot sampled). Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))

import probe_cost  # noqa: E402
from common import one_rank_env  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=1, help="--fingerprint-every (1: every step)")
    args = parser.parse_args()
    one_rank_env()
    torch.set_num_threads(1)
    from ddpdoctor.rank import fingerprint, probes
    from ddpdoctor.rank.recorder import Recorder
    from ddpdoctor.schema.settings import RankSettings

    spent: dict[str, float] = collections.defaultdict(float)
    calls: collections.Counter = collections.Counter()
    start = fingerprint.start

    def timed(tensors, **kwargs):
        began = time.perf_counter()
        pending = start(tensors, **kwargs)
        kind = "sampled" if kwargs.get("sampled") else "full"
        spent[kind] += time.perf_counter() - began
        calls[kind] += 1
        return pending

    fingerprint.start = timed  # the probes call it through the module
    rec = Recorder(RankSettings(evidence_dir=tempfile.mkdtemp(), fingerprint_every=args.every))
    finish = probes.install(rec)
    dist.init_process_group("gloo")
    median = probe_cost.measure("mlp", args.steps, "all probes", "wall")
    dist.destroy_process_group()
    finish()
    rec.close()
    parts = ", ".join(f"{kind}: {calls[kind] / args.steps:.1f} calls, {spent[kind] * 1000 / args.steps:.2f} ms"
                      for kind in sorted(spent))
    print(f"median step {median:.1f} ms; fingerprint calls per step: {parts}")


if __name__ == "__main__":
    main()
