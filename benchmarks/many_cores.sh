#!/usr/bin/env bash
# Issue 16's many-core figures, in one call on a lent many-core host (docs/SCALING.md):
#   bash benchmarks/many_cores.sh [COUNTS...]        # default: 8 and all cores
# Writes core_scaling-Ncores.json, one_writer-Ncores.json (N: the usable cores), their logs and a py-spy profile of
# the LMDB driver at the largest count (lmdb_driver.txt, if py-spy is there) into $OUT
# (default benchmarks/out/); copy the JSONs into benchmarks/results/, then python -m benchmarks.render.
# About 4 minutes on a 16-core H100 host (core_scaling took 127 s there, image generation included; --write-floor,
# the plain write of the same samples, adds one run per count beside the five).
#
# A lent host has no network: carry what its Python lacks as wheels. Here, in the repo root:
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     --platform manylinux1_x86_64 -d .whl lmdb==3.0.0 webdataset==1.0.2 braceexpand==0.1.7 py-spy==0.4.3
# and carry .whl; PACKER_BENCH_COMMIT names the commit whose tree travelled (the JSONs record it).
set -u
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
OUT=${OUT:-benchmarks/out}
mkdir -p "$OUT"
if [ -d .whl ] && ! python3 -c 'import lmdb, webdataset' 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
fi
python3 -c 'import lmdb, webdataset, h5py, cv2, torch' || exit 1
cores=$(python3 -c 'import os; print(len(os.sched_getaffinity(0)))')
counts=("$@"); [ ${#counts[@]} -gt 0 ] || counts=(8 "$cores")
images=${IMAGES:-9000}
t0=$SECONDS
python3 -m benchmarks.core_scaling --counts "${counts[@]}" --images "$images" --rounds 3 --shard-size 250 --write-floor --tag "${cores}cores" --out "$OUT" 2>&1 | tee "$OUT/core_scaling.log"
echo "core_scaling took $((SECONDS - t0)) s"; t0=$SECONDS
python3 -m benchmarks.one_writer --samples 6000 --repeats 3 --tag "${cores}cores" --out "$OUT" 2>&1 | tee "$OUT/one_writer.log"
echo "one_writer took $((SECONDS - t0)) s"; t0=$SECONDS
if command -v py-spy >/dev/null; then  # where the LMDB driver's time goes at the largest count (--idle: waits too)
  py-spy record --idle --format raw -r 200 -o "$OUT/lmdb_driver.txt" -- \
    python3 -m packer convert "benchmarks/data/imagenet-like-10x$((images / 10))" "$OUT/spy.lmdb" --size 224 -j "${counts[-1]}" -q 2>&1 | tail -2
  rm -rf "$OUT/spy.lmdb"
  echo "py-spy took $((SECONDS - t0)) s"
fi
