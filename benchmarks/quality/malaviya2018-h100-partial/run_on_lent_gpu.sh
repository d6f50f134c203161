#!/usr/bin/env bash
# The LSTM claim at Malaviya et al.'s recipe (issue 42, item 4) on a lent GPU: the systems train side by side, each
# records only (--no-report, resumable: a second call resumes them from their per-epoch checkpoints); the records come
# back in one tarball, and the report is rebuilt on the CPU machine with --report-only.
# usage: SEEDS="1" bash .device/run_lstm_claim.sh SECONDS "SYSTEM" ...
set -u
budget=$1; shift
started=$(date +%s)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false HF_HEADATTN_CACHE=/tmp/hf_headattn_cache
if [ ! -d /tmp/site/transformers ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target /tmp/site \
      .device/eflomal-2.0.0.tar.gz || echo "eflomal did not build"
fi
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
python3 -c "import torch, transformers, datasets, eflomal; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())" || exit 1
mkdir -p $OUT/logs
pids=()
for seed in ${SEEDS:-1}; do
  for system in "$@"; do
    log=$OUT/logs/$(echo "$system" | tr ' ,' '-_')-seed-$seed.log
    OMP_NUM_THREADS=2 timeout $((budget - 30 - $(date +%s) + started)) python3 examples/benchmark_quality.py \
        --systems "$system" --seeds $seed --data-dir .device/data/multi30k --no-report >> "$log" 2>&1 &
    pids+=($!)
  done
done
( while sleep 45; do echo "t+$(( $(date +%s) - started ))s $(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader)";
    for f in $OUT/logs/*.log; do echo "  $(basename $f): $(tr '\r' '\n' < $f | grep -E "it/s|s/it|eval_loss|BLEU" | tail -1 | cut -c1-140)"; done; done ) &
monitor=$!
wait "${pids[@]}"
kill $monitor
echo "done at t+$(( $(date +%s) - started ))s"
for f in $OUT/logs/*.log; do echo "== $f"; tr '\r' '\n' < $f | grep -E "eval_loss|BLEU|Error|error|Traceback" | tail -6 | cut -c1-200; done
tar czf $OUT/records.tgz benchmarks/quality/lstm-malaviya2018-* $(ls -d runs/quality/lstm-malaviya2018-*/seed-*/checkpoint-*/trainer_state.json 2>/dev/null) 2>/dev/null
ls -la $OUT
