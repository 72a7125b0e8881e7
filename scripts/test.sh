#!/usr/bin/env bash
# Every check Specula has that runs without a GPU: the README's test command. It sets itself up:
# whatever a step needs and is missing is installed first (steps 0), then the checks run.
#
#   nightly + miri + rust-src        Miri on the core                (rustup)
#   thumbv7em/thumbv6m/riscv32imc    no_std builds of the core       (rustup)
#   NVRTC + ptxas 12.9 and 13.5      kernel compiles for sm_80/sm_90 (scripts/cuda-tools.sh: pip
#                                    wheels into .tools/)
#   hipcc, libamdhip64, hiprtc       kernel compiles for gfx90a/gfx940 (scripts/rocm-tools.sh:
#                                    Debian's ROCm 5.2, needs root + apt-get)
#   prometheus, promtool             the end-to-end scrape check     (Debian, needs root + apt-get)
#   cargo-mutants                    mutation testing of the core    (cargo install --locked)
#
# A check whose tool could not be installed is SKIPPED: it says so where it runs and again in
# the summary at the end. With CI=true (as .ci/run has it) a missing tool fails the run instead,
# so a broken set-up can never pass as green. Tests that skip for want of a tool append a line to
# $SPECULA_SKIP_LOG, which this script sets and prints.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
# Where cargo builds (CARGO_TARGET_DIR when set, as cargo itself reads it).
target="${CARGO_TARGET_DIR:-$root/target}"
start=$(date +%s)
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

STEP_LOG="$(mktemp)"
step_name="" step_start=$(date +%s)
step() {
    local now
    now=$(date +%s)
    [ -n "$step_name" ] && printf '%6d s  %s\n' $((now - step_start)) "$step_name" | tee -a "$STEP_LOG"
    step_name="$*" step_start=$now
    printf '\n=== %s\n' "$*"
}
SPECULA_SKIP_LOG="$(mktemp)"
export SPECULA_SKIP_LOG
trap 'rm -f "$SPECULA_SKIP_LOG"' EXIT
# skip WHAT: record a check that cannot run here; under CI=true, fail the run.
skip() {
    echo "SKIPPED: $*" | tee -a "$SPECULA_SKIP_LOG"
    if [ "${CI:-}" = "true" ]; then
        echo "FAIL: a tool is missing under CI=true: $*" >&2
        exit 1
    fi
}
FEATURES=specula/metrics,specula/cuda,specula/rocm,specula/cli

step "0. set-up: install what is missing"
targets="thumbv7em-none-eabihf thumbv6m-none-eabi riscv32imc-unknown-none-elf"
have_targets=1
for t in $targets; do
    if ! rustup target list --installed 2>/dev/null | grep -qx "$t"; then
        rustup target add "$t" || have_targets=0
    fi
done
have_miri=1
if ! cargo +nightly miri --version >/dev/null 2>&1 ||
    ! rustup component list --toolchain nightly --installed 2>/dev/null | grep -q '^rust-src'; then
    # Adds the components to an installed nightly without updating it; installs nightly only
    # where there is none.
    if rustup run nightly rustc --version >/dev/null 2>&1; then
        rustup component add --toolchain nightly miri rust-src || have_miri=0
    else
        rustup toolchain install nightly --profile minimal --component miri,rust-src || have_miri=0
    fi
    cargo +nightly miri --version >/dev/null 2>&1 || have_miri=0
fi
have_cuda=1
# shellcheck source=cuda-tools.sh
. scripts/cuda-tools.sh || have_cuda=0
have_rocm=1
bash scripts/rocm-tools.sh || have_rocm=0
have_prometheus=1
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
        DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
                prometheus >/dev/null || true
    fi
    { command -v prometheus >/dev/null && command -v promtool >/dev/null; } || have_prometheus=0
fi
command -v curl >/dev/null || have_prometheus=0
have_mutants=1
if ! cargo mutants --version >/dev/null 2>&1; then
    cargo install cargo-mutants --locked || have_mutants=0
    cargo mutants --version >/dev/null 2>&1 || have_mutants=0
