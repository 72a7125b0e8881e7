#!/usr/bin/env bash
# Installs the ROCm pieces the specula-rocm tests use, when missing: the HIP runtime with hiprtc
# (libamdhip64), its headers and hipcc (Debian packages `hipcc libamdhip64-dev`, ROCm 5.2 on
# Debian 12). No GPU is needed or used. Runs as root in CI (apt-get); elsewhere it only reports.
# A standard /opt/rocm install is also fine: the crate finds its libraries at run time there.
set -euo pipefail

have_tools() {
    command -v hipcc >/dev/null 2>&1 &&
        { [ -f /usr/include/hip/hip_runtime_api.h ] || [ -f /opt/rocm/include/hip/hip_runtime_api.h ]; } &&
        { ldconfig -p 2>/dev/null | grep 'libamdhip64\.so' >/dev/null || [ -e /opt/rocm/lib/libamdhip64.so ]; }
}

if have_tools; then
    echo "rocm-tools: hipcc, HIP headers and libamdhip64 already present"
    exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "rocm-tools: missing, and cannot install (needs root and apt-get):" >&2
    echo "  apt-get install -y hipcc libamdhip64-dev" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q hipcc libamdhip64-dev
have_tools
echo "rocm-tools: installed $(hipconfig --version 2>/dev/null || echo hipcc)"
