#!/usr/bin/env bash
# gpu-check.sh: run the CUDA backend's device tests and benchmark grid on a CUDA host that has
# no Rust toolchain. Nothing is built on that host.
#
# 1. Here (a machine with Rust; no GPU needed):
#        scripts/gpu-check.sh pack [DIR] [--with-nvrtc]      # default DIR: gpu-bin
#    builds `cargo test --no-run` / `cargo bench --no-run` for specula-cuda (release) and copies
#    the stripped device-test and benchmark binaries and the `specula` program built with
#    --features cuda (a few MB together) and this script into DIR.
#    --with-nvrtc also copies NVRTC 12 (about 110 MB, from .tools/cuda, see
#    scripts/cuda-tools.sh) for a host that has no NVRTC of its own.
# 2. Carry DIR to the CUDA host (x86-64 Linux, NVIDIA driver installed) and run there:
#        DIR/gpu-check.sh run [DIR]
#    which finds NVRTC (DIR/nvrtc, the host's CUDA toolkit, or a Python wheel's), runs the
#    conformance suite, the caller's-stream test, the zero-synchronisation step-path test, the
#    CUDA-graph capture/replay test and the readback tests on device 0, the token-tree tests
#    (backend-cuda/tests/it/tree_device.rs), an 8 s
#    `specula demo --backend cuda` (exit 0 and its log lines), then the benchmark grid
#    (backend-cuda/benches/grid.rs: greedy / typical / rejection with drafts equal, mixed
#    (residual race) and fallback (residual empty, target race) x batch 1/16/64/256 x V
#    32k/128k/152k x k 1/4/8: us per call, GB/s of probability data read against a
#    device-to-device copy and a read-only kernel over the same bytes, L2-flushed us at batch
#    1 and 16; then p50/p90/p99 of single calls at batch 1, plain launch and graph replay),
#    to compare with the predictions of scripts/kernel-report.py (docs/PERFORMANCE.md).
#    Finishes in under 5 minutes (hard limit 290 s).
#    With the device tool of this workplace: DIR=gpu-bin (ignored by git), carry ["gpu-bin"],
#    command "bash gpu-bin/gpu-check.sh run gpu-bin 2>&1 | tee $OUT/gpu-check.log".
set -euo pipefail

cmd="${1:-}"
dir="${2:-gpu-bin}"
with_nvrtc="${3:-}"

case "$cmd" in
pack)
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    cd "$root"
    # shellcheck source=/dev/null
    . scripts/cuda-tools.sh
    rm -rf "$dir"
    mkdir -p "$dir"
    list=$(mktemp)
    # The device tests are modules of the `it` binary (device::, tree_device::).
    cargo test -p specula-cuda --release --test it --no-run --message-format=json >"$list"
    cargo bench -p specula-cuda --bench grid --no-run --message-format=json >>"$list"
    cargo build --release -p specula-cli --features cuda --bin specula
    cp target/release/specula "$dir/specula"
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
        if name in ("it", "grid"):
            shutil.copy2(exe, os.path.join(sys.argv[2], name))
            seen.append(name)
missing = {"it", "grid"} - set(seen)
if missing:
    sys.exit(f"gpu-check: no binary for {sorted(missing)}")
PY
    rm -f "$list"
    strip "$dir/it" "$dir/grid" "$dir/specula" 2>/dev/null || true
    if [ "$with_nvrtc" = "--with-nvrtc" ]; then
        mkdir -p "$dir/nvrtc"
        # The library and its builtins; the ".alt" variants are not needed.
        cp -a "$SPECULA_CUDA_TOOLS"/nvidia/cuda_nvrtc/lib/libnvrtc.so* \
            "$SPECULA_CUDA_TOOLS"/nvidia/cuda_nvrtc/lib/libnvrtc-builtins.so* "$dir/nvrtc/"
    fi
    cp "$0" "$dir/gpu-check.sh"
    echo "gpu-check: packed into $dir ($(du -sh "$dir" | cut -f1)); on the GPU host run: $dir/gpu-check.sh run $dir"
    ;;
run)
    for b in it grid specula; do
        [ -x "$dir/$b" ] || { echo "gpu-check: $dir/$b missing (run 'pack' first)" >&2; exit 2; }
    done
    # NVRTC: specula-cuda itself looks on the loader path and in the CUDA toolkit folders
    # ($CUDA_PATH, $CUDA_HOME, /usr/local/cuda), versions 12 and 13. What it does not search is
    # added here: the packed copy, else a Python wheel's (PyTorch's) lib folder.
    nvrtc_dir=""
    if [ -d "$dir/nvrtc" ]; then
        nvrtc_dir="$(cd "$dir/nvrtc" && pwd)"
    else
        for site in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
            for c in "$site/nvidia/cu13/lib" "$site/nvidia/cuda_nvrtc/lib"; do
                if [ -e "$c/libnvrtc.so.13" ] || [ -e "$c/libnvrtc.so.12" ]; then
                    nvrtc_dir="${nvrtc_dir:+$nvrtc_dir:}$c"
                fi
            done
        done
    fi
    echo "gpu-check: NVRTC folders added to the loader path: ${nvrtc_dir:-none}"
    if [ -n "$nvrtc_dir" ]; then
        export LD_LIBRARY_PATH="$nvrtc_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
    # A device that does not open is a failure here, not a skip.
    export SPECULA_REQUIRE_DEVICE=1
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    start=$(date +%s)
    echo "== device tests (conformance suite, caller's stream, step-path call counts, graph replay, readback)"
    # `device::` also matches `tree_device::`, which runs next on its own.
    timeout 200 "$dir/it" device:: --skip tree_device:: --test-threads=1 --nocapture
    echo "== token-tree device tests (tree module compiled on first use, tree conformance, tree step path and graph replay)"
    timeout 60 "$dir/it" tree_device:: --test-threads=1 --nocapture
    echo "== end to end: specula demo on the GPU (collector thread, asynchronous readback, log)"
    timeout 60 "$dir/specula" demo --backend cuda --batch 64 --duration 8 --log-interval 2
    echo "== benchmark grid"
    left=$((290 - ($(date +%s) - start)))
    [ "$left" -gt 10 ] || left=10
    timeout "$left" "$dir/grid" --bench
    echo "gpu-check: done in $(( $(date +%s) - start )) s"
    ;;
*)
    echo "usage: $0 pack [DIR] [--with-nvrtc]   (here, builds)   |   $0 run [DIR]   (on the CUDA host)" >&2
    exit 2
    ;;
esac
