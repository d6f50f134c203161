#!/usr/bin/env bash
# Run on the CPU machine before a lent GPU's call: what the GPU machine lacks, put into two folders of the checkout
# that git ignores (.git/info/exclude) and the call carries (`carry: [".whl", ".device"]`):
#   .whl/     wheels for its Python 3.12 of the packages whose versions it lacks or does not have (this machine's
#             versions of Transformers, huggingface_hub and its httpx2, datasets and its dill and multiprocess,
#             evaluate)
#   .device/  eflomal's source distribution (it has no wheel; built there: DROP aligns with it), and
#             .device/data/multi30k/, the Multi30k files (../shared does not travel), and .device/cache/, what
#             eflomal computes once for every run (HF_HEADATTN_CACHE there): DROP's aligners, the AER's reference
#             alignments (examples/benchmark_alignment.py) and guided alignment's links of the training pairs
# The GPU-side scripts (examples/benchmark_quality_gpu.sh) install the wheels into /tmp/site.
#
#   bash examples/prepare_device.sh [DATA_DIR]      (default ../shared/data/multi30k)
set -euo pipefail
cd "$(dirname "$0")/.."
data=${1:-../shared/data/multi30k}
mkdir -p .git/info
for folder in /.whl/ /.device/; do
  grep -qxF "$folder" .git/info/exclude 2>/dev/null || echo "$folder" >> .git/info/exclude
done

rm -rf .whl && mkdir -p .whl  # (a second version of a package would stop the install there)
packages=()
# (httpx2, httpcore2, truststore: what this huggingface_hub needs that the image's 1.x did not)
for package in transformers huggingface_hub httpx2 httpcore2 truststore datasets dill multiprocess evaluate; do
  packages+=("$package==$(python -c "from importlib.metadata import version; print(version('$package'))")")
done
platforms=()
for n in 17 24 27 28 31 34 35; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" --platform manylinux2014_x86_64 -d .whl "${packages[@]}"

rm -rf .device && mkdir -p .device/data/multi30k
python -m pip download -q --no-deps --no-binary=:all: --no-build-isolation -d .device \
    "eflomal==$(python -c "from importlib.metadata import version; print(version('eflomal'))")"
for name in train.de train.en val.de val.en test_2016_flickr.de test_2016_flickr.en; do
  cp "$data/$name" .device/data/multi30k/
done
# the training pairs' links through a one-step guided run, so that they are those of the pairs a run keeps
HF_HEADATTN_CACHE=.device/cache python - <<'PYTHON'
import sys, tempfile
sys.path[:0] = [".", "examples"]
from benchmark_alignment import reference_alignments
from hf_headattn.metrics import drop_alignment_runs
from hf_headattn.training import train
from hf_headattn.translation import read_lines

data = {key: f".device/data/multi30k/{name}" for key, name in [
    ("train_source", "train.de"), ("train_target", "train.en"), ("valid_source", "val.de"), ("valid_target", "val.en"),
    ("test_source", "test_2016_flickr.de"), ("test_target", "test_2016_flickr.en")]}
reference_alignments(data, None, 3)  # the AER's reference (whitespace words), its aligner trained on the pairs
tests = read_lines(data["test_target"])
drop_alignment_runs(read_lines(data["test_source"]), tests, tests, train_sources=read_lines(data["train_source"]),
                    train_targets=read_lines(data["train_target"]), tokenize="13a")  # DROP's aligner
with tempfile.TemporaryDirectory() as folder:
    train(["--preset", "multi30k-anchor", "--guided_alignment", "eflomal", "--max_steps", "1", "--output_dir", folder,
           *[part for key in ("train_source", "train_target", "valid_source", "valid_target")
             for part in (f"--{key}", data[key])]])
PYTHON
du -sh .whl .device
