#!/usr/bin/env bash
# Source on the lent GPU machine (device tool) before GPU tests or benchmarks:
#   . scripts/device_env.sh
# Installs carried wheels (.whl, if any: the image has torch, triton, numpy, pillow, safetensors, pytest)
# into a scratch folder, points FlashInfer's JIT at a scratch workspace and makes the package importable.
# device_run.sh's with_flashinfer puts FlashInfer (wheels carried in .whl_fi) on the path for the official
# code only, so our default runs as on a robot without it. The FlashInfer wheels are fetched here (a
# machine with PyPI) into the git-ignored .whl_fi/ folder:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 -d .whl_fi \
#     flashinfer-python==0.6.18.post1 apache-tvm-ffi==0.1.15.post2
set -e
SITE=/tmp/site
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
fi
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
gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
print(f"torch {torch.__version__}, flashinfer {fi}, {gpu}, driver via nvidia-smi below")
PY
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
set +e
