#!/usr/bin/env bash
# gpu-check.sh: run the CUDA backend's device tests and benchmark grid on a CUDA host that has
# no Rust toolchain. Nothing is built on that host.
#
# 1. Here (a machine with Rust; no GPU needed):
#        scripts/gpu-check.sh pack [DIR]        # default DIR: gpu-bin
#    builds `cargo test --no-run` / `cargo bench --no-run` for specula-cuda (release), and copies
#    the device-test and benchmark binaries plus the NVRTC libraries (from .tools/cuda, see
#    scripts/cuda-tools.sh) into DIR.
# 2. Carry DIR to the CUDA host (x86-64 Linux, NVIDIA driver installed) and run there:
#        scripts/gpu-check.sh run [DIR]
#    which runs the conformance suite and readback tests on device 0, then the benchmark grid
#    (batch 1/16/64/256 x V 32k/128k/152k x k 1/4/8: GB/s of probability data read vs a
#    device-to-device copy, us per call). Finishes in under 5 minutes (hard limit 290 s).
set -euo pipefail

cmd="${1:-}"
dir="${2:-gpu-bin}"

case "$cmd" in
pack)
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    cd "$root"
    # shellcheck source=/dev/null
    . scripts/cuda-tools.sh
    mkdir -p "$dir/nvrtc"
    list=$(mktemp)
    cargo test -p specula-cuda --release --test device --no-run --message-format=json >"$list"
    cargo bench -p specula-cuda --bench grid --no-run --message-format=json >>"$list"
    python3 - "$list" "$dir" <<'PY'
import json, shutil, sys, os
seen = []
for line in open(sys.argv[1]):
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    exe = msg.get("executable")
    if msg.get("reason") == "compiler-artifact" and exe:
        name = msg["target"]["name"]
        if name in ("device", "grid"):
            shutil.copy2(exe, os.path.join(sys.argv[2], name))
            seen.append(name)
missing = {"device", "grid"} - set(seen)
if missing:
    sys.exit(f"gpu-check: no binary for {sorted(missing)}")
PY
    rm -f "$list"
    cp -a "$SPECULA_CUDA_TOOLS"/nvidia/cuda_nvrtc/lib/. "$dir/nvrtc/"
    cp "$0" "$dir/gpu-check.sh"
    echo "gpu-check: packed into $dir ($(du -sh "$dir" | cut -f1)); on the GPU host run: $dir/gpu-check.sh run $dir"
    ;;
run)
    [ -x "$dir/device" ] && [ -x "$dir/grid" ] || { echo "gpu-check: $dir/device or $dir/grid missing (run 'pack' first)" >&2; exit 2; }
    export LD_LIBRARY_PATH="$dir/nvrtc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    start=$(date +%s)
    echo "== device tests (conformance suite, caller's stream, step-path call counts, readback)"
    timeout 200 "$dir/device" --test-threads=1 --nocapture
    echo "== benchmark grid"
    left=$((290 - ($(date +%s) - start)))
    timeout "$left" "$dir/grid" --bench
    echo "gpu-check: done in $(( $(date +%s) - start )) s"
    ;;
*)
    echo "usage: $0 pack [DIR]   (here, builds)   |   $0 run [DIR]   (on the CUDA host)" >&2
    exit 2
    ;;
esac