fi
[ "$have_targets" = 1 ] || skip "no_std builds: the embedded targets could not be installed"
[ "$have_miri" = 1 ] || skip "Miri: nightly with miri and rust-src could not be installed"
[ "$have_cuda" = 1 ] || skip "CUDA kernel compile checks: NVRTC/ptxas 12.9 (scripts/cuda-tools.sh)"
[ -n "${SPECULA_CUDA13_NVRTC:-}" ] || skip "CUDA 13 kernel compile check: NVRTC/ptxas 13.5"
[ "$have_rocm" = 1 ] || skip "ROCm kernel compile checks: hipcc/hiprtc (scripts/rocm-tools.sh)"
[ "$have_prometheus" = 1 ] || skip "real Prometheus scrape: prometheus, promtool or curl missing"
[ "$have_mutants" = 1 ] || skip "mutation testing: cargo-mutants could not be installed"
echo "set-up done after $(($(date +%s) - start)) s"

step "format"
cargo fmt --all -- --check

step "clippy (all targets, warnings denied)"
cargo clippy --workspace --all-targets --features "$FEATURES" -- -D warnings
# The library as a runtime uses it: no program, no server.
cargo clippy -p specula --all-targets -- -D warnings

step "docs (warnings denied: broken links, missing docs)"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --features "$FEATURES"

step "tests (debug)"
cargo test --workspace --features "$FEATURES"

step "examples (host-std/examples, built by the tests above)"
for e in cpu_runtime ranks axum_metrics graceful_shutdown ragged_step; do
    echo "--- $e"
    "$target/debug/examples/$e" >/dev/null
done

step "pick_backend under every feature set (the same code; a backend not compiled in exits 3)"
# Expected exit status per feature set for: cpu, reference, cuda, rocm, a malformed name. A
# compiled-in GPU backend ("g") exits 0 where it has a device and 4 where it has none; 3 (not
# compiled in), 2 (malformed) and 0 (CPU) hold on every machine.
for set in "none:0 0 3 3 2" "cuda:0 0 g 3 2" "rocm:0 0 3 g 2" "cuda,rocm:0 0 g g 2"; do
    feats="${set%%:*}" want="${set#*:}"
    if [ "$feats" = none ]; then flag=(); else flag=(--features "$feats"); fi
    cargo build -q -p specula --example pick_backend "${flag[@]}"
    got="" ok=1
    set -- $want
    for name in cpu reference cuda rocm nonsense; do
        rc=0
        "$target"/debug/examples/pick_backend "$name" >/dev/null 2>&1 || rc=$?
        got="$got${got:+ }$rc"
        case "$1:$rc" in
            g:0 | g:4) ;;
            "$rc:$rc") ;;
            *) ok=0 ;;
        esac
        shift
    done
    echo "--- features $feats: exit codes $got (cpu reference cuda rocm nonsense; g = 0 or 4)"
    if [ "$ok" != 1 ]; then
        echo "expected $want" >&2
        exit 1
    fi
done

step "CUDA backend links next to candle (cudarc dynamic-linking, the version from the build system)"
# tests/link-candle depends on cudarc as candle-core's `cuda` feature does and on specula with
# `cuda`; with Specula's default version, and with the application naming its own version
# (default features off). Negative control: both versions at once must not build.
(
    cd tests/link-candle
    export CARGO_TARGET_DIR="$target/link-candle"
    cargo check -q
    cargo check -q --no-default-features --features own-version
    if cargo check -q --features own-version 2>/dev/null; then
        echo "negative control built: the check cannot see a version conflict" >&2
        exit 1
    fi
    echo "links with candle's cudarc features; two CUDA versions refused as expected"
)

