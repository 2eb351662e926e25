#!/usr/bin/env bash
# PGM abstract reasoning (section 4.3) at the paper's model size, in one GPU call of at most 9 minutes:
#
#   bash benchmarks/gpu_pgm.sh OUT_DIR
#   DRY_RUN=1 bash benchmarks/gpu_pgm.sh OUT_DIR     # the same steps on a CPU, --preset quick sized
#   PLAN_ONLY=1 bash benchmarks/gpu_pgm.sh OUT_DIR   # prints the plan and the command lines, runs nothing
#
# On the device machine, with `.whl` carried (benchmarks/prepare_device_files.sh: the image lacks datasets and
# may hold an older transformers); no data travels, the package's generator makes the puzzles there:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl &&
#       export PYTHONPATH=/tmp/site && bash benchmarks/gpu_pgm.sh "$OUT"
#
# 1. For each regime of REGIMES (default: REGIME, default neutral; several run one after another, each given an
#    equal share of the time left), examples/run_pgm.py --preset paper trains the paper's Neural Interpreter for
#    that regime and, side by side on the same GPU, the ViT baseline (--architecture vit) on NUM_TRAIN_PUZZLES
#    (20,000) generated puzzles of 80x80 panels with up to 4 triples: the same epochs, batches of 72, RAdam with
#    the cosine schedule, --bf16 true. Each evaluates on NUM_EVAL_PUZZLES (1,000) val (in distribution) and test
#    (out of distribution) puzzles, the Neural Interpreter also with 1..8 function iterations per script (the
#    anytime curve). Runs go to RUNS_DIR/<regime>/{ni,vit}/, their logs to RUNS_DIR/<regime>_{ni,vit}.log
#    (RUNS_DIR: default $TMPDIR/gpu_pgm_runs, outside OUT_DIR, since a device call brings back 8 files at most).
# 2. examples/plot_pgm.py over every pgm_results.json: OUT_DIR/pgm_tables.md, pgm_summary.json,
#    pgm_accuracy.png, pgm_anytime.png.
# OUT_DIR also gets call.log (the plan), summary.md (the plan, each run's training time, accuracies and any early
# stop, the tables) and runs.tar.gz (each run's pgm_results.json, model card and log, and its weights with
# KEEP_WEIGHTS=1): seven files.
#
# Time. BUDGET_S (540) is the call's; every step runs under `timeout`, cut to what is left of it, PLOTS_S (30)
# kept for the plots and the summary. A regime's stage gets the time left divided by the regimes still to run;
# TAIL_S (100) of it goes to start-up (imports, CUDA, the model: about 30 s), the evaluations (the Neural
# Interpreter's 18 passes over the val and test puzzles, 18,000 puzzles at about 600/s: 30 s), saving and the
# model card; --max_train_minutes stops training after the rest. Epochs: EPOCHS, by default as many as fit in
# that time at PUZZLES_PER_S (330) training puzzles per second for each of the two runs, at least 1.
# PUZZLES_PER_S is the slower run's measured speed: on one H200 (2026-12-04, bf16, the two runs side by side, 7
# DataLoader workers each generating the puzzles), the Neural Interpreter trained at 329.9 puzzles/s and the ViT at
# 818.6 (docs/pgm/gpu). The cosine schedule is planned for those epochs; if a slower run hits the guard, training
# stops before the schedule's end, the log and summary.md say at which epoch (train_samples_per_second in
# summary.md is the measured speed) and the next call should set EPOCHS or PUZZLES_PER_S from it. COMPILE=1
# adds --torch_compile true (it would cut the launches, but compiling 16 unrolled function iterations costs
# minutes of the call).
#
# DRY_RUN=1 (tests/test_gpu_pgm.py): on the CPU, --preset quick (its tiny models and 16x16 panels), 64 training
# and 32 val and test puzzles, one epoch, one DataLoader worker, no bf16.
# Also: SEED (0, the training seed; the puzzles are the generator's seed 0), RUN_ARGS adds options to every run,
# PYTHON names the interpreter (python3). Runs from any folder; OUT_DIR and RUNS_DIR may be relative to it.
set -u
usage="usage: [DRY_RUN=1] [PLAN_ONLY=1] gpu_pgm.sh OUT_DIR"
out=${1:?$usage}
mkdir -p "$out" && out=$(cd "$out" && pwd) || exit 2
runs=${RUNS_DIR:-${TMPDIR:-/tmp}/gpu_pgm_runs}
mkdir -p "$runs" && runs=$(cd "$runs" && pwd) || exit 2
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
export MPLBACKEND=Agg
python=${PYTHON:-python3}
dry=${DRY_RUN:-0}
plan_only=${PLAN_ONLY:-0}
now() { date -u +%H:%M:%S; }

