#!/usr/bin/env bash
# Files a bare GPU machine needs for benchmarks/gpu_suite.sh, made here (network to the package index needed):
#   .whl/       wheels of our Python dependencies that the machine's image lacks (Python 3.12, x86-64), at the
#               versions of this environment;
#   .gpu/data/  MNIST (all 60,000 training images, the first 2,000 test images) and MNIST-M (the first 10,000
#               training and 1,000 test images) from ../shared/data, about 35 MiB: what fits the 64 MiB transfer.
# Both folders are added to .git/info/exclude. On the machine:
#   pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
#   bash benchmarks/gpu_suite.sh "$OUT"
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
rm -rf .gpu/data && mkdir -p .gpu/data/mnist .gpu/data/mnist_m
"$python" - "$data" <<'PY'
import shutil
import sys

import pyarrow.parquet as pq

data = sys.argv[1]
shutil.copy(f"{data}/mnist/train.parquet", ".gpu/data/mnist/train.parquet")
for name, split, rows in [("mnist", "test", 2000), ("mnist_m", "train", 10000), ("mnist_m", "test", 1000)]:
    table = pq.read_table(f"{data}/{name}/{split}.parquet")
    pq.write_table(table.slice(0, rows), f".gpu/data/{name}/{split}.parquet")
PY
du -sh .whl .gpu
