"""GPU benchmarks (run where CUDA is present; prints tables, asserts nothing).

1. fingerprint cost on the GPT-style model's parameters and gradients, fp32 and bf16: the fused
   norm and max kernels used before, word sums with a kernel per tensor,
   the word sums used now (big tensors a kernel each, small ones together), word sums over
   chunked concatenations, and one read of those bytes at the measured copy bandwidth;
2. step overhead: the GPT-style job (bench/gpt_step.py) plain under torchrun, under
   `ddpdoctor check` (default schedule) and with --fingerprint-every 1, interleaved, 1 NCCL rank:
   the mean step of a loop that never waits for the GPU; ``--before-site DIR`` adds an earlier
   ddpdoctor installed in DIR, side by side.

    python bench/gpu.py [--rounds 2] [--steps 60] [--out results.json] [--before-site DIR] [--steps-only]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from common import table  # noqa: E402  (the same table printer for every benchmark)


def per_tensor_fingerprint(tensors: list[torch.Tensor]) -> list:
    """The earlier way: a sum and a norm kernel per tensor, then one stack and copy."""
    parts = []
    for t in tensors:
        parts += [t.sum(dtype=torch.float32), torch.linalg.vector_norm(t, dtype=torch.float32)]
    return torch.stack([p.double() for p in parts]).tolist()


def cuda_ms(fn, repeats: int = 50) -> float:
    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)


def fused_norm_max(tensors: list[torch.Tensor]) -> list:
    """The fingerprint before word sums: fused norm and max kernels per dtype (two reads)."""
    norms = torch._foreach_norm(tensors, 2)
    maxes = torch._foreach_max(tensors)
    return torch.stack([*norms, *maxes]).tolist()


def batched_word_sums(tensors: list[torch.Tensor], chunk_bytes: int = 256 << 20) -> list:
    """Word sums in a few kernels whatever the number of tensors: int64 views concatenated in
    chunks, a cumulative sum, the totals at each tensor's end (wrapping int64 arithmetic is exact)."""
    sums: list = []
    chunk: list[torch.Tensor] = []
    size = 0

    def flush() -> None:
        nonlocal chunk, size
        if not chunk:
            return
        flat = torch.cat(chunk)
        ends = torch.tensor([c.numel() for c in chunk], device=flat.device).cumsum(0) - 1
        totals = flat.cumsum(0)[ends]
        sums.append(torch.diff(totals, prepend=totals.new_zeros(1)))
        chunk, size = [], 0

    for t in tensors:
        words = t.detach().reshape(-1).view(torch.int64)
        chunk.append(words)
        size += words.numel() * 8
        if size >= chunk_bytes:
            flush()
    flush()
    return torch.cat(sums).tolist()


