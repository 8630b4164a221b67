"""GPU benchmarks (run where CUDA is present; prints tables, asserts nothing).

1. fingerprint cost on the GPT-style model's parameters and gradients: the per-tensor way (two
   reductions per tensor, as before the fused kernels) against ddpdoctor's fused kernels, and one
   read of those bytes at the measured copy bandwidth;
2. step overhead: the GPT-style job (bench/gpt_step.py) plain under torchrun, under
   `ddpdoctor check` (default schedule) and with --fingerprint-every 1, interleaved, 1 NCCL rank.

    python bench/gpu.py [--rounds 2] [--steps 60] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

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


def bench_fingerprint() -> dict:
    from gpt_step import GPT

    from ddpdoctor.rank import fingerprint as fp

    model = GPT(vocab=32000, width=768, depth=12, heads=12, context=512).cuda()
    params = list(model.parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    nbytes = sum(p.numel() * p.element_size() for p in params) * 2  # parameters and gradients
    big = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    copy_ms = cuda_ms(lambda: big.clone())
    bandwidth = 2 * big.numel() / (copy_ms / 1000)  # bytes read + written per second
    old_ms = cuda_ms(lambda: (per_tensor_fingerprint([p.grad for p in params]), per_tensor_fingerprint(params)))
    new_ms = cuda_ms(lambda: fp.resolve(fp.start([p.grad for p in params]), fp.start(params)))
    floor_ms = nbytes / bandwidth * 1000
    result = {"gpu": torch.cuda.get_device_name(), "tensors": len(params), "parameters": sum(p.numel() for p in params),
              "per_tensor_ms": old_ms, "fused_ms": new_ms, "one_read_ms": floor_ms, "copy_bandwidth_tbs": bandwidth / 1e12}
    table(f"fingerprint of gradients + parameters, {len(params)} tensors, "
          f"{result['parameters'] / 1e6:.0f}M parameters, fp32, {result['gpu']}",
          ["way", "ms (median of 50)"],
          [["per tensor (sum + norm kernels each)", f"{old_ms:.3f}"], ["fused (_foreach_norm + _foreach_max)", f"{new_ms:.3f}"],
           [f"one read of the bytes at {bandwidth / 1e12:.2f} TB/s", f"{floor_ms:.3f}"]])
    return result


def _step_times(output: str) -> list[float]:
    for line in output.splitlines():
        if "STEP_TIMES_MS " in line:
            return json.loads(line.split("STEP_TIMES_MS ", 1)[1])["times"]
    raise RuntimeError(output[-3000:])


def bench_steps(rounds: int, steps: int) -> dict:
    script = str(ROOT / "bench" / "gpt_step.py")
    variants = {
        "plain torchrun": [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", script],
        "ddpdoctor check (default schedule)": [sys.executable, "-m", "ddpdoctor", "check", script, "-n", "1", "--plain",
                                               "--"],
        "ddpdoctor check --fingerprint-every 1": [sys.executable, "-m", "ddpdoctor", "check", script, "-n", "1",
                                                  "--plain", "--fingerprint-every", "1", "--"],
    }
    medians: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, command in variants.items():
            proc = subprocess.run([*command, "--steps", str(steps)], capture_output=True, text=True,
                                  env={**os.environ, "PYTHONWARNINGS": "ignore"}, timeout=600)
            medians[name].append(statistics.median(_step_times(proc.stdout + proc.stderr)))
    plain = statistics.median(medians["plain torchrun"])
    rows = [[name, f"{statistics.median(v):.2f}", f"{statistics.median(v) / plain:.3f}"] for name, v in medians.items()]
    table(f"GPT-style step, 1 NCCL rank, bf16 autocast, fused AdamW, {torch.cuda.get_device_name()} "
          f"(median step of {steps} minus warm-up, median of {rounds} interleaved rounds)",
          ["launch", "step ms", "ratio to plain"], rows)
    return {name: v for name, v in medians.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: the GPU benchmarks need one")
        return
    results = {"fingerprint": bench_fingerprint(), "steps": bench_steps(args.rounds, args.steps)}
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
