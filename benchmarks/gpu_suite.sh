#!/usr/bin/env bash
# The GPU measurements of benchmarks/README.md in one go, each step under its own time limit.
#
#   bash benchmarks/gpu_suite.sh OUT_DIR [tests|fp32|bf16|compile|graphs|all]
#
# Writes OUT_DIR/<step>.json per step, appends the Markdown reports to OUT_DIR/reports.md and the progress logs to
# OUT_DIR/suite.log, and prints each report.
# "tests": tests/test_compile.py and the model tests; "fp32", "bf16": float32 and bf16 autocast without compile (all
# three models; bf16 with the routing density); "compile": bf16 + torch.compile (inductor, default mode);
# "graphs": bf16 + torch.compile(mode="reduce-overhead"), i.e. CUDA graphs.
set -u
out=${1:?usage: gpu_suite.sh OUT_DIR [tests|fp32|bf16|compile|graphs|all]}
part=${2:-all}
mkdir -p "$out"
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python=${PYTHON:-python3}

step() { # step NAME SECONDS ARGS... : one benchmark run under `timeout`
    local name=$1 limit=$2
    shift 2
    echo "== $name ($(date -u +%H:%M:%S), limit ${limit}s)"
    echo "== $name" >>"$out/suite.log"
    timeout "$limit" "$python" benchmarks/benchmark.py --device cuda --output-json "$out/$name.json" "$@" \
        >"$out/$name.md.tmp" 2>>"$out/suite.log"
    local rc=$?
    cat "$out/$name.md.tmp" | tee -a "$out/reports.md"
    rm -f "$out/$name.md.tmp"
    [ $rc -eq 0 ] || { echo "!! $name exited with $rc; last log lines:"; tail -n 15 "$out/suite.log"; }
}

want() { [ "$part" = all ] || [ "$part" = "$1" ]; }

if want tests; then
    echo "== tests ($(date -u +%H:%M:%S))"
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
    "$python" -c "import torch, transformers, ni_hf; print('torch', torch.__version__, '| transformers', transformers.__version__)"
    xdist=$("$python" -c "import xdist" 2>/dev/null && echo "-n 8")
    timeout 240 "$python" -m pytest -q -p no:cacheprovider $xdist tests/test_compile.py \
        tests/test_modeling_neural_interpreter.py 2>&1 | tee -a "$out/suite.log" | tail -n 15
fi
want fp32 && step cuda_fp32_eager 150 --dtype float32 --models ni-sdpa ni-eager vit --no-density
want bf16 && step cuda_bf16_eager 150 --dtype bfloat16 --models ni-sdpa ni-eager vit
if want compile; then
    step cuda_bf16_compile 300 --dtype bfloat16 --compile --models ni-sdpa vit --no-density
fi
if want graphs; then
    step cuda_bf16_cudagraphs 300 --dtype bfloat16 --cuda-graphs --models ni-sdpa vit --no-density
fi
echo "== done ($(date -u +%H:%M:%S))"
