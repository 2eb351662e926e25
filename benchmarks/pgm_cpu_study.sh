#!/usr/bin/env bash
# The CPU-scale Table 2: the Neural Interpreter, the ViT and the context-blind baseline (the panel CNN and scorer
# seeing the candidates only) on generated PGM regimes, over seeds, one run at a time; then the tables and plots.
#
#   bash benchmarks/pgm_cpu_study.sh OUT_DIR                 # every run, then examples/plot_pgm.py
#   PLAN_ONLY=1 bash benchmarks/pgm_cpu_study.sh OUT_DIR     # print the commands, run nothing
#
# Each run is examples/run_pgm.py --preset cpu with puzzles of 1 to MAX_TRIPLES triples; its pgm_results.json lands
# in OUT_DIR/runs/<architecture>-<regime>-s<seed>/ and its log beside it. A run whose results file exists is
# skipped, so the study can be stopped and started again. Settings (environment): REGIMES, SEEDS, ARCHITECTURES,
# MAX_TRIPLES (4), FREE_ATTRIBUTES (constant), EXTRA (more run_pgm.py flags, e.g. "--num_train_epochs 4").
set -euo pipefail
out=${1:?usage: bash benchmarks/pgm_cpu_study.sh OUT_DIR}
cd "$(dirname "$0")/.."
python=${PYTHON:-python}
read -r -a regimes <<<"${REGIMES:-neutral interpolation attr.rels attrs.pairs extrapolation}"
read -r -a seeds <<<"${SEEDS:-42 7}"
read -r -a architectures <<<"${ARCHITECTURES:-candidates_only vit neural_interpreter}"
read -r -a extra <<<"${EXTRA:-}"
mkdir -p "$out/runs"

for seed in "${seeds[@]}"; do
    for regime in "${regimes[@]}"; do
        for architecture in "${architectures[@]}"; do
            run="$out/runs/$architecture-$regime-s$seed"
            command=("$python" examples/run_pgm.py --preset cpu --regime "$regime" --architecture "$architecture"
                --max_triples "${MAX_TRIPLES:-4}" --free_attributes "${FREE_ATTRIBUTES:-constant}" --seed "$seed"
                --output_dir "$run" --report_to none --disable_tqdm true "${extra[@]}")
            if [ -n "${PLAN_ONLY:-}" ]; then
                echo "${command[*]}"
                continue
            fi
            if [ -f "$run/pgm_results.json" ]; then
                echo "$(date -u +%FT%TZ) skip $run (done)"
                continue
            fi
            mkdir -p "$run"
            echo "$(date -u +%FT%TZ) start $run"
            OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} "${command[@]}" >"$run/log.txt" 2>&1 || echo "failed: $run"
            echo "$(date -u +%FT%TZ) end $run"
        done
    done
done
[ -n "${PLAN_ONLY:-}" ] || "$python" examples/plot_pgm.py --results "$out"/runs/*/pgm_results.json --output_dir "$out"
