#!/usr/bin/env bash
# cuda-tools.sh: NVRTC and ptxas without a CUDA toolkit or GPU, for the kernel compile checks.
#
# Installs the pip wheels nvidia-cuda-nvrtc-cu12 and nvidia-cuda-nvcc-cu12 (ptxas) into the
# project-local folder .tools/cuda (git-ignored), and the CUDA 13 ones (nvidia-cuda-nvrtc,
# nvidia-cuda-nvcc 13.5) into .tools/cuda13, when they are missing, then exports the paths the
# tests need (SPECULA_CUDA13_NVRTC / SPECULA_CUDA13_PTXAS for the second compile check). Source it so the exports reach your shell:
#
#     . scripts/cuda-tools.sh
#     cargo test -p specula-cuda --test nvrtc -- --nocapture
#
# SPECULA_CUDA_TOOLS=/some/dir uses (or installs into) another folder, e.g. a shared cache.
# Takes about a minute the first time (four wheels, ~210 MB), nothing afterwards.

_specula_cuda_tools() {
    local root
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    local dir="${SPECULA_CUDA_TOOLS:-$root/.tools/cuda}"
    local version="12.9.86"
    if [ ! -e "$dir/nvidia/cuda_nvrtc/lib/libnvrtc.so.12" ] || [ ! -x "$dir/nvidia/cuda_nvcc/bin/ptxas" ]; then
        echo "cuda-tools: installing NVRTC and ptxas $version into $dir" >&2
        mkdir -p "$dir"
        python3 -m pip install --quiet --disable-pip-version-check --no-deps --upgrade \
            --target "$dir" \
            "nvidia-cuda-nvrtc-cu12==$version" "nvidia-cuda-nvcc-cu12==$version" || return 1
    fi
    # CUDA 13 as well (NVRTC 13 is what current drivers and PyTorch ship), in its own folder so
    # the two wheels' "nvidia" trees do not replace each other. Optional: failure only skips it.
    local dir13="${SPECULA_CUDA13_TOOLS:-$root/.tools/cuda13}"
    local version13="13.5.37"
    if [ ! -e "$dir13/nvidia/cu13/lib/libnvrtc.so.13" ] || [ ! -x "$dir13/nvidia/cu13/bin/ptxas" ]; then
        echo "cuda-tools: installing NVRTC and ptxas $version13 into $dir13" >&2
        mkdir -p "$dir13"
        python3 -m pip install --quiet --disable-pip-version-check --no-deps --upgrade \
            --target "$dir13" \
            "nvidia-cuda-nvrtc==$version13" "nvidia-cuda-nvcc==$version13" ||
            echo "cuda-tools: CUDA 13 tools not installed; their compile check will be skipped" >&2
    fi
    if [ -e "$dir13/nvidia/cu13/lib/libnvrtc.so.13" ] && [ -x "$dir13/nvidia/cu13/bin/ptxas" ]; then
        export SPECULA_CUDA13_NVRTC="$dir13/nvidia/cu13/lib/libnvrtc.so.13"
        export SPECULA_CUDA13_PTXAS="$dir13/nvidia/cu13/bin/ptxas"
    fi
    export SPECULA_CUDA_TOOLS="$dir"
    export LD_LIBRARY_PATH="$dir/nvidia/cuda_nvrtc/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export PATH="$dir/nvidia/cuda_nvcc/bin:$PATH"
    export SPECULA_PTXAS="$dir/nvidia/cuda_nvcc/bin/ptxas"
    echo "cuda-tools: NVRTC in $dir/nvidia/cuda_nvrtc/lib, ptxas at $SPECULA_PTXAS" >&2
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    # Run as a program: install only, and say how to get the exports.
    set -euo pipefail
    _specula_cuda_tools
    echo "cuda-tools: installed; run '. scripts/cuda-tools.sh' to export the paths" >&2
else
    _specula_cuda_tools
fi
