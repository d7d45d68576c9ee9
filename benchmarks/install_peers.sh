#!/usr/bin/env bash
# Install the peer tools the benchmark suite compares packer with, without replacing torch.
#
# mosaicml-streaming and litdata declare torch and torchvision (and, through them, CUDA wheels)
# as dependencies, so pip would pull another torch. They are installed with --no-deps, followed
# by the light runtime dependencies they import; a constraint file pins the torch that is already
# there. webdataset is a packer dependency already. Run inside the project's venv:
#
#     bash benchmarks/install_peers.sh
#
# `import streaming` imports streaming.vision, which needs torchvision: benchmarks/peers.py
# stands in for that subpackage. LitData's JPEG path needs torchvision too, so its JPEG rows report
# that instead of a figure.
set -euo pipefail
torch_version="$(python -c 'import torch; print(torch.__version__.split("+")[0])')"
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
echo "torch==${torch_version}" > "$constraints"
pip install -c "$constraints" 'matplotlib>=3.7' 'xxhash<4' zstd python-snappy Brotli catalogue 'transformers<5' \
    lightning-utilities boto3 filelock obstore tifffile
pip install --no-deps mosaicml-streaming litdata
python - <<'PY'
import importlib.metadata as md
import torch
print("torch", torch.__version__, "| mosaicml-streaming", md.version("mosaicml-streaming"), "| litdata", md.version("litdata"),
      "| webdataset", md.version("webdataset"))
PY
