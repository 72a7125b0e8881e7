#!/usr/bin/env bash
# Every check Specula has that runs without a GPU: the README's test command.
#
# Tools some steps need and how they get here (.ci/run installs them on a clean machine):
#   nightly + miri + rust-src        Miri on the core
#   thumbv7em/thumbv6m/riscv32imc    no_std builds of the core
#   .tools/cuda, .tools/cuda13 (scripts/cuda-tools.sh)   NVRTC + ptxas 12.9 and 13.5: kernel
#                                    compiles for sm_80/sm_90
#   hipcc, libamdhip64 (scripts/rocm-tools.sh)   kernel compiles for gfx90a/gfx940
#   prometheus, promtool (scripts/prometheus-check.sh installs them)
# A test whose tool is missing says that it was skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n=== %s\n' "$*"; }
FEATURES=specula/metrics,specula/cuda,specula/rocm

# NVRTC and ptxas for the kernel compile checks (installed into .tools/cuda when missing).
# shellcheck source=cuda-tools.sh
. scripts/cuda-tools.sh || echo "NVRTC/ptxas unavailable: the CUDA compile checks will say skipped"

step "format"
cargo fmt --all -- --check

step "clippy (all targets, warnings denied)"
cargo clippy --workspace --all-targets --features "$FEATURES" -- -D warnings

step "docs (warnings denied: broken links, missing docs)"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --features "$FEATURES"

step "tests (debug)"
cargo test --workspace --features "$FEATURES"

step "kernel compile checks with NVRTC and ptxas 13"
if [ -n "${SPECULA_CUDA13_NVRTC:-}" ]; then
    SPECULA_NVRTC="$SPECULA_CUDA13_NVRTC" SPECULA_PTXAS="$SPECULA_CUDA13_PTXAS" \
        SPECULA_EXPECT_NVRTC_MAJOR=13 cargo test -p specula-cuda --test nvrtc -- --nocapture
    # Found without SPECULA_NVRTC or the loader path: in $CUDA_HOME/lib64, as a toolkit has it.
    home="$(mktemp -d)"
    ln -s "$(dirname "$SPECULA_CUDA13_NVRTC")" "$home/lib64"
    env -u LD_LIBRARY_PATH CUDA_HOME="$home" SPECULA_EXPECT_NVRTC_MAJOR=13 \
        SPECULA_PTXAS="$SPECULA_CUDA13_PTXAS" cargo test -p specula-cuda --test nvrtc
    rm -rf "$home"
else
    echo "skipped: CUDA 13 tools not installed (scripts/cuda-tools.sh)"
fi

step "statistical tests (release): small-V chi-square, tails at V = 128k-256k, the race variate map"
cargo test --release -p specula-tests --test verify_stats --test race_tails --test race_variates

step "no_std builds of the core"
for t in thumbv7em-none-eabihf thumbv6m-none-eabi riscv32imc-unknown-none-elf; do
    cargo build -p specula-core --target "$t"
done
cargo build -p specula-core --target thumbv7em-none-eabihf --features defmt
cargo build -p specula-core --target riscv32imc-unknown-none-elf --features critical-section

step "Miri (core)"
cargo +nightly miri test -p specula-core

step "loom (core slot)"
RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom \
    cargo test -p specula-core --release --test loom

step "real Prometheus scraping the demo"
cargo build --release -p specula
SPECULA_BIN=target/release/specula scripts/prometheus-check.sh

step "all checks passed"
