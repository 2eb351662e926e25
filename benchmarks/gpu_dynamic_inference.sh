#!/usr/bin/env bash
# Study (a) of the paper's dynamic-inference claims (issue 56) at paper scale, in one GPU call of at most 9 minutes:
#
#   bash benchmarks/gpu_dynamic_inference.sh OUT_DIR
#   DRY_RUN=1 bash benchmarks/gpu_dynamic_inference.sh OUT_DIR    # the same steps on a CPU with tiny models
#
# 1. pretrain: examples/run_digits.py --preset paper trains the paper's digits Neural Interpreter and, side by side
#    on the same GPU, the multi-task ViT baseline (--architecture vit) on MNIST + MNIST-M from $GPU_DATA (default
#    .gpu/data, made by benchmarks/prepare_device_files.sh): the same epochs, batches of 128 and RandAugment, bf16,
#    torch.compile with CUDA graphs (COMPILE_MODE, default reduce-overhead, empty for inductor's default; a run that
#    fails with CUDA graphs, not by its time limit, is retried once in inductor's default mode with the time left).
#    Each evaluates on the test sets at the end: OUT_DIR/{ni,vit}_pretrained/ (the checkpoint, eval_results.json)
#    and OUT_DIR/{ni,vit}_pretrain.log.
# 2. adapt: examples/run_digits_adaptation.py --studies fast_adaptation fine-tunes each on N = NUM_TRAIN_SAMPLES
#    (64 ... 8192) Fashion-MNIST images for the paper's 10 epochs (RAdam at 0.05 for the NI, 0.03 for the ViT), side
#    by side, bf16, compiled in inductor's default mode (ADAPT_COMPILE_MODE; a fresh model per run reuses the
#    compiled code, CUDA graphs would be recorded anew for each): OUT_DIR/{ni,vit}_adaptation/adaptation_results.*
# 3. plots: examples/plot_adaptation_studies.py over both results: OUT_DIR/plots/ (skipped if the script is absent).
# OUT_DIR/summary.md gathers the plan, the test accuracies, any early stop and the adaptation tables.
#
# Time. BUDGET_S (540) is the call's; every step runs under `timeout`, cut to what is left of it. Epochs: EPOCHS, by
# default as many as should fit in the pre-training's time (PRETRAIN_S 210 for the stage, less PRETRAIN_TAIL_S 70
# for start-up, data, saving, the compiled evaluation and the model card) at NI_IMAGES_PER_S (4,000: an H200 trained
# the preset at 5,985 images/s with bf16 and CUDA graphs in benchmark.py, without data loading, RandAugment or the
# ViT beside it) after COMPILE_S (50) of compilation: 5 epochs of the 70,000 images of .gpu/data. The cosine
# schedule is planned for those epochs; --max_train_minutes (the stage's time less the tail) only guards the call:
# if a slower run hits it, training stops before the schedule's end, the log and summary.md say at which epoch,
# and the next call should set EPOCHS lower. Seeds: ADAPT_SEEDS, by default as many of 0 .. MAX_SEEDS-1 (3) as fit
# in what is left after the pre-training (less PLOTS_S 30): ADAPT_FIXED_S (90: start-up, data, compiling steps of
# batch 64 and 128) plus, per seed, sum(N) x 10 epochs at ADAPT_IMAGES_PER_S (3,000; benchmark.py: 3,443 compiled
# without CUDA graphs on an H100) and ADAPT_RUN_S (3) per run: 78 s a seed, 2 or 3 seeds with the defaults. All
# of these are estimates from benchmark speeds: the logs of a first call give the measured ones.
#
# DRY_RUN=1 (tests/test_gpu_dynamic_inference.py): on the CPU, no bf16 or compilation, tiny models
# (--config_overrides), 16 training and 8 test images per dataset, N = 64 for one epoch, one seed, 16 test images.
# PLAN_ONLY=1 prints the plan and every command line (one per line, "+ NAME: ...") and runs none of them.
# Also: NUM_TRAIN_SAMPLES, ADAPT_EPOCHS, MAX_TRAIN_SAMPLES and MAX_EVAL_SAMPLES (per dataset, pre-training),
# WORKERS (DataLoader workers per run, 6); PRETRAIN_ARGS and ADAPT_ARGS add options to every run of a stage; PYTHON
# names the interpreter (python3). Runs from any folder; OUT_DIR and GPU_DATA may be relative to it.
set -u
usage="usage: [DRY_RUN=1] gpu_dynamic_inference.sh OUT_DIR"
out=${1:?$usage}
mkdir -p "$out" && out=$(cd "$out" && pwd) || exit 2
if [ -n "${GPU_DATA:-}" ] && [ -d "$GPU_DATA" ]; then GPU_DATA=$(cd "$GPU_DATA" && pwd); fi
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
python=${PYTHON:-python3}
data=${GPU_DATA:-.gpu/data}
dry=${DRY_RUN:-0}
plan_only=${PLAN_ONLY:-0}
now() { date -u +%H:%M:%S; }