step "kernel compile checks with NVRTC and ptxas 13"
if [ -n "${SPECULA_CUDA13_NVRTC:-}" ]; then
    SPECULA_NVRTC="$SPECULA_CUDA13_NVRTC" SPECULA_PTXAS="$SPECULA_CUDA13_PTXAS" \
        SPECULA_EXPECT_NVRTC_MAJOR=13 cargo test -p specula-cuda --test nvrtc -- --nocapture
    # Found without SPECULA_NVRTC or the loader path: in $CUDA_HOME/lib64, as a toolkit has it.
    home="$(mktemp -d)"
    ln -s "$(dirname "$SPECULA_CUDA13_NVRTC")" "$home/lib64"
    # (Only the loading test: the kernel was compiled by NVRTC 13 just above.)
    env -u LD_LIBRARY_PATH CUDA_HOME="$home" SPECULA_EXPECT_NVRTC_MAJOR=13 \
        SPECULA_PTXAS="$SPECULA_CUDA13_PTXAS" cargo test -p specula-cuda --test nvrtc \
        nvrtc_loads_the_expected_major -- --exact
    rm -rf "$home"
else
    echo "SKIPPED (see the summary): CUDA 13 tools not installed"
fi

step "kernel report: SASS per pass (instructions/element, registers, spills, bytes in flight), budgets, model predictions"
# scripts/kernel-report.py: compiles the kernel and its probes with the crate's NVRTC options for
# sm_80 and sm_90, reads the SASS, fails on spills in a row loop or a pass over its instruction
# budget, and prints the latency/roofline model's predictions (README, "Kernel speed").
if [ "$have_cuda" = 1 ] && [ -n "${SPECULA_CUOBJDUMP:-}" ]; then
    python3 scripts/kernel-report.py
else
    skip "kernel report: NVRTC, ptxas or cuobjdump/nvdisasm missing (scripts/cuda-tools.sh)"
fi

step "statistical tests (release): small-V chi-square, tails at V = 128k-256k, the race variate map, filters, token trees (reference and GPU path), exact entropy"
cargo test --release -p specula-tests --test verify_stats --test race_tails --test race_variates \
    --test verify_logits --test verify_filters --test tree_stats --test gpu_tree_stats \
    --test entropy_exact

step "no_std builds of the core"
if [ "$have_targets" = 1 ]; then
    for t in $targets; do
        cargo build -p specula-core --target "$t"
    done
    cargo build -p specula-core --target thumbv7em-none-eabihf --features defmt
    cargo build -p specula-core --target riscv32imc-unknown-none-elf --features critical-section
else
    echo "SKIPPED (see the summary)"
fi

step "Miri (core)"
if [ "$have_miri" = 1 ]; then
    cargo +nightly miri test -p specula-core
else
    echo "SKIPPED (see the summary)"
fi

step "loom (core slot)"
RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR="$target/loom" \
    cargo test -p specula-core --release --test loom

step "mutation testing of the core (changed lines; full run: scripts/mutants.sh)"
if [ "$have_mutants" = 1 ]; then
    # The mutants on the lines changed since the merge base with main (on main itself: by the
    # last commit); fails on a surviving mutant not explained in core/mutants-survivors.txt.
    scripts/mutants.sh --changed
else
    echo "SKIPPED (see the summary)"
fi

step "real Prometheus scraping the demo"
if [ "$have_prometheus" = 1 ]; then
    cargo build --release -p specula --features cli
    SPECULA_BIN="$target/release/specula" scripts/prometheus-check.sh
    # Again on the tree drafter: the tree families, the dashboard's tree panels with data.
    SPECULA_BIN="$target/release/specula" DEMO_ARGS="--tree 2x4" scripts/prometheus-check.sh
else
    echo "SKIPPED (see the summary)"
fi

step "summary"
if [ -s "$SPECULA_SKIP_LOG" ]; then
    echo "checks SKIPPED for want of a tool ($(wc -l <"$SPECULA_SKIP_LOG")):"
    sort -u "$SPECULA_SKIP_LOG" | sed 's/^/  /'
else
    echo "no check was skipped"
fi
sort -rn "$STEP_LOG"
echo "all checks passed in $(($(date +%s) - start)) s"
