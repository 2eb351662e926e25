#!/usr/bin/env bash
# The GPU checks in one call of at most 9 minutes, each step under its own time limit:
#
#   bash benchmarks/gpu_suite.sh OUT_DIR [PART[,PART...]]    PART: tests bench train (default: all three)
#
# tests: tests/test_compile.py (compiled bf16 logits and training step against eager, on the GPU), $TESTS_LIMIT s;
# bench: benchmark.py --device cuda --dtype bfloat16 --compile, ours and the ViT, training ($BENCH_ARGS adds
#        options, e.g. "--modes inference training"), $BENCH_LIMIT s;
# train: examples/run_digits.py end to end (Trainer, data loading, bf16, torch.compile, evaluation) for
#        $TRAIN_STEPS steps on the Parquet data under $GPU_DATA (default .gpu/data, made by
#        prepare_device_files.sh; skipped when absent), $TRAIN_LIMIT s.
# Writes OUT_DIR/tests.log, bench.md, bench.json, train.log and suite.log (progress and errors).
set -u
out=${1:?usage: gpu_suite.sh OUT_DIR [PART[,PART...]], PART one of tests bench train}
parts=${2:-tests,bench,train}
for name in ${parts//,/ }; do # a typo would otherwise run nothing and waste a lent GPU's time
    case $name in
    tests | bench | train) ;;
    *)
        echo "gpu_suite.sh: unknown part '$name'; expected some of tests bench train" >&2
        exit 2
        ;;
    esac
done
want() { [[ ",$parts," == *",$1,"* ]]; }
mkdir -p "$out"
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python=${PYTHON:-python3}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/suite.log"
"$python" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" |
    tee -a "$out/suite.log"

if want tests; then
    echo "== tests ($(date -u +%H:%M:%S), limit ${TESTS_LIMIT:-150}s)"
    timeout "${TESTS_LIMIT:-150}" "$python" -m pytest -q -p no:cacheprovider tests/test_compile.py \
        >"$out/tests.log" 2>&1
    echo "   exit $?"
    tail -n 5 "$out/tests.log"
fi
if want bench; then
    echo "== bench ($(date -u +%H:%M:%S), limit ${BENCH_LIMIT:-200}s)"
    # shellcheck disable=SC2086
    timeout "${BENCH_LIMIT:-200}" "$python" benchmarks/benchmark.py --device cuda --dtype bfloat16 --compile \
        --models ni vit --modes training --repeats 3 --output-json "$out/bench.json" ${BENCH_ARGS:-} \
        >"$out/bench.md" 2>>"$out/suite.log"
    echo "   exit $?"
    cat "$out/bench.md"
fi
data=${GPU_DATA:-.gpu/data}
if want train && [ -d "$data" ]; then
    echo "== train ($(date -u +%H:%M:%S), ${TRAIN_STEPS:-500} steps on $data, limit ${TRAIN_LIMIT:-170}s)"
    rm -rf /tmp/ni_train
    timeout "${TRAIN_LIMIT:-170}" "$python" -u examples/run_digits.py --data_dir "$data" --output_dir /tmp/ni_train \
        --max_steps "${TRAIN_STEPS:-500}" --bf16 true --torch_compile true \
        --eval_strategy no --save_strategy no --logging_steps 100 --report_to none >"$out/train.log" 2>&1
    echo "   exit $?"
    grep -o "{'train_runtime[^}]*}" "$out/train.log"
    grep -i "accuracy" "$out/train.log" | tail -n 3
fi
echo "== done ($(date -u +%H:%M:%S))"