if [ "$dry" = 1 ]; then # seconds and speeds of a 2-core CPU, tiny models
    : "${BUDGET_S:=300}" "${PRETRAIN_S:=150}" "${PRETRAIN_TAIL_S:=90}" "${COMPILE_S:=0}" "${NI_IMAGES_PER_S:=1}"
    : "${ADAPT_FIXED_S:=30}" "${ADAPT_IMAGES_PER_S:=50}" "${ADAPT_RUN_S:=5}" "${MAX_SEEDS:=1}" "${PLOTS_S:=60}"
    : "${NUM_TRAIN_SAMPLES:=64}" "${ADAPT_EPOCHS:=1}" "${MAX_TRAIN_SAMPLES:=16}" "${MAX_EVAL_SAMPLES:=8}"
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
    device_args=(--use_cpu true --dataloader_num_workers 0)
    pretrain_device=(--per_device_train_batch_size 8 --logging_steps 1
        --max_train_samples "$MAX_TRAIN_SAMPLES" --max_eval_samples "$MAX_EVAL_SAMPLES")
    ni_config=(--config_overrides "hidden_size=16,code_dim=8,num_function_iterations=1,num_functions=2,\
num_attention_heads=2,attention_head_size=4,type_inference_hidden_size=8,type_dim=4,patch_size=8")
    vit_config=(--config_overrides "hidden_size=16,num_hidden_layers=1,num_attention_heads=2,intermediate_size=16,\
patch_size=8")
    adapt_device=(--batch_size 32 --max_eval_samples 16 --eval_batch_size 16)
    compile_mode=""
    adapt_compile_mode=""
else
    : "${BUDGET_S:=540}" "${PRETRAIN_S:=210}" "${PRETRAIN_TAIL_S:=70}" "${COMPILE_S:=50}" "${NI_IMAGES_PER_S:=4000}"
    : "${ADAPT_FIXED_S:=90}" "${ADAPT_IMAGES_PER_S:=3000}" "${ADAPT_RUN_S:=3}" "${MAX_SEEDS:=3}" "${PLOTS_S:=30}"
    : "${NUM_TRAIN_SAMPLES:=64 128 256 512 1024 2048 4096 8192}" "${ADAPT_EPOCHS:=10}"
    : "${MAX_TRAIN_SAMPLES:=}" "${MAX_EVAL_SAMPLES:=}"
    # Two runs share the machine in each stage: six DataLoader workers each.
    device_args=(--bf16 true --torch_compile true --dataloader_num_workers "${WORKERS:-6}")
    pretrain_device=(--logging_steps 100)
    ni_config=()
    vit_config=()
    adapt_device=()
    compile_mode=${COMPILE_MODE-reduce-overhead}
    adapt_compile_mode=${ADAPT_COMPILE_MODE-}
fi
deadline=$((SECONDS + BUDGET_S))
limit() { # limit WANTED RESERVE: WANTED seconds, or what is left of the budget after RESERVE if that is less
    local left=$((deadline - SECONDS - $2))
    echo $((left < $1 ? left : $1))
}
run_step() { # run_step LIMIT NAME COMMAND...: COMMAND under `timeout LIMIT`, its output in OUT_DIR/NAME.log
    local limit=$1 name=$2 began=$SECONDS rc
    shift 2
    if ((limit < 5)); then
        echo "!! $name skipped at $(now): no time left" | tee -a "$out/$name.log"
        return 125
    fi
    if [ "$plan_only" = 1 ]; then
        echo "+ $name: $(printf '%q ' "$@")"
        return 0
    fi
    echo "== $name started at $(now), limit ${limit}s"
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    rc=$?
    echo "== $name exited $rc at $(now) after $((SECONDS - began))s$([ $rc = 124 ] && echo ', stopped by its limit')"
    [ $rc = 0 ] || tail -n 5 "$out/$name.log" | sed 's/^/   | /'
    return $rc
}

echo "== start $(now), budget ${BUDGET_S}s, data $data$([ "$dry" = 1 ] && echo ', DRY_RUN')" | tee "$out/call.log"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$out/call.log"
fi
"$python" -c "import torch, transformers; print('torch', torch.__version__, '| transformers', \
transformers.__version__, '| cuda', torch.cuda.is_available())" | tee -a "$out/call.log"

