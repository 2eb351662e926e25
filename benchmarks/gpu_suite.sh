#!/usr/bin/env bash
# The GPU measurements of benchmarks/README.md in one go, each step under its own time limit.
#
#   bash benchmarks/gpu_suite.sh OUT_DIR [PART[,PART...]|all]  PART: diagnose tests train transfer fp32 bf16
#                                                  compile graphs profile traffic
#
# Writes OUT_DIR/<step>.json per step, appends the Markdown reports to OUT_DIR/reports.md and the progress logs to
# OUT_DIR/suite.log, and prints each report. Parts run in the order above, whatever the order asked.
# "diagnose": benchmarks/diagnose_compile.py (which execution departs from the CPU float32 logits), then
#   benchmarks/diagnose_sdpa.py --bisect (which piece, and which GPU-only inductor feature), to suite.log;
# "tests": $TESTS (default: tests/test_compile.py and the model tests);
# "train": examples/run_digits.py end to end (Trainer, data loading, RandAugment in the 8 DataLoader workers, bf16,
#   torch.compile)
#   for $TRAIN_STEPS steps (default 2000) on the Parquet data under $GPU_DATA (default .gpu/data; skipped when
#   absent), log in OUT_DIR/train.log, the trained model in OUT_DIR/model (the last checkpoint if the time ran out);
#   $TRAIN_ARGS adds options (e.g. "--torch_compile_mode reduce-overhead");
# "transfer": examples/run_fuzzy_boolean.py's pre-training for $TRANSFER_STEPS steps (default 2048) with
#   $TRANSFER_ARGS (default: dynamo's CUDA-graphs backend), once with the batches copied to the GPU without blocking
#   (the scripts' default there) and once with transformers' blocking copy, which synchronises at every step; prints
#   each run's Trainer step and bare step (medians), logs in OUT_DIR/transfer_<true|false>.log;
# "fp32", "bf16": float32 and bf16 autocast without compile (all three models; bf16 with the routing density);
# "compile": bf16 + torch.compile (inductor, default mode);
# "graphs": bf16 + torch.compile(mode="reduce-overhead"), i.e. CUDA graphs, for $GRAPH_MODELS (default: ni-sdpa
#   ni-fused ni-bilinear ni-bilinear-columns ni-eager-aligned vit; compiled on a GPU ni-sdpa runs the eager
#   formulation, ni-fused the same with Eq. 6 through SDPA's fused kernels, ni-bilinear the same with the logits in
#   the bilinear form, ni-bilinear-columns that with Eq. 6 as A @ [C v, C] too, ni-eager-aligned the eager
#   formulation on tokens padded to a multiple of 8); $GRAPH_ARGS adds benchmark.py options (e.g. "--modes training
#   --repeats 3": one compile per model instead of two, so that more models fit the step's time limit);
# "profile": benchmarks/profile_gpu.py --shapes $PROFILE_ARGS (device time per step, the heaviest kernels, the
#   operators by input shape), appended to reports.md;
# "traffic": benchmarks/memory_traffic.py --device cuda --attention A for each A in $TRAFFIC_ATTENTION (default:
#   eager fused bilinear bilinear-columns; the bytes of a step as inductor fuses it for this GPU, and the floor they
#   set at peak bandwidth),
#   OUT_DIR/traffic_A.json, appended to reports.md; $TRAFFIC_LIMIT seconds each.
set -u
out=${1:?usage: gpu_suite.sh OUT_DIR [PART[,PART...]|all], PART one of diagnose tests train transfer fp32 bf16 compile graphs profile traffic}
part=${2:-all}
for name in ${part//,/ }; do # a typo would otherwise run nothing and waste a lent GPU's time
    case $name in
    all | diagnose | tests | train | transfer | fp32 | bf16 | compile | graphs | profile | traffic) ;;
    *)
        echo "gpu_suite.sh: unknown part '$name'; expected all or some of diagnose tests train transfer fp32 bf16 compile graphs profile traffic" >&2
        exit 2
        ;;
    esac
done
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

want() { [ "$part" = all ] || [[ ",$part," == *",$1,"* ]]; }

if want diagnose; then
    echo "== diagnose ($(date -u +%H:%M:%S), limit ${DIAGNOSE_LIMIT:-420}s)"
    timeout "${DIAGNOSE_LIMIT:-420}" "$python" benchmarks/diagnose_compile.py 2>>"$out/suite.log" | tee -a "$out/suite.log"
    echo "== diagnose_sdpa ($(date -u +%H:%M:%S), limit ${DIAGNOSE_SDPA_LIMIT:-300}s)"
    timeout "${DIAGNOSE_SDPA_LIMIT:-300}" "$python" benchmarks/diagnose_sdpa.py --bisect 2>>"$out/suite.log" |
        tee -a "$out/suite.log"
