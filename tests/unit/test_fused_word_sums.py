"""The fused word-sum kernel (rank/fused_word_sums.py): its sums are exactly the per-tensor kernels'
in every mode, through ``fingerprint.start`` too (aligned tensors fused, the rest per tensor, in one
result), and a DDP run writes the same evidence with it; a failure leaves the per-tensor kernels in
charge, and the optimizer probe reports it, leaving no check incomplete (the fingerprints are whole).
Runs on a GPU where there is one, else under Triton's interpreter on the CPU (a fresh interpreter,
since TRITON_INTERPRET is read when Triton compiles); skipped where Triton is not installed (failed
under CI)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import torch
from ci_gate import skip_or_fail_in_ci
from one_rank import run_one_rank

from ddpdoctor.schema.probes import checks_affected


_CHECKS = textwrap.dedent("""
    import torch
    from ddpdoctor.rank import fingerprint as fp
    from ddpdoctor.rank import fused_word_sums as fused

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        fused.DEVICE_TYPES = ("cpu",)  # Triton's interpreter reads CPU memory
    torch.manual_seed(0)
    # small and big tensors (a big one: at least _SMALL_WORDS words, sampled; small enough for Triton's
    # interpreter), a big one whose length is no whole number of sample rows, bf16, int and bool
    tensors = [torch.randn(768, device=device), torch.randn(64, 1030, device=device), torch.randn(6, device=device),
               torch.randn(2, 1021 * 33 + 5, device=device), torch.randn(1 << 15, device=device),
               torch.randn(300, 302, device=device).to(torch.bfloat16),
               torch.randint(-2 ** 62, 2 ** 62, (40000,), device=device),
               torch.ones(64, dtype=torch.bool, device=device)]
    words = [fp._aligned_words(t) for t in tensors]
    full = [int(w.sum()) for w in words]
    sample = [int(fp._sampled_word_sum(w)) if w.numel() >= fp._SMALL_WORDS else int(w.sum()) for w in words]
    assert fused.available(), fused.failure()
    args = (torch.device(device), [w.data_ptr() for w in words], [w.numel() for w in words])
    params = dict(small=fp._SMALL_WORDS, stride=fp._SAMPLE_STRIDE, run=fp._SAMPLE_RUN)
    sums, none = fused.word_sums(*args, "full", **params)
    assert sums.tolist() == full and none is None, (sums.tolist(), full)
    sums, _ = fused.word_sums(*args, "sampled", **params)
    assert sums.tolist() == sample, (sums.tolist(), sample)
    sums, sampled = fused.word_sums(*args, "both", **params)
    assert sums.tolist() == full and sampled.tolist() == sample
    assert sample != full  # the sample leaves words out, so the comparison above means something

    # fingerprint.start: fused where aligned, per tensor where not (20 bytes, a transposed view), None and empty
    given = tensors + [torch.randn(5, device=device), torch.randn(3, 8, device=device).t(), None,
                       torch.empty(0, device=device)]
    for options in ({}, {"sampled": True}, {"also_sampled": True}):
        pending = fp.start(given, **options)
        assert len(pending.parts) == 2, pending.parts  # the fused kernel's sums and the per-tensor ones
        got = fp.resolve(pending, *([pending.sample] if pending.sample else []))
        fused.disable(RuntimeError("off"))
        unfused = fp.start(given, **options)
        assert len(unfused.parts) == 1
        want = fp.resolve(unfused, *([unfused.sample] if unfused.sample else []))
        fused._failure = None
        assert got == want, (options, got, want)

    # the same tensors again, one changed in place: the cached plan and address table read its new bytes
    saved = given[1].clone()
    given[1].mul_(3)
    again = fp.start(given).values()
    fused.disable(RuntimeError("off"))
    again_unfused = fp.start(given).values()
    fused._failure = None
    assert again == again_unfused and again[1] != [full[1]], (again, again_unfused)
    given[1].copy_(saved)

    # a launch that fails: the per-tensor kernels give the same values, and the failure is kept
    real = fused.word_sums
    def broken(*args, **kwargs):
        raise RuntimeError("no kernel image is available")
    fused.word_sums = broken
    values = fp.start(given).values()
    fused.word_sums = real
    assert not fused.available() and "no kernel image" in str(fused.failure())
    assert values[:len(full)] == [[v] for v in full] and values[len(tensors):] == want[0][len(tensors):]
    print("FUSED_OK")
