#!/usr/bin/env bash
# The checks that need a GPU, as one script (about 8 minutes on one GPU): training on the accelerator, the
# chapter's bf16 mismatch measurement on a randomly initialised model of Qwen3-0.6B's shape with lrl's
# imitation engine and, where the vllm package is installed (pip install vllm), with vLLM, and the engine
# benchmark at that size. Figures go to $OUT (default results/gpu); put them, with the GPU named, in
# docs/engine.md.
#
#   bash bench/gpu_check.sh            # from the repository root; PYTHONPATH=. is enough where torch,
#                                      # lightning, transformers and tensorboard are installed
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/gpu}
mkdir -p "$OUT"
export PYTHONPATH=.
step() {  # step NAME SECONDS COMMAND...: run with a time limit, keep its output, never stop the script
  local name=$1 limit=$2
  shift 2
  echo "== $name" | tee -a "$OUT/summary.txt"
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "   exit $? ($name)" | tee -a "$OUT/summary.txt"
  tail -n 25 "$OUT/$name.log"
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
step train_gpu 120 python train.py --accelerator gpu --max-steps 5 --eval-every 5 --progress false \
  --log-dir "$OUT/runs" --history-file "$OUT/train_gpu.jsonl"
step mismatch_engine 150 python -m lrl.mismatch --device cuda --random-model qwen3-0.6b --engine-dtype bfloat16 \
  --ragged --engine-batch --json "$OUT/mismatch_engine.json"
if python -c "import vllm" > /dev/null 2>&1; then
  step mismatch_vllm 180 python -m lrl.mismatch --device cuda --random-model qwen3-0.6b --sampler vllm \
    --vllm-dtype bfloat16 --ragged --engine-batch --json "$OUT/mismatch_vllm.json"
else
  echo "== mismatch_vllm skipped: vllm is not installed (pip install vllm)" | tee -a "$OUT/summary.txt"
fi
step bench_engine 90 python bench/bench_engine.py --shape qwen3-0.6b --device cuda --dtype bfloat16 \
  --prompts 30 --new-tokens 32 --repeats 2
cat "$OUT/summary.txt"