if [ "$dry" = 1 ]; then # seconds and speeds of a 2-core CPU, tiny models
    : "${BUDGET_S:=240}" "${PLOTS_S:=60}" "${TAIL_S:=90}" "${PUZZLES_PER_S:=0.5}" "${MIN_TRAIN_S:=10}"
    : "${NUM_TRAIN_PUZZLES:=64}" "${NUM_EVAL_PUZZLES:=32}" "${WORKERS:=1}"
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
    preset=quick
    device_args=(--use_cpu true)
else
    : "${BUDGET_S:=540}" "${PLOTS_S:=30}" "${TAIL_S:=100}" "${PUZZLES_PER_S:=330}" "${MIN_TRAIN_S:=60}"
    : "${NUM_TRAIN_PUZZLES:=20000}" "${NUM_EVAL_PUZZLES:=1000}" "${WORKERS:=7}"
    preset=paper
    device_args=(--bf16 true --logging_steps 50)
    [ "${COMPILE:-0}" = 1 ] && device_args+=(--torch_compile true)
fi
read -ra regimes <<<"${REGIMES:-${REGIME:-neutral}}"
deadline=$((SECONDS + BUDGET_S))
run_step() { # run_step LIMIT NAME COMMAND...: COMMAND under `timeout LIMIT`, its output in RUNS_DIR/NAME.log
    local limit=$1 name=$2 began=$SECONDS rc
    shift 2
    if [ "$plan_only" = 1 ]; then
        echo "+ $name: $(printf '%q ' "$@")"
        return 0
    fi
    echo "== $name started at $(now), limit ${limit}s"
    timeout "$limit" "$@" >"$runs/$name.log" 2>&1
    rc=$?
    echo "== $name exited $rc at $(now) after $((SECONDS - began))s$([ $rc = 124 ] && echo ', stopped by its limit')"
    [ $rc = 0 ] || tail -n 5 "$runs/$name.log" | sed 's/^/   | /'
    return $rc
}
side_by_side() { # side_by_side COMMAND...: COMMAND in the background (PLAN_ONLY: in order, for a stable plan)
    if [ "$plan_only" = 1 ]; then "$@"; else "$@" & fi
}

echo "== start $(now), budget ${BUDGET_S}s, regimes ${regimes[*]}, runs in $runs$([ "$dry" = 1 ] && echo ', DRY_RUN')" |
    tee "$out/call.log"
if [ "$plan_only" != 1 ]; then
    rm -f "$out"/pgm_{tables.md,summary.json,accuracy.png,anytime.png} "$out/summary.md" "$out/runs.tar.gz"
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$out/call.log"
    fi
    "$python" -c "import datasets, matplotlib, torch, transformers, ni_hf; print('torch', torch.__version__, \
'| transformers', transformers.__version__, '| datasets', datasets.__version__, '| cuda', \
torch.cuda.is_available())" 2>&1 | tee -a "$out/call.log"
    if [ "${PIPESTATUS[0]}" != 0 ]; then
        echo "!! the interpreter lacks a package: carry .whl (bash benchmarks/prepare_device_files.sh) and install it"
        exit 1
    fi
fi

# 1. Each regime: the Neural Interpreter and the ViT side by side, the same puzzles and epochs.
run_args=(--preset "$preset" --dataset_source generated --num_train_puzzles "$NUM_TRAIN_PUZZLES"
    --num_eval_puzzles "$NUM_EVAL_PUZZLES" --eval_strategy no --save_strategy no --report_to none
    --disable_tqdm true --dataloader_num_workers "$WORKERS" --seed "${SEED:-0}" "${device_args[@]}")