# The plan: images per epoch and the evaluation batch from the Parquet files' metadata; the epochs that fit.
plan=$(GUARD_S=$((PRETRAIN_S - PRETRAIN_TAIL_S)) COMPILE_S=$COMPILE_S NI_IMAGES_PER_S=$NI_IMAGES_PER_S \
    EPOCHS=${EPOCHS:-} MAX_TRAIN_SAMPLES=$MAX_TRAIN_SAMPLES MAX_EVAL_SAMPLES=$MAX_EVAL_SAMPLES \
    "$python" - "$data" <<'PY'
import math, os, sys
import pyarrow.parquet as pq

def rows(task: str, split: str, cap: str) -> int:
    n = pq.ParquetFile(f"{sys.argv[1]}/{task}/{split}.parquet").metadata.num_rows
    return min(n, int(cap)) if cap else n

env = os.environ
train = sum(rows(t, "train", env["MAX_TRAIN_SAMPLES"]) for t in ("mnist", "mnist_m"))
test = sum(rows(t, "test", env["MAX_EVAL_SAMPLES"]) for t in ("mnist", "mnist_m"))
seconds = float(env["GUARD_S"]) - float(env["COMPILE_S"])
epochs = env.get("EPOCHS") or max(1, math.floor(seconds * float(env["NI_IMAGES_PER_S"]) / train))
# Evaluation batches that divide the test set: the training's smaller last batch can be dropped (it would be compiled
# as a graph of its own) without dropping test images; a test set with no such divisor keeps every last batch.
eval_batch = max(d for d in range(1, min(256, test) + 1) if test % d == 0)
drop_last = "true" if eval_batch >= min(32, test) else "false"
eval_batch = eval_batch if drop_last == "true" else 256
print(f"train_images={train} test_images={test} epochs={epochs} eval_batch={eval_batch} drop_last={drop_last}")
PY
) || {
    echo "!! no plan: is $data there (bash benchmarks/prepare_device_files.sh)?"
    exit 1
}
eval "$plan"
guard_s=$((PRETRAIN_S - PRETRAIN_TAIL_S))
echo "== plan: $epochs epochs of $train_images images (MNIST + MNIST-M), pre-training stage ${PRETRAIN_S}s, \
training stopped after at most ${guard_s}s; $test_images test images in batches of $eval_batch" |
    tee -a "$out/call.log"

# 1. Pre-training, the Neural Interpreter and the ViT side by side.
pretrain_args=(--preset paper --dataset_source local --data_dir "$data" --task_names mnist mnist_m
    --num_train_epochs "$epochs" --eval_strategy no --save_strategy no --report_to none --disable_tqdm true
    --dataloader_drop_last "$drop_last" --per_device_eval_batch_size "$eval_batch" --seed 0
    "${device_args[@]}" "${pretrain_device[@]}")
# shellcheck disable=SC2206
pretrain_args+=(${PRETRAIN_ARGS:-})
stage_end=$((SECONDS + $(limit "$PRETRAIN_S" $((PLOTS_S + ADAPT_FIXED_S)))))
pretrain() { # pretrain NAME ARGS...: one run_digits.py, retried once without CUDA graphs if it failed with them
    local name=$1 mode=$compile_mode left rc
    shift
    while true; do
        left=$((stage_end - SECONDS))
        if ((left - PRETRAIN_TAIL_S < 10)); then
            echo "!! ${name}_pretrain skipped at $(now): no time left" | tee -a "$out/${name}_pretrain.log"
            return 125
        fi
        rm -rf "${out:?}/${name}_pretrained"
        run_step "$left" "${name}_pretrain" "$python" -u examples/run_digits.py "${pretrain_args[@]}" "$@" \
            --output_dir "$out/${name}_pretrained" ${mode:+--torch_compile_mode "$mode"} \
            --max_train_minutes "$(awk "BEGIN { printf \"%.2f\", ($left - $PRETRAIN_TAIL_S) / 60 }")"
        rc=$?
        [[ -z $mode || $rc == 0 || $rc == 124 ]] && return $rc
        mv "$out/${name}_pretrain.log" "$out/${name}_pretrain.$mode.log"
        echo "!! ${name}_pretrain failed with --torch_compile_mode $mode: again in inductor's default mode"
        mode=""
    done
}
pretrain ni "${ni_config[@]}" &
pretrain vit --architecture vit "${vit_config[@]}" &
wait

# 2. Study (a), fast adaptation to Fashion-MNIST, both models side by side, the same sizes and seeds.
read -ra sizes <<<"$NUM_TRAIN_SAMPLES"
adapt_limit=$(limit 100000 "$PLOTS_S")
if [ -n "${ADAPT_SEEDS:-}" ]; then
    read -ra seeds <<<"$ADAPT_SEEDS"