""")


def test_fused_sums_equal_the_per_tensor_kernels_in_every_mode() -> None:
    if importlib.util.find_spec("triton") is None:
        skip_or_fail_in_ci("Triton is not installed (the test extra installs it)")
    env = dict(os.environ)
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    done = subprocess.run([sys.executable, "-c", _CHECKS], capture_output=True, text=True, env=env, timeout=600)
    assert "FUSED_OK" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]


_RUN = textwrap.dedent("""
    import os, sys
    from ddpdoctor.rank import fused_word_sums, probes
    from ddpdoctor.rank.recorder import Recorder
    from ddpdoctor.schema.settings import RankSettings
    way = sys.argv[1]
    if way != "per-tensor":  # the fused kernel on the CPU, under Triton's interpreter
        fused_word_sums.DEVICE_TYPES = ("cpu",)
    if way == "broken":
        def broken(*args, **kwargs):
            raise RuntimeError("no kernel image is available for execution on the device")
        fused_word_sums.word_sums = broken
    rec = Recorder(RankSettings(evidence_dir=os.environ["EVIDENCE"], fingerprint_every=1, device="native"))
    finish = probes.install(rec)
    import torch
    import torch.distributed as dist
    # One intra-op thread: once Triton's interpreter has run any kernel in a process (a trivial one will do), the
    # half of an elementwise op that torch's second thread computes comes out different in about one run in six
    # (AdamW's update off by up to 3e-4, relative), and the runs compared here would train apart. With one
    # thread none did in 24 runs. The interpreter is this test's stand-in for a GPU; on a GPU it does not run
    # (fused_word_sums.interpreted_on_host).
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.manual_seed(0)
    # big (64 x 1024 floats: sampled), small and odd-sized (5 floats: per tensor) parameters
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(1024, 64), torch.nn.ReLU(), torch.nn.Linear(64, 5)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(4):
        x = torch.randn(8, 1024)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), torch.randint(0, 5, (8,))).backward()
        optimizer.step()
    finish()
    dist.destroy_process_group()
""")


def _steps(tmp_path, way: str) -> tuple[list[dict], list[dict]]:
    """The run above's steps (fingerprints only) and probe errors."""
    _, events = run_one_rank(_RUN, way, evidence=tmp_path / way)
    steps = [{k: e.get(k) for k in ("n", "grads", "params", "reduced", "touched")}
             for e in events if e["kind"] == "step"]
    return steps, [e for e in events if e["kind"] == "probe_error"]


def test_a_ddp_run_writes_the_same_fingerprints_fused_and_per_tensor_and_a_failed_launch_is_reported(tmp_path,
                                                                                                      monkeypatch):
    if importlib.util.find_spec("triton") is None:
        skip_or_fail_in_ci("Triton is not installed (the test extra installs it)")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the ranks run the fused kernel on the CPU
    per_tensor, no_errors = _steps(tmp_path, "per-tensor")
    fused, fused_errors = _steps(tmp_path, "fused")
    broken, errors = _steps(tmp_path, "broken")
    assert len(per_tensor) == 4 and all(s["grads"] and s["params"] and s["reduced"] for s in per_tensor)
    assert fused == per_tensor and not no_errors and not fused_errors
    assert broken == per_tensor  # the per-tensor kernels took over, with the same values
    assert [(e["probe"], e["target"]) for e in errors] == [("fused-fingerprint-kernel",
                                                             "the per-tensor kernels took over")]
    assert checks_affected("fused-fingerprint-kernel", {"gradient-sync": ("optimizer",)}) == ()  # none incomplete
    assert "no kernel image" in errors[0]["error"]


def test_under_tritons_interpreter_a_gpus_tensors_are_summed_per_tensor_not_by_the_fused_kernel(monkeypatch) -> None:
    """TRITON_INTERPRET (set by a script debugging its own kernels) would run the fused kernel on the host, where
    a GPU tensor's address cannot be read, and the interpreter's run would change how the process computes: the
    per-tensor kernels read a GPU's tensors then. The CPU stand-in the tests use still runs under it."""
    from ddpdoctor.rank import fingerprint, fused_word_sums

    launched = []
    monkeypatch.setattr(fused_word_sums, "available", lambda: True)
    monkeypatch.setattr(fused_word_sums, "word_sums", lambda *args, **kwargs: launched.append(args) or ("sums", None))
    gpu, cpu = torch.device("cuda", 0), torch.device("cpu")
    for value in ("1", "true", " On "):
        monkeypatch.setenv("TRITON_INTERPRET", value)
        assert fused_word_sums.interpreted_on_host(gpu) and not fused_word_sums.interpreted_on_host(cpu)
        assert fingerprint._fused(gpu, (4096,), (8,), "full") is None
    assert fingerprint._fused(cpu, (4096,), (8,), "full") == ("sums", None)  # the tests' stand-in
    assert len(launched) == 1 and launched[0][0] == cpu
    for value in ("0", ""):
        monkeypatch.setenv("TRITON_INTERPRET", value)
        assert not fused_word_sums.interpreted_on_host(gpu)
    monkeypatch.delenv("TRITON_INTERPRET")
    assert not fused_word_sums.interpreted_on_host(gpu)
