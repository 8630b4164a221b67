"""What config-sync, optimizer-params and gradient-sync's causes cost a step, in one process: each
probe's own work timed alone (one thread), next to the step it rides on.

- the configuration digest, on fingerprinted steps: one attribute read per module and parameter,
  the param groups' values, a hash;
- the param-group check, before every step: the groups' values compared with the previous step's;
- ``model.train()`` through the patch that records mode changes (every nested call passes it);
- a ``param_groups`` read from user code (the writer-candidate note);
- then a whole unsampled step, with and without everything #22 added (the config and wrapping
  probes' hooks, the optimizer probe's param-group check), in interleaved blocks of the same
  process, timed by CPU time: a small and a 9.5M-parameter MLP.

    python bench/config_cost.py      (also: python bench/run.py --only config)
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import one_rank_env, overhead_mlp, table  # noqa: E402


def _median_us(fn: Callable[[], object], repeats: int = 200) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e6)
    return statistics.median(samples)


def _models():

    from gpt_step import GPT

    mlp = overhead_mlp()
    gpt = GPT(vocab=32000, width=768, depth=12, heads=12, context=512)
    return [("MLP 9x1024 (9.5M params)", mlp), ("GPT 12x768 (135M params)", gpt)]


def bench_config() -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    one_rank_env()
    torch.set_num_threads(1)
    from ddpdoctor.rank import probes
    from ddpdoctor.rank.probes import config as config_probe
    from ddpdoctor.rank.recorder import Recorder
    from ddpdoctor.schema.settings import RankSettings

    original_train = torch.nn.Module.train
    # Only each optimizer's first step is fingerprinted: the A/B below times unsampled steps.
    rec = Recorder(RankSettings(evidence_dir=tempfile.mkdtemp(), fingerprint_every=10**9))
    finish = probes.install(rec)
    dist.init_process_group("gloo")
    rows = []
    try:
        for label, net in _models():
            model = DistributedDataParallel(net)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            num_modules = sum(1 for _ in model.modules())
            if "MLP" in label:
                x, y = torch.randn(32, 1024), torch.randint(0, 10, (32,))

                def step(model: torch.nn.Module = model, optimizer: torch.optim.Optimizer = optimizer,
                         x: torch.Tensor = x, y: torch.Tensor = y) -> None:
                    optimizer.zero_grad()
                    F.cross_entropy(model(x), y).backward()
                    optimizer.step()
            else:
                tokens = torch.randint(0, 32000, (1, 65))

                def step(model: torch.nn.Module = model, optimizer: torch.optim.Optimizer = optimizer,
                         tokens: torch.Tensor = tokens) -> None:
                    optimizer.zero_grad()
                    F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()).backward()
                    optimizer.step()

            step_us = _median_us(step, repeats=5)
            watch = config_probe.ParamGroupsWatch(optimizer)
            index = config_probe.MODULES[id(model)][0]  # this wrapper's DDP index
            # (each lambda binds this model's objects: a closure would read the loop's variables)
            digest_us = _median_us(lambda o=optimizer, i=index: config_probe.capture(o, [i], None)[0])
            check_us = _median_us(lambda w=watch, o=optimizer: w.check(o, 0, 1))
            patched_us = _median_us(model.train)
            plain_us = _median_us(lambda m=model: original_train(m))
            read_us = _median_us(lambda o=optimizer: o.param_groups)
            rows.append([label, num_modules, f"{step_us / 1000:.1f}", f"{digest_us:.0f}", f"{check_us:.1f}",
                         f"{plain_us:.0f} -> {patched_us:.0f}", f"{read_us:.2f}"])
        ab_rows = []
        for every, steps in ((10**9, "unsampled"), (1, "fingerprinted")):
            rec.fingerprint_every = every
            ab_rows += [[steps, *_with_and_without(width)] for width in (16, 1024)]
    finally:
        dist.destroy_process_group()
        finish()
    table("#22 probes in one process (1 thread): configuration digest (fingerprinted steps only), param-group "
          "check (every step), model.train() without -> with the patch, a param_groups read from user code",
          ["model", "modules", "step ms (batch 32 / 64 tokens)", "digest us", "group check us",
           "train() us", "param_groups read us"], rows)
    table("a step with and without #22's probes (same process, 12 interleaved blocks of 10 steps, median CPU time)",
          ["steps", "model", "without ms", "with ms", "difference"], ab_rows)


def _with_and_without(width: int) -> list:
    """Median CPU time of a step of two identical DDP models, one wrapped with #22's probes and one
    without, stepped in alternating blocks."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from ddpdoctor.rank.probes import ddp as ddp_probe
    from ddpdoctor.rank.probes import optimizer as optimizer_probe
    from ddpdoctor.rank.probes import wrapping

    def build(listeners):
        saved = list(ddp_probe.ATTACH_LISTENERS)
        ddp_probe.ATTACH_LISTENERS[:] = listeners
        try:
            model = DistributedDataParallel(overhead_mlp(width))
        finally:
            ddp_probe.ATTACH_LISTENERS[:] = saved
        return model, torch.optim.SGD(model.parameters(), lr=0.01)

    ours = ("ddpdoctor.rank.probes.config", "ddpdoctor.rank.probes.wrapping")
    without_22 = [f for f in ddp_probe.ATTACH_LISTENERS if getattr(f, "__module__", "") not in ours]
    with_model, without_model = build(list(ddp_probe.ATTACH_LISTENERS)), build(without_22)
    x, y = torch.randn(32, width), torch.randint(0, 10, (32,))
    kept = (optimizer_probe._watch_param_groups, optimizer_probe._capture_config, wrapping.reduced_for,
            vars(torch.optim.Optimizer).get("param_groups"))

    def switch(on: bool) -> None:
        if on:
            (optimizer_probe._watch_param_groups, optimizer_probe._capture_config, wrapping.reduced_for,
             descriptor) = kept
            if descriptor is not None:
                torch.optim.Optimizer.param_groups = descriptor
        else:
            optimizer_probe._watch_param_groups = optimizer_probe._capture_config = lambda *a: None
            wrapping.reduced_for = lambda *a: None
            if kept[3] is not None:
                del torch.optim.Optimizer.param_groups

    def block(pair, n=10) -> list[float]:
        model, optimizer = pair
        out = []
        for _ in range(n):
            start = time.process_time()
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            out.append(time.process_time() - start)
        return out

    with_times, without_times = [], []
    block(with_model, 3)
    for _ in range(12):
        with_times += block(with_model)
        switch(False)
        without_times += block(without_model)
        switch(True)
    on, off = statistics.median(with_times) * 1000, statistics.median(without_times) * 1000
    params = sum(p.numel() for p in with_model[0].parameters())
    size = f"{params / 1e6:.1f}M" if params >= 1e6 else f"{params / 1e3:.1f}k"
    return [f"MLP 9x{width} ({size} params)", f"{off:.3f}", f"{on:.3f}",
            f"{(on - off) * 1000:+.0f} us ({100 * (on / off - 1):+.1f}%)"]


if __name__ == "__main__":
    bench_config()
