#!/usr/bin/env bash
# The paper's fuzzy-Boolean experiment (Table 1) on one GPU in one call.
#
#   bash examples/gpu_fuzzy_boolean.sh OUT_DIR [full|reduced|quick]   (run_fuzzy_boolean.py's --preset)
#
# Stage 1 pre-trains the paper's model (its fuzzy_boolean config) once per seed in $SEEDS (default "0 1"), side by side.
# Stage 2 adapts each pre-trained model in six runs side by side: the three settings at the paper's lr 5e-2,
# 'all' at lr 1e-2, and 'type_inference' and 'all' with the new CLS tokens at 5e-2 and the pre-trained parameters
# at 6e-3 (--adapt_pretrained_learning_rate). Several processes share the GPU because one step of this small
# model (25 tokens of width 128) cannot fill it. Each run writes OUT_DIR/<run>/ and OUT_DIR/<run>.log; the tables
# go to OUT_DIR/results.md. With CUDA every run uses dynamo's CUDA-graphs backend (FUZZY_ARGS replaces that;
# FUZZY_ARGS="" runs eagerly). PRETRAIN_LIMIT and ADAPT_LIMIT (seconds, default 330 and 200) bound the stages so
# that one call fits a 10-minute job; a stopped pre-training keeps a checkpoint every 1,024 steps, and running the
# script again with the same OUT_DIR continues from it (and skips a finished one).
set -u
out=${1:?usage: gpu_fuzzy_boolean.sh OUT_DIR [full|reduced|quick]}
preset=${2:-full}
pretrain_limit=${PRETRAIN_LIMIT:-330}
adapt_limit=${ADAPT_LIMIT:-200}
seeds=${SEEDS:-0 1}
mkdir -p "$out"
# Two CPU threads per process: seven processes share the host's cores.
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
python=${PYTHON:-python3}
common=(--preset "$preset" --disable_tqdm true --logging_steps 512 --report_to none)
cuda_graphs=""
"$python" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null &&
    cuda_graphs="--torch_compile true --torch_compile_backend cudagraphs"
# shellcheck disable=SC2206
common+=(${FUZZY_ARGS-$cuda_graphs}) # unset: CUDA graphs where CUDA is available; "": eager

run() { # run SECONDS NAME ARGS... : one run_fuzzy_boolean.py process under `timeout`, its log in OUT_DIR/NAME.log
    local limit=$1 name=$2
    shift 2
    timeout "$limit" "$python" examples/run_fuzzy_boolean.py "${common[@]}" --output_dir "$out/$name" "$@" \
        >"$out/$name.log" 2>&1
    echo "== $name exited with $? at $(date -u +%H:%M:%S)"
}

echo "== start $(date -u +%H:%M:%S), preset $preset, seeds $seeds, stage limits ${pretrain_limit}s + ${adapt_limit}s"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$python" -c "import torch, transformers; print('torch', torch.__version__, '| transformers', transformers.__version__, \
'| cuda', torch.cuda.is_available())"

for seed in $seeds; do # a finished pre-training (its model saved) is not repeated
    [ -f "$out/pretrain_seed$seed/pretrain/config.json" ] && { echo "== pretrain_seed$seed: found its model"; continue; }
    run "$pretrain_limit" "pretrain_seed$seed" --settings none --seed "$seed" --save_strategy steps --save_steps 1024 \
        --save_total_limit 1 --resume_from_checkpoint last &
done
wait

for seed in $seeds; do
    model="$out/pretrain_seed$seed/pretrain"
    [ -f "$model/config.json" ] || { echo "!! no pre-trained model in $model: stage 2 skipped for seed $seed"; continue; }
    for setting in cls_tokens type_inference all; do
        run "$adapt_limit" "seed${seed}_$setting" --pretrained_model "$model" --settings "$setting" --save_strategy no &
    done
    run "$adapt_limit" "seed${seed}_all_lr1e-2" --pretrained_model "$model" --settings all --adapt_learning_rate 0.01 \
        --save_strategy no &
    for setting in type_inference all; do
        run "$adapt_limit" "seed${seed}_${setting}_two_rates" --pretrained_model "$model" --settings "$setting" \
            --adapt_pretrained_learning_rate 0.006 --save_strategy no &
    done
done
wait

for f in "$out"/*/fuzzy_boolean_results.md; do
    [ -f "$f" ] && { echo "### $(basename "$(dirname "$f")")"; cat "$f"; echo; }
done >"$out/results.md"
cat "$out/results.md"
echo "== done $(date -u +%H:%M:%S)"
