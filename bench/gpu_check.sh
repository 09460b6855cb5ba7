#!/usr/bin/env bash
# The checks that need a GPU, as one script (at most GPU_CHECK_SECONDS, 480 by default, on one GPU):
#   tiny     training on the accelerator (TinyAgent, 5 steps)
#   smollm2  the trained model (--model smollm2-135m, where its wheel is installed): the chapter's mismatch table
#            (bf16 and fp32 trainer against the bf16 KV-cache engine, batch 1 against 30, the fp32 engine, FP8)
#            and the calc recipe trained on the GPU (held-out at steps 0, 10, 20, 30)
#   qwen3    the bf16 mismatch on a randomly initialised model of Qwen3-0.6B's shape, with lrl's imitation engine
#            and, where the vllm package is installed, with vLLM; the cost of drawing a decode step's tokens on the
#            GPU against the CPU; the engine benchmark at that size
# Figures go to $OUT (default results/gpu); put them, with the GPU named, in docs/engine.md.
#
#   bash bench/gpu_check.sh                 # every part, from the repository root; PYTHONPATH=. is enough
#   bash bench/gpu_check.sh tiny smollm2    # some parts    where torch, lightning, transformers and
#                                           #               tensorboard are installed
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/gpu}
mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
parts=${*:-tiny smollm2 qwen3}
deadline=$(($(date +%s) + ${GPU_CHECK_SECONDS:-480}))
wants() { [[ " $parts " == *" $1 "* ]]; }
step() {  # step NAME SECONDS COMMAND...: run with a time limit (never past the deadline), keep its output
  local name=$1 limit=$2 left=$((deadline - $(date +%s)))
  shift 2
  if ((left < 20)); then
    echo "== $name skipped: the script's time is spent" | tee -a "$OUT/summary.txt"
    return
  fi
  ((limit > left)) && limit=$left
  echo "== $name (at most $limit s)" | tee -a "$OUT/summary.txt"
  local start=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "   exit $? after $(($(date +%s) - start)) s ($name)" | tee -a "$OUT/summary.txt"
  tail -n 25 "$OUT/$name.log"
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
python -c "import torch, transformers, lightning; print('torch', torch.__version__, 'transformers',
transformers.__version__, 'lightning', lightning.__version__, 'cuda', torch.cuda.is_available())" >> "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
if wants tiny; then
  step train_gpu 120 python train.py --accelerator gpu --max-steps 5 --eval-every 5 --progress false \
    --log-dir "$OUT/runs" --history-file "$OUT/train_gpu.jsonl"
fi
if wants smollm2; then
  if python -c "from lrl.models import NAMED_MODELS, locate; locate(NAMED_MODELS['smollm2-135m'])" > /dev/null 2>&1
  then
    step mismatch_smollm2 180 python -m lrl_lab.mismatch --model smollm2-135m --device cuda --also engine-fp32 fp8 \
      --engine-batch --ragged --json "$OUT/mismatch_smollm2.json"
    step train_smollm2 270 python train.py --env calc --accelerator gpu --seed 0 --progress false \
      --log-dir "$OUT/runs_calc" --history-file "$OUT/train_smollm2.jsonl"
    python - "$OUT/runs_calc" > "$OUT/train_smollm2_evals.txt" 2>&1 <<'PY'
import sys
from pathlib import Path
from lrl_lab.tools.plot_run import read_scalars
for run in sorted(Path(sys.argv[1]).glob("*/version_*")):
    scalars = read_scalars(run)
    for tag in ("val/pass_rate", "val/calls", "val/invalid"):
        print(run.name, tag, " ".join(f"{step}:{value:.3f}" for step, value in scalars.get(tag, [])))
PY
    cat "$OUT/train_smollm2_evals.txt"
  else
    echo "== smollm2 skipped: its wheel is not installed (requirements/smollm2.txt)" | tee -a "$OUT/summary.txt"
  fi
fi
if wants qwen3; then
  step mismatch_engine 150 python -m lrl_lab.mismatch --device cuda --random-model qwen3-0.6b --engine-dtype bfloat16 \
    --ragged --engine-batch --json "$OUT/mismatch_engine.json"
  if python -c "import vllm" > /dev/null 2>&1; then
    step mismatch_vllm 180 python -m lrl_lab.mismatch --device cuda --random-model qwen3-0.6b --sampler vllm \
      --vllm-dtype bfloat16 --ragged --engine-batch --json "$OUT/mismatch_vllm.json"
  else
    echo "== mismatch_vllm skipped: vllm is not installed (pip install vllm)" | tee -a "$OUT/summary.txt"
  fi
  step bench_sampling 60 python bench/bench_sampling.py
  step bench_engine 120 python bench/bench_engine.py --shape qwen3-0.6b --device cuda --dtype bfloat16 \
    --prompts 30 --new-tokens 32 --repeats 2
fi
cat "$OUT/summary.txt"
