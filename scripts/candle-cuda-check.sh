#!/usr/bin/env bash
# candle-cuda-check.sh: type-checks `specula`'s `candle-cuda` feature (candle CUDA tensors read
# in place by the CUDA backend) against candle-core's real `cuda` feature, with clippy and
# warnings denied, on a machine without a CUDA toolkit or GPU.
#
# candle-core's `cuda` feature builds candle's kernels with nvcc at build time, so this
# installs nvcc 13.5 and what it needs (the CUDA runtime headers, CCCL, the C runtime headers,
# NVVM) from pip wheels into .tools/cuda13-nvcc (git-ignored; SPECULA_NVCC_TOOLS=/dir to use
# another) and points CUDA_HOME there. Nothing runs on a device and nothing is linked.
#
#     scripts/candle-cuda-check.sh
#
# Cold: about 8 minutes on 2 cores (candle's kernels through nvcc and ptxas); afterwards seconds.
# Not a CI step for that reason (docs/TESTING.md): run it when host-std/src/candle.rs or the
# CUDA backend's borrow API changes.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools="${SPECULA_NVCC_TOOLS:-$root/.tools/cuda13-nvcc}"
home="$tools/nvidia/cu13"
if [ ! -x "$home/bin/nvcc" ] || [ ! -x "$home/nvvm/bin/cicc" ]; then
    echo "candle-cuda-check: installing nvcc and its headers into $tools" >&2
    mkdir -p "$tools"
    python3 -m pip install --quiet --disable-pip-version-check --no-deps --upgrade \
        --target "$tools" nvidia-cuda-nvcc==13.5.37 nvidia-cuda-runtime==13.5.37 \
        nvidia-cuda-cccl==13.3.5.0.6 nvidia-cuda-crt==13.5.37 nvidia-nvvm==13.5.37
fi
export PATH="$home/bin:$PATH" CUDA_HOME="$home" CUDA_PATH="$home"
# No GPU to ask: the architecture candle's kernels are compiled for.
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-80}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target/candle-cuda}"
cd "$root"
cargo clippy --locked -p specula --features candle-cuda,rocm,axum,metrics --all-targets \
    -- -D warnings
echo "candle-cuda: clippy clean against candle-core's cuda feature (nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'))"