# shellcheck disable=SC2206
run_args+=(${RUN_ARGS:-})
done_regimes=()
planned=0 # PLAN_ONLY: the seconds the stages before would have taken
for i in "${!regimes[@]}"; do
    regime=${regimes[$i]}
    stage_s=$(((deadline - SECONDS - planned - PLOTS_S) / (${#regimes[@]} - i)))
    train_s=$((stage_s - TAIL_S))
    if ((train_s < MIN_TRAIN_S)); then
        echo "!! $regime skipped at $(now): ${stage_s}s left for its stage, under ${TAIL_S}s + ${MIN_TRAIN_S}s" |
            tee -a "$out/call.log"
        continue
    fi
    epochs=${EPOCHS:-$(awk -v s="$train_s" -v r="$PUZZLES_PER_S" -v n="$NUM_TRAIN_PUZZLES" \
        'BEGIN { e = int(s * r / n); print (e < 1 ? 1 : e) }')}
    minutes=$(awk -v s="$train_s" 'BEGIN { printf "%.2f", s / 60 }')
    echo "== plan: $regime: $epochs epochs of $NUM_TRAIN_PUZZLES puzzles, $NUM_EVAL_PUZZLES val and test puzzles; \
stage ${stage_s}s, training stopped after at most ${train_s}s (--max_train_minutes $minutes)" | tee -a "$out/call.log"
    for name in ni vit; do
        architecture=$([ $name = ni ] && echo neural_interpreter || echo vit)
        rm -rf "${runs:?}/$regime/$name" "$runs/${regime}_$name.log"
        side_by_side run_step "$stage_s" "${regime}_$name" "$python" -u examples/run_pgm.py "${run_args[@]}" \
            --regime "$regime" --architecture "$architecture" --num_train_epochs "$epochs" \
            --max_train_minutes "$minutes" --output_dir "$runs/$regime/$name"
    done
    wait
    [ "$plan_only" = 1 ] && planned=$((planned + stage_s))
    done_regimes+=("$regime")
done

[ "$plan_only" = 1 ] && exit 0

# 2. Tables and plots of every result.
results=()
for regime in "${done_regimes[@]}"; do
    for name in ni vit; do
        file=$runs/$regime/$name/pgm_results.json
        [ -f "$file" ] && results+=("$file")
    done
done
if [ ${#results[@]} = 0 ]; then
    echo "!! no plots: no pgm_results.json"
else
    left=$((deadline - SECONDS))
    run_step "$((left < 10 ? 10 : left))" plots "$python" examples/plot_pgm.py --results "${results[@]}" \
        --output_dir "$out"
fi

{
    # The device machine's copy of .git can be older than the working tree it runs: the caller names the commit.
    commit=${NI_HF_COMMIT:-"$(git rev-parse --short HEAD 2>/dev/null || echo unknown) (the machine's .git; NI_HF_COMMIT not given)"}
    echo "# PGM on one GPU: $(date -u +%Y-%m-%d), commit $commit"
    echo
    sed 's/^/    /' "$out/call.log"
    for regime in "${done_regimes[@]}"; do
        for name in ni vit; do
            echo
            echo "## $regime, $name: training and accuracy"
            echo
            grep -ho "{'train_runtime[^}]*}\|stopped training early.*\|\(val\|test\) (\(in\|out of\) distribution).*" \
                "$runs/${regime}_$name.log" | sed 's/^/- /'
        done
    done
    echo
    if [ -f "$out/pgm_tables.md" ]; then
        sed 's/^#/##/' "$out/pgm_tables.md"
    else
        echo "No tables (see plots.log in runs.tar.gz)."
    fi
} >"$out/summary.md" 2>/dev/null

packed=()
for regime in "${done_regimes[@]}"; do
    for path in "$regime" "${regime}_ni.log" "${regime}_vit.log"; do
        [ -e "$runs/$path" ] && packed+=("$path")
    done
done
[ -f "$runs/plots.log" ] && packed+=(plots.log)
keep=(--exclude='checkpoint-*' --exclude='*.py')
[ "${KEEP_WEIGHTS:-0}" = 1 ] || keep+=(--exclude='*.safetensors' --exclude='*.bin')
if [ ${#packed[@]} != 0 ]; then
    tar -czf "$out/runs.tar.gz" "${keep[@]}" -C "$runs" "${packed[@]}" || echo "!! runs.tar.gz not written"
fi
missing=()
for regime in "${regimes[@]}"; do
    for name in ni vit; do
        [ -f "$runs/$regime/$name/pgm_results.json" ] || missing+=("$regime/$name/pgm_results.json")
    done
done
for file in pgm_tables.md pgm_summary.json pgm_accuracy.png pgm_anytime.png; do
    [ -f "$out/$file" ] || missing+=("$file")
done
echo "== done at $(now), $((SECONDS + BUDGET_S - deadline))s; summary in $out/summary.md"
if [ ${#missing[@]} != 0 ]; then
    echo "!! missing: ${missing[*]}"
    exit 1
fi
