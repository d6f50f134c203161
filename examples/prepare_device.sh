#!/usr/bin/env bash
# Run on the CPU machine before a lent GPU's call: what the GPU machine lacks, put into two folders of the checkout
# that git ignores (.git/info/exclude) and the call carries (`carry: [".whl", ".device"]`):
#   .whl/     wheels for its Python 3.12 of the packages whose versions it lacks or does not have (this machine's
#             versions of Transformers, huggingface_hub and its httpx2, datasets and its dill and multiprocess,
#             evaluate)
#   .device/  eflomal's source distribution (it has no wheel; built there: DROP aligns with it), and
#             .device/data/multi30k/, the Multi30k files (../shared does not travel)
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
du -sh .whl .device