fi
if want tests; then
    echo "== tests ($(date -u +%H:%M:%S))"
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
    "$python" -c "import torch, transformers, ni_hf; print('torch', torch.__version__, '| transformers', transformers.__version__)"
    xdist=$("$python" -c "import xdist" 2>/dev/null && echo "-n 8")
    # shellcheck disable=SC2086
    timeout "${TESTS_LIMIT:-240}" "$python" -m pytest -q -p no:cacheprovider $xdist \
        ${TESTS:-tests/test_compile.py tests/test_modeling_neural_interpreter.py} 2>&1 | tee -a "$out/suite.log" | tail -n 15
fi
data=${GPU_DATA:-.gpu/data}
if want train && [ -d "$data" ]; then
    steps=${TRAIN_STEPS:-2000}
    echo "== train ($(date -u +%H:%M:%S), $steps steps on $data, limit ${TRAIN_LIMIT:-300}s)"
    rm -rf /tmp/ni_train
    # shellcheck disable=SC2086
    timeout "${TRAIN_LIMIT:-300}" "$python" -u examples/run_digits.py --data_dir "$data" --output_dir /tmp/ni_train \
        --max_steps "$steps" --bf16 true --torch_compile true --dataloader_num_workers 8 --dataloader_drop_last true \
        --eval_strategy no --do_eval false --save_strategy steps --save_steps 500 --save_total_limit 1 \
        --logging_steps 100 --report_to none ${TRAIN_ARGS:-} >"$out/train.log" 2>&1
    echo "   exit $? at $(date -u +%H:%M:%S)"
    tr '\r' '\n' <"$out/train.log" | grep -E "it/s\]|s/it\]" | tail -n 3
    grep -o "{'train_runtime[^}]*}" "$out/train.log"
    trained=/tmp/ni_train
    [ -f $trained/model.safetensors ] || trained=$(ls -d /tmp/ni_train/checkpoint-* 2>/dev/null | sort -V | tail -n 1)
    if [ -n "$trained" ]; then
        mkdir -p "$out/model"
        cp "$trained"/{config.json,model.safetensors,preprocessor_config.json} "$out/model/" && echo "   model from $trained"
    fi
fi
if want transfer; then
    for nb in true false; do
        echo "== transfer, non_blocking $nb ($(date -u +%H:%M:%S), limit ${TRANSFER_LIMIT:-150}s)"
        rm -rf "/tmp/ni_transfer_$nb"
        # shellcheck disable=SC2086
        timeout "${TRANSFER_LIMIT:-150}" "$python" -u examples/run_fuzzy_boolean.py --protocol full --settings none \
            --pretrain_max_steps "${TRANSFER_STEPS:-2048}" --save_strategy no --disable_tqdm true --logging_steps 512 \
            --report_to none --accelerator_config "{\"non_blocking\": $nb}" --output_dir "/tmp/ni_transfer_$nb" \
            ${TRANSFER_ARGS---torch_compile true --torch_compile_backend cudagraphs} >"$out/transfer_$nb.log" 2>&1
        echo "   exit $? at $(date -u +%H:%M:%S)"
        { echo "non_blocking $nb:"; grep -h "Pre-training step" "/tmp/ni_transfer_$nb/fuzzy_boolean_results.md"; } |
            tee -a "$out/reports.md"
    done
fi
want fp32 && step cuda_fp32_eager 150 --dtype float32 --models ni-sdpa ni-eager vit --no-density
want bf16 && step cuda_bf16_eager 150 --dtype bfloat16 --models ni-sdpa ni-eager vit
# the host sync of the NaN/inf check: the same eager bf16 steps without it
want bf16 && step cuda_bf16_eager_nocheck 90 --dtype bfloat16 --models ni-sdpa --no-density --no-finite-check
if want compile; then
    step cuda_bf16_compile 300 --dtype bfloat16 --compile --models ni-sdpa ni-fused ni-bilinear ni-bilinear-columns ni-eager-aligned vit \
        --no-density
fi
if want graphs; then
    # shellcheck disable=SC2086
    step cuda_bf16_cudagraphs "${GRAPHS_LIMIT:-300}" --dtype bfloat16 --cuda-graphs --models ${GRAPH_MODELS:-ni-sdpa ni-fused ni-bilinear ni-bilinear-columns ni-eager-aligned vit} \
        --no-density ${GRAPH_ARGS:-}
fi
if want profile; then
    echo "== profile ($(date -u +%H:%M:%S), limit ${PROFILE_LIMIT:-120}s)"
    # shellcheck disable=SC2086
    timeout "${PROFILE_LIMIT:-120}" "$python" benchmarks/profile_gpu.py --top 30 --shapes ${PROFILE_ARGS:-} \
        2>>"$out/suite.log" | tee -a "$out/reports.md"
fi
if want traffic; then
    for attention in ${TRAFFIC_ATTENTION:-eager fused bilinear bilinear-columns}; do
        echo "== traffic, $attention attention ($(date -u +%H:%M:%S), limit ${TRAFFIC_LIMIT:-240}s)"
        timeout "${TRAFFIC_LIMIT:-240}" "$python" benchmarks/memory_traffic.py --device cuda --top 12 \
            --attention "$attention" --output-json "$out/traffic_$attention.json" 2>>"$out/suite.log" |
            tee -a "$out/reports.md"
    done
fi
echo "== done ($(date -u +%H:%M:%S))"
