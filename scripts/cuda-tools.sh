#!/usr/bin/env bash
# cuda-tools.sh: NVRTC and ptxas without a CUDA toolkit or GPU, for the kernel compile checks.
#
# Installs the pip wheels nvidia-cuda-nvrtc-cu12 and nvidia-cuda-nvcc-cu12 (ptxas) into the
# project-local folder .tools/cuda (git-ignored), and the CUDA 13 ones (nvidia-cuda-nvrtc,
# nvidia-cuda-nvcc 13.5) into .tools/cuda13, when they are missing, then exports the paths the
# tests need (SPECULA_CUDA13_NVRTC / SPECULA_CUDA13_PTXAS for the second compile check). Source it so the exports reach your shell:
#
#     . scripts/cuda-tools.sh
#     cargo test -p specula-cuda --test toolchain -- --nocapture
#
# It also installs cuobjdump and nvdisasm (nvidia-cuda-cuobjdump 13.4, nvidia-cuda-nvdisasm 13.5)
# into .tools/sass for scripts/kernel-report.py, and exports SPECULA_CUOBJDUMP when they are there.
#
# SPECULA_CUDA_TOOLS=/some/dir uses (or installs into) another folder, e.g. a shared cache.
# Takes about a minute the first time (four wheels, ~210 MB), nothing afterwards.

# _specula_wheels DIR NVRTC PTXAS PACKAGE...: pip-installs PACKAGE... into DIR unless the files
# NVRTC and PTXAS (relative to DIR) are already there; fails if they are still missing.
_specula_wheels() {
    local dir="$1" nvrtc="$2" ptxas="$3"
    shift 3
    if [ ! -e "$dir/$nvrtc" ] || [ ! -x "$dir/$ptxas" ]; then
        echo "cuda-tools: installing $* into $dir" >&2
        mkdir -p "$dir"
        python3 -m pip install --quiet --disable-pip-version-check --no-deps --upgrade \
            --target "$dir" "$@" || return 1
    fi
    [ -e "$dir/$nvrtc" ] && [ -x "$dir/$ptxas" ]
}

_specula_cuda_tools() {
    local root
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    local dir="${SPECULA_CUDA_TOOLS:-$root/.tools/cuda}"
    _specula_wheels "$dir" nvidia/cuda_nvrtc/lib/libnvrtc.so.12 nvidia/cuda_nvcc/bin/ptxas \
        nvidia-cuda-nvrtc-cu12==12.9.86 nvidia-cuda-nvcc-cu12==12.9.86 || return 1
    # CUDA 13 as well (NVRTC 13 is what current drivers and PyTorch ship), in its own folder so
    # the two wheels' "nvidia" trees do not replace each other. Optional: failure only skips it.
    local dir13="${SPECULA_CUDA13_TOOLS:-$root/.tools/cuda13}"
    if _specula_wheels "$dir13" nvidia/cu13/lib/libnvrtc.so.13 nvidia/cu13/bin/ptxas \
        nvidia-cuda-nvrtc==13.5.37 nvidia-cuda-nvcc==13.5.37; then
        export SPECULA_CUDA13_NVRTC="$dir13/nvidia/cu13/lib/libnvrtc.so.13"
        export SPECULA_CUDA13_PTXAS="$dir13/nvidia/cu13/bin/ptxas"
    else
        echo "cuda-tools: CUDA 13 tools not installed; their compile check will be skipped" >&2
    fi
    # cuobjdump + nvdisasm, to read the SASS (scripts/kernel-report.py). One pip call for both:
    # their wheels share the nvidia/cu13 tree. Optional: failure only skips the report.
    local sass="${SPECULA_SASS_TOOLS:-$root/.tools/sass}"
    if _specula_wheels "$sass" nvidia/cu13/bin/nvdisasm nvidia/cu13/bin/cuobjdump \
        nvidia-cuda-cuobjdump==13.4.92 nvidia-cuda-nvdisasm==13.5.37; then
        export SPECULA_CUOBJDUMP="$sass/nvidia/cu13/bin/cuobjdump"
    else
        echo "cuda-tools: cuobjdump/nvdisasm not installed; the kernel report will be skipped" >&2
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
