#!/usr/bin/env bash
# Issue #34's GPU part in one command on a lent GPU machine: the deferred host copies checked on a
# real GPU (unit test, and ddpdoctor on GPU fixtures with every step fingerprinted), then the GPT
# job's mean step, plain against this build and against an earlier one side by side.
#
#   git archive <earlier commit> pyproject.toml README.md ddpdoctor checks fixtures | tar -x -C .before/src
#   OUT=/tmp/gpu-out [PARTS="tests checks probes steps trace kinds"] bash bench/gpu_overhead_session.sh [.before/src]
#
# PARTS, run in this order whatever order they are given in:
#   tests: the host-copy and fused-kernel unit tests on CUDA;
#   checks: ddpdoctor on the GPU fixtures;
#   probes: bench/step_kinds.py --probe-times on the full GPT: each probe function's CPU per step,
#     by the clock of the thread it ran on;
#   steps: bench/gpu.py: the GPT job's mean step, plain against ddpdoctor (and the earlier build if
#     given), ROUNDS rounds (3 unless set) of STEPS steps (110 unless set), with the GPU's
#     utilisation and clocks sampled every 200 ms into $OUT/smi.csv and the processes on it every
#     2 s into $OUT/apps.txt;
#   trace: torch.profiler over five steps of each kind: every thread's ops, the kernels by device time;
#   kinds: bench/step_kinds.py on the full GPT: host CPU and mean wall step per step kind, then a
#     profile by own time.
set -u
OUT=${OUT:-/tmp/gpu-out}
BEFORE=${1:-}
PARTS=${PARTS:-tests checks probes kinds steps}
want() { [[ " $PARTS " == *" $1 "* ]]; }
for part in $PARTS; do
    [[ " tests checks probes steps trace kinds " == *" $part "* ]] \
        || { echo "unknown part $part: choose from tests checks probes steps trace kinds"; exit 2; }
done
mkdir -p "$OUT"
install() {  # install SOURCE TARGET: a build beside the machine's own torch, without dependencies
    python3 -m pip install --no-build-isolation --no-deps -q --target "$2" "$1" >>"$OUT/install.log" 2>&1 \
        || { echo "install of $1 failed"; tail -20 "$OUT/install.log"; exit 2; }
}
install . /tmp/now-site
[ -n "$BEFORE" ] && install "$BEFORE" /tmp/before-site
export PYTHONPATH=/tmp/now-site PATH=/tmp/now-site/bin:$PATH PYTHONUNBUFFERED=1
nvidia-smi -L
python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__)"

if want tests; then
    echo "== the host copies on a GPU (unit tests)"
    timeout 150 python3 -m pytest -q -n 0 -p no:cacheprovider tests/unit/test_host_copies.py \
        tests/unit/test_fused_word_sums.py 2>&1 | tail -3
    echo "== a fingerprint's host time on the GPT's 149 tensors: the fused kernel against a kernel per tensor"
    timeout 120 python3 - <<'PY'
import statistics, sys, time
import torch
sys.path.insert(0, "bench")
from gpt_step import GPT
from ddpdoctor.rank import fingerprint as fp, fused_word_sums as fused
params = list(GPT(vocab=32000, width=768, depth=12, heads=12, context=512).cuda().parameters())
for p in params:
    p.grad = torch.randn_like(p)
began = time.perf_counter(); fp.resolve(fp.start(params)); print(f"first call (compiles): {time.perf_counter() - began:.2f} s")
for options in ({}, {"sampled": True}, {"also_sampled": True}):
    values = {}
    for name in ("fused", "per tensor"):
        fused._failure = None if name == "fused" else RuntimeError("off")
        fp.resolve(fp.start(params, **options)); torch.cuda.synchronize()
        host = []
        for _ in range(30):
            began = time.perf_counter(); pending = fp.start(params, **options); host.append(time.perf_counter() - began)
            values[name] = fp.resolve(pending, *([pending.sample] if pending.sample else []))
        print(f"{options or 'full'} {name}: host {statistics.median(host) * 1e3:.3f} ms per call")
    assert values["fused"] == values["per tensor"], "the fused sums differ"
print("fused == per tensor: ok")
PY
fi

