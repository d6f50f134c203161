#!/usr/bin/env bash
# Quality-benchmark runs on a lent GPU (the `device` tool's `run`), side by side: every SYSTEM at every seed of
# SEEDS trains at once with 2 CPU threads (examples/benchmark_quality.py --no-report: it records only; the report is
# rebuilt on the CPU machine with --report-only). TRANSFORMER_FLAGS are benchmark_quality's --transformer-flags; by
# default "--bf16 true --save_only_model true": bfloat16 autocast, and checkpoints without the optimizer's state (a
# third of the writing: --preset goindani2021 saves every epoch that improves, and a run on a lent GPU is never
# resumed, since its checkpoints do not come back).
# Every run is stopped SECONDS after the start less a minute for the records, which come back as $OUT/records.tgz
# (one file: the tool brings back at most 8) with each unfinished run's last checkpoint state (its validation
# losses) and the runs' logs (quality-gpu-logs/ once unpacked).
#
# Prepare on the CPU machine with `bash examples/prepare_device.sh`, then call `run` with carry [".whl", ".device"]:
#   bash examples/benchmark_quality_gpu.sh 540 "1 2 3" "transformer goindani2021 softmax, 10k sampled pairs" \
#       "transformer goindani2021 dhicm, 10k sampled pairs"
# and on the CPU machine: tar xzf <files_at>/records.tgz && python examples/benchmark_quality.py --report-only
set -u
budget=$1 seeds=$2
shift 2
started=$(date +%s)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ -d .whl ] && [ ! -d /tmp/site ]; then  # (without .whl: the machine has every package)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      || exit 1
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target /tmp/site \
      .device/eflomal-*.tar.gz || echo "eflomal did not build: DROP cannot be measured"
fi
export PYTHONPATH=${PWD}${PYTHONPATH:+:$PYTHONPATH}
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site:$PYTHONPATH
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
python3 -c "import torch, transformers, datasets, eflomal; print('torch', torch.__version__, 'transformers',
transformers.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')" || exit 1
logs=$(mktemp -d)/quality-gpu-logs
mkdir -p "$logs"
runs=()
for seed in $seeds; do
  for system in "$@"; do
    log=$logs/$(echo "$system" | tr ' ,' '-_')-seed-$seed.log
    OMP_NUM_THREADS=2 timeout $((budget - 60 - $(date +%s) + started)) python3 examples/benchmark_quality.py \
        --systems "$system" --seeds "$seed" --data-dir .device/data/multi30k --no-report \
        --transformer-flags "${TRANSFORMER_FLAGS---bf16 true --save_only_model true}" \
        >> "$log" 2>&1 &
    runs+=($!)
  done
done
( while sleep 60; do
    echo "t+$(( $(date +%s) - started ))s GPU $(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader)"
    for log in "$logs"/*.log; do
      echo "  $(basename "$log"): $(tr '\r' '\n' < "$log" | grep -E "it/s|s/it|eval_loss|BLEU" | grep -v "Loading weights" \
          | tail -1 | cut -c1-140)"
    done
  done ) &
monitor=$!
wait "${runs[@]}"
kill $monitor
echo "done at t+$(( $(date +%s) - started ))s"
for log in "$logs"/*.log; do
  echo "== $(basename "$log")"
  tr '\r' '\n' < "$log" | grep -E "eval_loss|BLEU|Error|error|Traceback" | tail -4 | cut -c1-200
done
records=()
for system in "$@"; do
  slug=$(echo "$system" | sed 's/,//g; s/ /-/g')
  records+=(benchmarks/quality/"$slug")
  records+=($(ls -d runs/quality/"$slug"/seed-*/checkpoint-*/trainer_state.json 2>/dev/null))
done
tar czf "$OUT/records.tgz" "${records[@]}" -C "$(dirname "$logs")" quality-gpu-logs 2>/dev/null
ls -la "$OUT"
