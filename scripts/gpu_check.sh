#!/usr/bin/env bash
# The device check (docs/performance.md, "GPU"): correctness and speed of the torch path on one GPU,
# at most 8 minutes on an H200. Writes $OUT/gpu_check.json and $OUT/summary.md (OUT defaults to
# ./gpu_check_out). Runs from a source checkout with the machine's own python3, torch, triton and
# transformers; pure-Python packages execstate imports that the machine lacks travel as wheels in
# .whl/ (`make gpu-wheels` fetches them where pip has a network) and are installed to /tmp/site.
#   scripts/gpu_check.sh          on a GPU
#   scripts/gpu_check.sh --cpu    the same code on the CPU with tiny sizes (checks the check)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_check_out}
PY=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# the runtime and the benchmarks (benchmarks/execstate_bench: the check itself) from this checkout, uninstalled
export PYTHONPATH=$PWD:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if [[ " $* " == *" --cpu "* ]]; then
  export TRITON_INTERPRET=1  # the Triton kernels on the CPU, through Triton's interpreter
else
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv || true
fi
exec timeout 480 "$PY" -m execstate_bench.gpu_check --out "$OUT" "$@"
