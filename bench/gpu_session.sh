#!/usr/bin/env bash
# One lent-GPU session in one command (the machine is released after 30 s idle): installs this
# checkout without dependencies beside the machine's own torch, then runs the GPU paths for real
# and leaves every report under $OUT. Never run by the test suite.
#
#   OUT=/tmp/gpu-out bash bench/gpu_session.sh [--no-bench]
#
# 1. the reference job on 1 NCCL rank, its evidence kept, then `ddpdoctor analyze` on that evidence;
# 2. the GPU fixtures (tutorial styles, AMP + SyncBatchNorm, torch.accelerator, mp.spawn) on 1 rank,
#    natively (no simulation), good and known-bad twins;
# Every check's screen and JSON stay in $OUT; a summary line per run goes to stdout.
# 3. bench/gpu.py (fingerprint kernels, step overhead), unless --no-bench.
set -u
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/ddpdoctor-site . >"$OUT/install.log" 2>&1 \
    || { echo "install failed"; tail -20 "$OUT/install.log"; exit 2; }
export PYTHONPATH=/tmp/ddpdoctor-site PATH=/tmp/ddpdoctor-site/bin:$PATH
nvidia-smi -L
python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'nccl', torch.cuda.nccl.version())"
python3 -c "import orjson" 2>/dev/null || echo "(no orjson here: the standard library parses evidence)"

check() {  # check NAME ARGS...: one ddpdoctor run, its JSON report and screen under $OUT
    local name=$1; shift
    local started=$SECONDS
    (cd "$OUT" && timeout 240 ddpdoctor check --plain --json "$OUT/$name.json" "$@" >"$OUT/$name.txt" 2>&1)
    local rc=$?
    python3 - "$OUT/$name.json" "$name" "$rc" "$((SECONDS - started))" <<'EOF'
import json, sys
path, name, rc, secs = sys.argv[1:]
try:
    report = json.load(open(path))
except Exception as error:
    print(f"{name}: exit {rc} in {secs}s, no report ({error})")
    raise SystemExit
roots = [f"{f['check']}/{f['severity']}" for f in report.get("findings", []) if not f.get("consequence_of")]
sim = (report.get("device_simulation") or {}).get("active")
print(f"{name}: exit {rc} in {secs}s, outcome {report.get('outcome')}, backend {report.get('backend')}, "
      f"device {report.get('device')}, simulated {sim}, roots {roots or 'none'}")
EOF
    [ -f "$OUT/$name.json" ] || tail -8 "$OUT/$name.txt"
}

F=$PWD/fixtures
check reference -n 1 --device native --keep-evidence "$OUT/reference-evidence"
(cd "$OUT" && timeout 120 ddpdoctor analyze "$OUT/reference-evidence" --plain --json "$OUT/reference-analyze.json" \
    >"$OUT/reference-analyze.txt" 2>&1; echo "analyze of the reference evidence: exit $?")
check gpu_trainer "$F/gpu_trainer.py" -n 1 --device native -- --total-epochs 2
check gpu_trainer_bug "$F/gpu_trainer.py" -n 1 --device native -- --total-epochs 2 --bug set-epoch
check gpu_amp "$F/gpu_amp.py" -n 1 --device native
check gpu_amp_bug "$F/gpu_amp.py" -n 1 --device native -- --bug unused-head
check gpu_accelerator "$F/gpu_accelerator.py" -n 1 --device native
check gpu_accelerator_bug "$F/gpu_accelerator.py" -n 1 --device native -- --bug module-forward
check gpu_multinode "$F/gpu_multinode.py" -n 1 --device native
check gpu_spawn "$F/gpu_spawn.py" -n 1 --device native --launch spawn
check gpu_cpu_choice "$F/gpu_cpu_choice.py" -n 1 --device native
check duplicate_gpu "$PWD/bench/gpu_fixtures/duplicate_gpu.py" -n 2 --device native --timeout 120
check simulate_beside_gpu "$F/gpu_trainer.py" -n 2 --device simulate -- --total-epochs 1

if [ "${1:-}" != "--no-bench" ]; then
    python3 bench/gpu.py --rounds 3 --steps 60 --out "$OUT/gpu.json" 2>&1 | tee "$OUT/gpu-bench.txt"
fi
