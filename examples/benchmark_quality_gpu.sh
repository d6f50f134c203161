#!/usr/bin/env bash
# Quality-benchmark runs on a lent GPU (the `device` tool's `run`), side by side: every RUN ("SYSTEM", or
# "SYSTEM@SEEDS" with SEEDS comma-separated; seed 1 by default) trains at once with 1 CPU thread
# (examples/benchmark_quality.py --no-report: it records only; the report is rebuilt on the CPU machine with
# --report-only). Each finished run is then scored for AER (examples/benchmark_alignment.py, unless ALIGNMENT=false),
# and every system whose models learn alphas gets its figure (hf-headattn-plot learned-alphas). TRANSFORMER_FLAGS are
# benchmark_quality's --transformer-flags; by default "--bf16 true --save_only_model true": bfloat16 autocast, and
# checkpoints without the optimizer's state (a run on a lent GPU is never resumed: its checkpoints do not come back).
# Every run is stopped SECONDS after the start less a minute for the records, which come back as $OUT/records.tgz
# (one file: the tool brings back at most 8) with each unfinished run's last checkpoint state (its validation
# losses) and the runs' logs (quality-gpu-logs/ once unpacked).
#
# Prepare on the CPU machine with `bash examples/prepare_device.sh`, then call `run` with carry [".whl", ".device"]:
#   bash examples/benchmark_quality_gpu.sh 540 "transformer entmax15@1,2,3" "transformer softmax, guided alignment@2"
# Runs longer than one call: `bash examples/benchmark_quality_gpu.sh --detached STAY SECONDS RUN...` starts them in a
# copy outside the checkout (/tmp/work: the next call's files replace the checkout's) in a session of their own, which
# outlives the call while the machine stays warm; it returns after STAY seconds of the call, or as soon as the runs
# end (a failed start included: its log shows why), with what has been recorded so far. A later call, started within
# the machine's warm time, packs what has been recorded since: `cd /tmp/work && bash examples/benchmark_quality_gpu.sh
# --collect`.
# and on the CPU machine: tar xzf <files_at>/records.tgz && python examples/benchmark_quality.py --report-only
# (and python examples/benchmark_alignment.py --report-only).
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1
export PYTHONPATH=${PWD}${PYTHONPATH:+:$PYTHONPATH}
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site:$PYTHONPATH
started_mark=.quality-gpu-started  # records newer than this are the lease's

plot_learned_alphas() {  # the figure of every system whose finished models learn alphas
  local slug models folders labels
  for slug in $(ls runs/quality 2>/dev/null); do
    models=($(find runs/quality/"$slug" -maxdepth 2 -name train_results.json -newer "$started_mark" | sort))
    [ ${#models[@]} -gt 0 ] || continue
    folders=() labels=()
    for model in "${models[@]}"; do folders+=("$(dirname "$model")"); labels+=("$(basename "$(dirname "$model")")"); done
    python3 -m hf_headattn.commands.plot learned-alphas --models "${folders[@]}" --labels "${labels[@]}" \
        --output benchmarks/quality/"$slug"/learned_alphas.png > /dev/null 2>&1 \
        && echo "learned alphas of $slug: benchmarks/quality/$slug/learned_alphas.png"
  done
}

pack_records() {  # what the lease recorded (records, cards, AER, unfinished runs' validation losses, logs)
  local files=($(find benchmarks model_cards -type f -newer "$started_mark")
               $(find runs/quality -name trainer_state.json -path "*/checkpoint-*" -newer "$started_mark" 2>/dev/null))
  tar czf "$OUT/records.tgz" "${files[@]}" -C "$(dirname "$1")" "$(basename "$1")" 2>/dev/null
  ls -la "$OUT"
}

collect() {  # the finished lease's records, else what the runs have recorded so far
  if [ -s out/records.tgz ]; then
    cp out/records.tgz "$OUT/"
  elif [ -f "$started_mark" ]; then
    plot_learned_alphas
    pack_records "$(cat "$started_mark")"
  fi
  cp run.log "$OUT/" 2>/dev/null
  tail -40 run.log
}

if [ "${1:-}" = --detached ]; then
  stay=$2
  shift 2
  rm -rf /tmp/work && cp -a . /tmp/work && cd /tmp/work && mkdir -p out || exit 1
  OUT=/tmp/work/out setsid nohup bash examples/benchmark_quality_gpu.sh "$@" > run.log 2>&1 < /dev/null &
  runs=$!
  while kill -0 $runs 2>/dev/null && [ $SECONDS -lt "$stay" ]; do sleep 5; done
  collect
  exit
fi
if [ "${1:-}" = --collect ]; then
  collect
  exit
fi
budget=$1
shift
started=$(date +%s)
[ -d .device/cache ] && export HF_HEADATTN_CACHE=$PWD/.device/cache  # aligners and links prepared on the CPU machine
if [ -d .whl ] && [ ! -d /tmp/site ]; then  # (without .whl: the machine has every package)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      || exit 1
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target /tmp/site \
      .device/eflomal-*.tar.gz || echo "eflomal did not build: DROP cannot be measured"
  export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
python3 -c "import torch, transformers, datasets, eflomal; print('torch', torch.__version__, 'transformers',
transformers.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')" || exit 1
logs=$(mktemp -d)/quality-gpu-logs
mkdir -p "$logs"
echo "$logs" > "$started_mark"
left() { echo $((budget - 60 - $(date +%s) + started)); }

one_run() {  # SYSTEM SEED LOG: train and score, then (finished only) its AER
  local system=$1 seed=$2 log=$3
  timeout "$(left)" python3 examples/benchmark_quality.py --systems "$system" --seeds "$seed" \
      --data-dir .device/data/multi30k --no-report \
      --transformer-flags "${TRANSFORMER_FLAGS---bf16 true --save_only_model true}" >> "$log" 2>&1 || return
  [ "${ALIGNMENT:-true}" = true ] || return 0
  timeout "$(left)" python3 examples/benchmark_alignment.py --systems "$system" --seed "$seed" \
      --data-dir .device/data/multi30k --results-file "$log.alignment.md" >> "$log" 2>&1
}

runs=()
for spec in "$@"; do
  system=${spec%@*}
  seeds=1
  [ "$system" != "$spec" ] && seeds=${spec##*@}
  for seed in ${seeds//,/ }; do
    one_run "$system" "$seed" "$logs/$(echo "$system" | tr ' ,' '-_')-seed-$seed.log" &
    runs+=($!)
  done
done
( while sleep 60; do
    echo "t+$(( $(date +%s) - started ))s GPU $(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader)"
    for log in "$logs"/*.log; do
      echo "  $(basename "$log"): $(tr '\r' '\n' < "$log" | grep -E "it/s|s/it|eval_loss|BLEU|AER" \
          | grep -v "Loading weights" | tail -1 | cut -c1-140)"
    done
  done ) &
monitor=$!
wait "${runs[@]}"
kill $monitor
echo "done at t+$(( $(date +%s) - started ))s"
for log in "$logs"/*.log; do
  echo "== $(basename "$log")"
  tr '\r' '\n' < "$log" | grep -E "eval_loss|BLEU|AER|Error|error|Traceback" | tail -5 | cut -c1-200
done
plot_learned_alphas
pack_records "$logs"
