#!/usr/bin/env bash
# Files a bare GPU machine needs for benchmarks/gpu_suite.sh and benchmarks/gpu_dynamic_inference.sh, made here
# (network to the package index needed):
#   .whl/       wheels of our Python dependencies that the machine's image lacks (Python 3.12, x86-64), at the
#               versions of this environment;
#   .gpu/data/  MNIST (all 60,000 training images, the first 2,000 test images), MNIST-M (the first 10,000
#               training and 1,000 test images) and Fashion-MNIST (the first 10,000 training and 2,000 test
#               images, for the adaptation study) from ../shared/data, about 41 MiB: what fits the 64 MiB
#               transfer beside the wheels and the working tree.
# Both folders are added to .git/info/exclude. On the machine:
#   pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
#   bash benchmarks/gpu_suite.sh "$OUT"     (or: bash benchmarks/gpu_dynamic_inference.sh "$OUT")
#
#   bash benchmarks/prepare_device_files.sh [SHARED_DATA_DIR]   (default ../shared/data)
set -euo pipefail
data=${1:-../shared/data}
python=${PYTHON:-python}
for path in /.whl/ /.gpu/; do
    grep -qxF "$path" .git/info/exclude 2>/dev/null || echo "$path" >>.git/info/exclude
done
version() { "$python" -c "import importlib.metadata as m; print(m.version('$1'))"; }
specs=()
for name in transformers datasets evaluate dill multiprocess; do
    specs+=("$name==$(version "$name")")
done
rm -rf .whl && mkdir -p .whl
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "${specs[@]}"
rm -rf .gpu/data && mkdir -p .gpu/data/mnist .gpu/data/mnist_m .gpu/data/fashion_mnist
"$python" - "$data" <<'PY'
import shutil
import sys

import pyarrow.parquet as pq

data = sys.argv[1]
shutil.copy(f"{data}/mnist/train.parquet", ".gpu/data/mnist/train.parquet")
subsets = [
    ("mnist", "test", 2000),
    ("mnist_m", "train", 10000),
    ("mnist_m", "test", 1000),
    ("fashion_mnist", "train", 10000),  # the adaptation study draws at most 8,192
    ("fashion_mnist", "test", 2000),
]
for name, split, rows in subsets:
    table = pq.read_table(f"{data}/{name}/{split}.parquet")
    pq.write_table(table.slice(0, rows), f".gpu/data/{name}/{split}.parquet")
PY
du -sh .whl .gpu
total=$(du -cm .whl .gpu | tail -n 1 | cut -f 1)
echo "$total MiB in .whl and .gpu (the transfer takes 64 MiB with the working tree)"
if [ "$total" -ge 60 ]; then
    echo "prepare_device_files.sh: $total MiB leaves too little of the 64 MiB transfer for the working tree" >&2
    exit 1
fi
