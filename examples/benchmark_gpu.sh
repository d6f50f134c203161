#!/usr/bin/env bash
# The GPU benchmarks in one run, under 10 minutes on one H100 or H200:
#  1. training: transformer-base (d_model 512, 6 + 6 layers, 8 heads) train steps of every attention variant under
#     bfloat16 autocast, beside SDPA softmax and MarianMTModel (examples/benchmark_speed.py; target: every variant's
#     step at most 1.3x softmax's);
#  2. decoding: 10,000 lines at beam 5, whole processes: the fast path (float32) against `generate` on
#     the same weights and CTranslate2's CUDA build (examples/benchmark_decoding.py; target: the fast path at least
#     2x generate). The softmax zoo model is trained first where --output-dir lacks it (about 2 minutes on an H100).
#  3. no host synchronisation: tests/test_host_sync.py's `test_no_sync_on_cuda` (a forward, a backward and ten
#     decoding steps of every variant, and the sparse kernels, under torch.cuda.set_sync_debug_mode("error"));
#  4. where a decoding batch's time goes on the GPU, the fast path against generate (examples/
#     benchmark_decoding_profile.py: one batch of 128 sentences at beam 5 under torch.profiler, well under a minute).
# The benchmarks write their JSON into RESULTS_DIR and their sections of BENCHMARKS.md ("Speed (GPU: ...)", "Decoding
# speed: translating a file (GPU: ...)", "Decoding profile: ... (GPU: ...)"); the test's result is in the output.
#
#   bash examples/benchmark_gpu.sh [RESULTS_DIR [DATA_DIR [MODELS_DIR]]]
#   (defaults: benchmarks, ../shared/data/multi30k, runs/quality)
set -uo pipefail
failed=0  # one benchmark's failure does not cost the other its run
results=${1:-benchmarks}
data=${2:-../shared/data/multi30k}
models=${3:-runs/quality}
cd "$(dirname "$0")/.."
mkdir -p "$results"
python examples/benchmark_speed.py --device cuda --shapes 512x6 --autocast bfloat16 --batch-tokens 8000 \
    --train-batches 3 --repeats 3 --threads 2 --skip-kernels --data-dir "$data" \
    --output "$results/speed-gpu.json" --markdown BENCHMARKS.md || failed=1
python examples/benchmark_decoding.py --device cuda --sentences 10000 --beams 5 --rounds 1 --threads 2 --variants \
    --systems "ours, generate" "ours, fast" "CTranslate2 float32" "CTranslate2 int8_float16" \
    --data-dir "$data" --output-dir "$models" --output "$results/decoding-gpu.json" --markdown BENCHMARKS.md || failed=1
python -m pytest -q -p no:cacheprovider tests/test_host_sync.py -k test_no_sync_on_cuda || failed=1
python examples/benchmark_decoding_profile.py --device cuda --data-dir "$data" \
    --model "$models/transformer-softmax/seed-1" --output "$results/decoding_profile-gpu.json" \
    --markdown BENCHMARKS.md || failed=1
exit $failed