else
    read -ra seeds <<<"$(awk -v left="$adapt_limit" -v fixed="$ADAPT_FIXED_S" -v ips="$ADAPT_IMAGES_PER_S" \
        -v run="$ADAPT_RUN_S" -v epochs="$ADAPT_EPOCHS" -v most="$MAX_SEEDS" -v sizes="$NUM_TRAIN_SAMPLES" 'BEGIN {
        n = split(sizes, s, " "); total = 0; for (i = 1; i <= n; i++) total += s[i]
        per_seed = total * epochs / ips + n * run
        k = int((left - fixed) / per_seed); if (k > most) k = most; if (k < 1) k = 1
        for (i = 0; i < k; i++) printf "%d ", i }')"
fi
echo "== plan: fast adaptation, N = ${sizes[*]}, seeds ${seeds[*]}, $ADAPT_EPOCHS epochs, within ${adapt_limit}s" |
    tee -a "$out/call.log"
adapt_args=(--studies fast_adaptation --new_task fashion_mnist --dataset_source local --data_dir "$data"
    --num_train_samples "${sizes[@]}" --adaptation_seeds "${seeds[@]}" --adapt_epochs "$ADAPT_EPOCHS"
    --report_to none "${device_args[@]}" "${adapt_device[@]}")
# shellcheck disable=SC2206
adapt_args+=(${adapt_compile_mode:+--torch_compile_mode $adapt_compile_mode} ${ADAPT_ARGS:-})
adapt() { # adapt NAME LEARNING_RATE
    if [ "$plan_only" != 1 ] && [ ! -f "$out/$1_pretrained/config.json" ]; then
        echo "!! $1_adapt skipped: no pre-trained model in $out/$1_pretrained" | tee "$out/$1_adapt.log"
        return 1
    fi
    run_step "$adapt_limit" "$1_adapt" "$python" -u examples/run_digits_adaptation.py "${adapt_args[@]}" \
        --model_name_or_path "$out/$1_pretrained" --adapt_learning_rate "$2" --output_dir "$out/$1_adaptation"
}
adapt ni 0.05 &
adapt vit 0.03 &
wait

[ "$plan_only" = 1 ] && exit 0

# 3. Plots of both results.
results=()
for name in ni vit; do
    file=$out/${name}_adaptation/adaptation_results.json
    [ -f "$file" ] && results+=("$file")
done
if [ ! -f examples/plot_adaptation_studies.py ]; then
    echo "-- no plots: examples/plot_adaptation_studies.py is not there"
elif [ ${#results[@]} = 0 ]; then
    echo "!! no plots: no adaptation results"
else
    run_step "$(limit "$PLOTS_S" 0)" plots "$python" examples/plot_adaptation_studies.py "${results[@]}" \
        --output_dir "$out/plots"
fi

{
    # The device machine's copy of .git can be older than the working tree it runs: the caller names the commit.
    commit=${NI_HF_COMMIT:-"$(git rev-parse --short HEAD 2>/dev/null || echo unknown) (the machine's .git; NI_HF_COMMIT not given)"}
    echo "# Study (a) on one GPU: $(date -u +%Y-%m-%d), commit $commit"
    echo
    sed 's/^/    /' "$out/call.log"
    for name in ni vit; do
        echo
        echo "## ${name}: pre-training and test accuracy"
        echo
        grep -ho "{'train_runtime[^}]*}\|stopped training early.*\|Test accuracy.*" "$out/${name}_pretrain.log" |
            sed 's/^/- /'
        echo
        echo "## ${name}: fast adaptation to Fashion-MNIST"
        echo
        if ! cat "$out/${name}_adaptation/adaptation_results.md" 2>/dev/null; then
            echo "No results written (see ${name}_adapt.log); the runs that finished:"
            echo
            grep -ho "fast_adaptation: training samples.*" "$out/${name}_adapt.log" | sed 's/^/- /'
        fi
    done
    if [ -d "$out/plots" ]; then
        echo
        echo "## Plots"
        echo
        find "$out/plots" -type f | sort | sed "s|^$out/|- |"
    fi
} >"$out/summary.md" 2>/dev/null
missing=()
for path in ni_pretrained/model.safetensors vit_pretrained/model.safetensors ni_adaptation/adaptation_results.json \
    vit_adaptation/adaptation_results.json; do
    [ -f "$out/$path" ] || missing+=("$path")
done
[ -f examples/plot_adaptation_studies.py ] && [ ! -d "$out/plots" ] && missing+=(plots/)
echo "== done at $(now), $((SECONDS + BUDGET_S - deadline))s; summary in $out/summary.md"
if [ ${#missing[@]} != 0 ]; then
    echo "!! missing in $out: ${missing[*]}"
    exit 1
fi
