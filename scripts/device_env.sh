#!/usr/bin/env bash
# Source on the lent GPU machine (device tool) before GPU tests or benchmarks:
#   . scripts/device_env.sh
# Installs the carried wheels (.whl: pillow, safetensors and, for the FlashInfer kernels,
# flashinfer-python 0.6.18.post1 and apache-tvm-ffi; the image has torch, numpy, pytest) into a scratch folder, points FlashInfer's JIT at a scratch
# workspace and makes the package importable (device_run.sh's with_flashinfer puts FlashInfer on the
# path and the kernels compiled by an earlier call, carried in .fi_aot/<name>/<name>.so, beside it).
#
# The wheels are fetched here (a machine with PyPI) into the git-ignored .whl/ folder first:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 -d .whl \
#     pillow==11.1.0 safetensors==0.8.0 [flashinfer-python==0.6.18.post1 apache-tvm-ffi==0.1.15.post2]
set -e
SITE=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$(dirname "$(command -v python3)"):$PATH"   # FlashInfer's JIT needs ninja from the python's folder
export FLASHINFER_WORKSPACE_BASE=/tmp/fi_ws
mkdir -p "$FLASHINFER_WORKSPACE_BASE"
export PYTHONUNBUFFERED=1
python3 - <<'PY'
import importlib.util
import torch
fi = "not carried (FlashInfer tests skip, the default kernel on Hopper is sdpa:split)"
if importlib.util.find_spec("flashinfer") is not None:
    import flashinfer
    fi = getattr(flashinfer, "__version__", "importable")
print(f"torch {torch.__version__}, flashinfer {fi}, {torch.cuda.get_device_name()}, driver via nvidia-smi below")
PY
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
set +e