check() {  # check NAME ARGS...: one ddpdoctor run; its screen and JSON report under $OUT
    local name=$1; shift
    (cd "$OUT" && timeout 180 ddpdoctor check --plain --json "$OUT/$name.json" "$@" >"$OUT/$name.txt" 2>&1)
    local rc=$?
    python3 - "$OUT/$name.json" "$name" "$rc" <<'PY'
import json, sys
path, name, rc = sys.argv[1:]
try:
    report = json.load(open(path))
except Exception as error:
    raise SystemExit(f"{name}: exit {rc}, no report ({error})")
roots = [f"{f['check']}/{f['severity']}: {f['message'][:150]}" for f in report.get("findings", [])
         if f["severity"] in ("error", "warning")]
passed = [c["id"] for c in report.get("checks", []) if c.get("status") == "pass"]
print(f"{name}: exit {rc}, outcome {report.get('outcome')}, roots {roots or 'none'}, passed {passed}, "
      f"probe errors {report.get('probe_errors') or 'none'}")
PY
}
if want checks; then
    echo "== ddpdoctor on GPU fixtures, every step fingerprinted"
    F=$PWD/fixtures G=$PWD/bench/gpu_fixtures
    check shared_good "$G/shared_gpu_sync.py" -n 2 --device native --fingerprint-every 1
    check shared_bad "$G/shared_gpu_sync.py" -n 2 --device native --fingerprint-every 1 -- --bug scale-grad
    check amp "$F/gpu_amp.py" -n 1 --device native --fingerprint-every 1
    check trainer_bug "$F/gpu_trainer.py" -n 1 --device native -- --total-epochs 2 --bug set-epoch
fi
if want probes; then
    echo "== each probe function's CPU per step, the full GPT on the GPU"
    timeout 100 python3 bench/step_kinds.py --model gpt-cuda --probe-times --steps 50 --rounds 1 2>&1 \
        | tee "$OUT/probe-times.txt" | tail -26
fi
if want steps; then
    echo "== the GPT job's mean step"
    lscpu | grep -E "^(Model name|CPU\(s\)|Thread|NUMA node\(s\)|CPU max MHz)" || true
    cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor 2>/dev/null || true
    reasons=clocks_event_reasons.active
    nvidia-smi --query-gpu=$reasons --format=csv >/dev/null 2>&1 || reasons=clocks_throttle_reasons.active
    nvidia-smi --query-gpu=timestamp,utilization.gpu,clocks.sm,clocks.mem,power.draw,temperature.gpu,$reasons \
        --format=csv,noheader -lms 200 >"$OUT/smi.csv" 2>&1 &
    sampler=$!
    (while sleep 2; do date +%s.%N; nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader; \
        done) >"$OUT/apps.txt" 2>&1 &
    apps=$!
    timeout ${STEPS_TIMEOUT:-400} python3 bench/gpu.py --rounds ${ROUNDS:-3} --steps ${STEPS:-110} --steps-only \
        --out "$OUT/gpu.json" ${BEFORE:+--before-site /tmp/before-site} 2>&1 | tee "$OUT/gpu-bench.txt"
    kill $sampler $apps 2>/dev/null
fi
if want trace; then
    echo "== torch.profiler of the full GPT per step kind (autograd's thread and the kernels)"
    timeout 180 python3 bench/step_kinds.py --model gpt-cuda --steps 30 --rounds 1 --torch-profile \
        >"$OUT/trace.txt" 2>&1
    grep -A62 "fingerprint every step" "$OUT/trace.txt" | head -64
fi
if want kinds; then
    echo "== host CPU and mean wall step per step kind, the full GPT on the GPU"
    timeout 150 python3 bench/step_kinds.py --model gpt-cuda --steps 60 --rounds 1 2>&1 | tee "$OUT/kinds.txt"
    STEP_KINDS_SORT=tottime timeout 150 python3 bench/step_kinds.py --model gpt-cuda --steps 40 --rounds 1 --profile \
        >"$OUT/kinds-profile.txt" 2>&1
    sed -n '/fingerprint every step/,$p' "$OUT/kinds-profile.txt" | head -40
fi