def bench_fingerprint(dtype: torch.dtype = torch.float32) -> dict:
    from gpt_step import GPT

    from ddpdoctor.rank import fingerprint as fp

    model = GPT(vocab=32000, width=768, depth=12, heads=12, context=512).cuda().to(dtype)
    params = list(model.parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    tensors = [p.grad for p in params] + params
    nbytes = sum(p.numel() * p.element_size() for p in params) * 2  # parameters and gradients
    big = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    copy_ms = cuda_ms(lambda: big.clone())
    bandwidth = 2 * big.numel() / (copy_ms / 1000)  # bytes read + written per second
    old_ms = cuda_ms(lambda: fused_norm_max(tensors))
    new_ms = cuda_ms(lambda: fp.resolve(fp.start([p.grad for p in params]), fp.start(params)))
    batched_ms = cuda_ms(lambda: batched_word_sums(tensors))
    each_ms = cuda_ms(lambda: torch.stack([fp._word_sum(t) for t in tensors]).tolist())
    assert batched_word_sums(tensors) == [v[0] for v in fp.fingerprint(tensors)], "the two word sums must agree"
    floor_ms = nbytes / bandwidth * 1000
    result = {"gpu": torch.cuda.get_device_name(), "dtype": str(dtype), "tensors": len(params),
              "parameters": sum(p.numel() for p in params), "fused_norm_max_ms": old_ms, "word_sums_ms": new_ms,
              "batched_word_sums_ms": batched_ms, "word_sum_per_tensor_ms": each_ms, "one_read_ms": floor_ms,
              "copy_bandwidth_tbs": bandwidth / 1e12}
    table(f"fingerprint of gradients + parameters, {len(params)} tensors, "
          f"{result['parameters'] / 1e6:.0f}M parameters, {dtype}, {result['gpu']}",
          ["way", "ms (median of 50)"],
          [["fused norm + max per dtype (before)", f"{old_ms:.3f}"],
           ["word sums, a kernel per tensor", f"{each_ms:.3f}"],
           ["word sums: own kernel per big tensor, small ones together (now)", f"{new_ms:.3f}"],
           ["word sums, concatenated in chunks + cumsum", f"{batched_ms:.3f}"],
           [f"one read of the bytes at {bandwidth / 1e12:.2f} TB/s", f"{floor_ms:.3f}"]])
    return result


def _step_result(output: str) -> dict:
    for line in output.splitlines():
        if "STEP_TIMES_MS " in line:
            return json.loads(line.split("STEP_TIMES_MS ", 1)[1])
    raise RuntimeError(output[-3000:])


CONFIGS = ("default", "every")  # the ddpdoctor launches beside plain torchrun: default schedule, every step


def bench_steps(rounds: int, steps: int, before_site: Optional[str] = None, configs: tuple[str, ...] = CONFIGS) -> dict:
    """The mean step of the GPT job (a whole loop that never waits for the GPU, as a user's), plain
    torchrun against ddpdoctor at the default schedule and fingerprinting every step, interleaved
    round by round; with ``before_site``, also an earlier ddpdoctor installed there (side by side)."""
    script = str(ROOT / "bench" / "gpt_step.py")
    plain = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", script]
    check = [sys.executable, "-m", "ddpdoctor", "check", script, "-n", "1", "--plain"]
    builds = {"now": None, **({"before": before_site} if before_site else {})}
    variants: dict[str, tuple[list[str], Optional[str]]] = {"plain torchrun": (plain, None)}
    for build, site in builds.items():
        if "default" in configs:
            variants[f"ddpdoctor check, default schedule ({build})"] = ([*check, "--"], site)
        if "every" in configs:
            every = [*check, "--fingerprint-every", "1", "--"]
            variants[f"ddpdoctor check --fingerprint-every 1 ({build})"] = (every, site)
    means: dict[str, list[float]] = {name: [] for name in variants}
    runs: list[dict] = []  # every run's whole result, with its wall-clock span (to match a GPU sampler's log)
    with tempfile.TemporaryDirectory() as cwd:  # not the checkout: `-m ddpdoctor` must import the build asked for
        for _ in range(rounds):
            for name, (command, site) in variants.items():
                env = {**os.environ, "PYTHONWARNINGS": "ignore"}
                if site:
                    env["PYTHONPATH"] = os.pathsep.join(filter(None, [site, env.get("PYTHONPATH")]))
                began = time.time()
                proc = subprocess.run([*command, "--steps", str(steps)], capture_output=True, text=True, env=env,
                                      cwd=cwd, timeout=600)
                result = _step_result(proc.stdout + proc.stderr)
                runs.append({"launch": name, "began": began, "ended": time.time(), **result})
                means[name].append(result["mean_ms"])
                print(f"{name}: {means[name][-1]:.2f} ms{_run_detail(result)}", flush=True)
    base = statistics.median(means["plain torchrun"])
    rows = [[name, *[f"{v:.2f}" for v in values], f"{statistics.median(values):.2f}",
             f"{statistics.median(values) / base:.3f}"] for name, values in means.items()]
    table(f"GPT-style job, 1 NCCL rank, bf16 autocast, fused AdamW, {torch.cuda.get_device_name()}: the mean step "
          f"of steps 11-{steps} (the loop never waits for the GPU), {rounds} interleaved rounds",
          ["launch", *[f"round {i + 1} ms" for i in range(rounds)], "median ms", "ratio to plain"], rows)
    return {"means": means, "runs": runs}


def _run_detail(result: dict) -> str:
    """One run's per-step spread: the host's and the device's time between step starts, the CPU the
    host spent per step, and the threads that spent most."""
    def part(key: str, label: str) -> str:
        values = result.get(key) or {}
        return (f"{label} {values['mean']:.1f}/{values['median']:.1f}/{values['p90']:.1f}/{values['max']:.1f}"
                if "mean" in values else "")
    parts = [part("host_ms", "host"), part("device_ms", "device"), part("main_cpu_ms", "main cpu"),
             part("process_cpu_ms", "all cpu")]
    threads = ", ".join(f"{t['name']} {t['cpu_s']:.1f}s" for t in result.get("threads", [])[:5])
    return (f"  [ms mean/median/p90/max: {'; '.join(p for p in parts if p)}] [threads: {threads}]"
            if any(parts) else "")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--out", default=None)
    parser.add_argument("--before-site", default=None,
                        help="an earlier ddpdoctor installed in this folder (pip install --target), run side by side")
    parser.add_argument("--steps-only", action="store_true", help="skip the fingerprint kernels' table")
    parser.add_argument("--configs", default=",".join(CONFIGS),
                        help="the ddpdoctor launches run beside plain torchrun, comma-separated: default, every")
    args = parser.parse_args()
    configs = tuple(c.strip() for c in args.configs.split(",") if c.strip())
    unknown = sorted(set(configs) - set(CONFIGS))
    if unknown or not configs:
        parser.error(f"--configs: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(CONFIGS)}")
    if not torch.cuda.is_available():
        print("no CUDA device: the GPU benchmarks need one")
        return
    results: dict = {}
    if not args.steps_only:
        results.update(fingerprint=bench_fingerprint(torch.float32), fingerprint_bf16=bench_fingerprint(torch.bfloat16))
    results["steps"] = bench_steps(args.rounds, args.steps, args.before_site, configs)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
