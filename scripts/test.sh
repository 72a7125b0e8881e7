#!/usr/bin/env bash
# Every check Specula has that runs without a GPU: the README's test command.
#
#   scripts/test.sh          the full run, what CI does (every check below)
#   scripts/test.sh quick    the developer's loop, a few minutes warm: format, clippy, and the
#                            fast tier (nextest profile `quick` in .config/nextest.toml: no
#                            `toolchain`, no `statistics` binary); installs nothing
#
# The full run sets itself up: whatever a step needs and is missing is installed first (set-up),
# then the checks run:
#
#   cargo-nextest                    the test runner of every test step       (cargo install)
#   nightly + miri + rust-src        Miri on the core                         (rustup)
#   thumbv7em/thumbv6m/riscv32imc    no_std builds of the core                (rustup)
#   NVRTC + ptxas 12.9 and 13.5      kernel compiles for sm_80/sm_90 (scripts/cuda-tools.sh:
#                                    pip wheels into .tools/)
#   hipcc, libamdhip64, hiprtc       kernel compiles for gfx90a/gfx940 (scripts/rocm-tools.sh:
#                                    Debian's ROCm 5.2, needs root + apt-get)
#   prometheus, promtool             the end-to-end scrape check              (Debian, apt-get)
#   cargo-mutants                    mutation testing of the core             (cargo install)
#   Rust 1.86, 1.87, 1.88            the MSRV checks (docs/RELEASING.md)      (rustup, by
#                                    scripts/package-check.sh when it runs them)
#
# Every step prints its wall time when it ends, and the summary lists the steps by time. Steps
# that share nothing with the main build (Miri, loom, the no_std builds, the candle link check,
# the cudarc majors, the candle feature's checks, scripts/package-check.sh, mutation testing,
# each in a target directory of its own) run in a second lane beside it; their output is
# printed whole when they end, so it never interleaves.
# The kernel is compiled once per toolchain and target: the NVRTC 12.9 test keeps its ptxas
# report of the kernel in target/kernel-cache, and the kernel report reads it from there.
#
# A check whose tool could not be installed is SKIPPED: it says so where it runs and again in
# the summary at the end. With CI=true (as .ci/run has it) a missing tool fails the run instead,
# so a broken set-up can never pass as green. Tests that skip for want of a tool append a line to
# $SPECULA_SKIP_LOG, which this script sets and prints.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
tier="${1:-full}"
case "$tier" in
full | quick) ;;
-h | --help)
    sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
*)
    echo "usage: $0 [full|quick]" >&2
    exit 2
    ;;
esac
# Where cargo builds (CARGO_TARGET_DIR when set, as cargo itself reads it).
target="${CARGO_TARGET_DIR:-$root/target}"
start=$(date +%s)
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
FEATURES=specula/metrics,specula/cuda,specula/rocm,specula/http,specula/axum

work="$(mktemp -d)"
SPECULA_SKIP_LOG="$work/skipped"
: >"$SPECULA_SKIP_LOG"
export SPECULA_SKIP_LOG
STEP_LOG="$work/steps"
: >"$STEP_LOG"
bg_pids=()
lane_steps=()
cleanup() {
    for p in "${bg_pids[@]}"; do
        pkill -P "$p" 2>/dev/null || true
        kill "$p" 2>/dev/null || true
    done
    rm -rf "$work"
}
trap cleanup EXIT

# skip WHAT: record a check that cannot run here; under CI=true, fail the run.
skip() {
    echo "SKIPPED: $*" | tee -a "$SPECULA_SKIP_LOG"
    if [ "${CI:-}" = "true" ]; then
        echo "FAIL: a tool is missing under CI=true: $*" >&2
        exit 1
    fi
}

# run_e COMMAND...: runs COMMAND (a function, say) in a subshell with errexit in force, and
# leaves its status in $run_rc. Call it as a plain command, never as `run_e ... || ...`: in
# that context bash ignores errexit in everything it runs, and a failing command inside a
# function would not stop it.
run_rc=0
run_e() {
    set +e
    (
        set -e
        "$@"
    )
    run_rc=$?
    set -e
}

# step NAME FUNCTION...: runs FUNCTION in the foreground under a header, and records its time.
step() {
    local name="$1" t0 rc=0
    shift
    printf '\n=== %s\n' "$name"
    t0=$(date +%s)
    run_e "$@"
    rc=$run_rc
    printf '%6d s  %s\n' $(($(date +%s) - t0)) "$name" | tee -a "$STEP_LOG"
    if [ "$rc" != 0 ]; then
        echo "FAIL: step '$name' (exit $rc)" >&2
        exit "$rc"
    fi
}

# lane FUNCTION...: runs the FUNCTIONs one after another in the background (the second lane),
# each as a step whose output goes to a log of its own; `join` prints them.
lane() {
    lane_steps=("$@")
    (
        for f in "$@"; do
            t0=$(date +%s)
            run_e "$f" >"$work/lane-$f.log" 2>&1
            rc=$run_rc
            printf '%6d s  %s (second lane)\n' $(($(date +%s) - t0)) "$f" >"$work/lane-$f.time"
            echo "$rc" >"$work/lane-$f.rc"
            [ "$rc" = 0 ] || exit "$rc"
        done
    ) &
    bg_pids+=($!)
    echo "started in the second lane: ${lane_steps[*]}"
}

# join: waits for the second lane, prints each of its steps' output in order, fails if one
# failed (the lane stops at its first failure).
join() {
    local rc=0 p n
    for p in "${bg_pids[@]}"; do wait "$p" || rc=1; done
    bg_pids=()
    for n in "${lane_steps[@]}"; do
        printf '\n=== %s (second lane)\n' "$n"
        if [ ! -e "$work/lane-$n.rc" ]; then
            echo "(not run: an earlier step of the lane failed)"
            continue
        fi
        cat "$work/lane-$n.log"
        tee -a "$STEP_LOG" <"$work/lane-$n.time"
        if [ "$(cat "$work/lane-$n.rc")" != 0 ]; then
            echo "FAIL: step '$n' (second lane, exit $(cat "$work/lane-$n.rc"))" >&2
            rc=1
        fi
    done
    return "$rc"
}

summary() {
    printf '\n=== summary (%s run)\n' "$tier"
    echo "steps by wall time (the second lane's overlap the first):"
    sort -rn "$STEP_LOG" | sed 's/^/  /'
    if [ -s "$SPECULA_SKIP_LOG" ]; then
        echo "checks SKIPPED for want of a tool ($(sort -u "$SPECULA_SKIP_LOG" | wc -l)):"
        sort -u "$SPECULA_SKIP_LOG" | sed 's/^/  /'
    else
        echo "no check was skipped"
    fi
    echo "all checks passed in $(($(date +%s) - start)) s ($tier run)"
}

# ------------------------------------------------------------------------------- set-up
targets="thumbv7em-none-eabihf thumbv6m-none-eabi riscv32imc-unknown-none-elf"
have_targets=1 have_miri=1 have_cuda=1 have_rocm=1 have_prometheus=1 have_mutants=1
setup() {
    if ! cargo nextest --version >/dev/null 2>&1; then
        cargo install cargo-nextest --locked
    fi
    [ "$tier" = quick ] && return 0
    for t in $targets; do
        if ! rustup target list --installed 2>/dev/null | grep -qx "$t"; then
            rustup target add "$t" || have_targets=0
        fi
    done
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
    # shellcheck source=cuda-tools.sh
    . scripts/cuda-tools.sh || have_cuda=0
    bash scripts/rocm-tools.sh || have_rocm=0
    if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
        if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
            DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
                DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
                    prometheus >/dev/null || true
        fi
        { command -v prometheus >/dev/null && command -v promtool >/dev/null; } || have_prometheus=0
    fi
    command -v curl >/dev/null || have_prometheus=0
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
    [ -n "${SPECULA_CUOBJDUMP:-}" ] || skip "kernel report: cuobjdump/nvdisasm (scripts/cuda-tools.sh)"
    return 0
}
# (Not in a subshell: cuda-tools.sh exports the tool paths into this shell. errexit holds.)
printf '\n=== set-up: install what is missing\n'
t0=$(date +%s)
setup
printf '%6d s  %s\n' $(($(date +%s) - t0)) "set-up: install what is missing" | tee -a "$STEP_LOG"

# ------------------------------------------------------------------------------- the checks
format() { cargo fmt --all -- --check; }

clippy_all() {
    cargo clippy --workspace --all-targets --features "$FEATURES" -- -D warnings
    # The library as a runtime uses it: no program, no server (other cfg'd code).
    cargo clippy -p specula --all-targets -- -D warnings
}

docs() { RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --features "$FEATURES"; }

tests_debug() {
    # The NVRTC 12.9 test keeps the kernel's PTX, cubin and ptxas report for the kernel report.
    rm -rf "$target/kernel-cache"
    SPECULA_KERNEL_CACHE="$target/kernel-cache" \
        cargo nextest run --workspace --features "$FEATURES" --profile "${1:-default}"
}

doctests() { cargo test --doc --workspace --features "$FEATURES"; }

examples() {
    for e in cpu_runtime ranks axum_metrics graceful_shutdown ragged_step; do
        echo "--- $e"
        "$target/debug/examples/$e" >/dev/null
    done
}

pick_backend() {
    # Expected exit status per feature set for: cpu, reference, cuda, rocm, a malformed name. A
    # compiled-in GPU backend ("g") exits 0 where it has a device and 4 where it has none; 3
    # (not compiled in), 2 (malformed) and 0 (CPU) hold on every machine.
    # Both GPU backends: the build the tests made (every feature), first, before the other
    # sets replace it.
    local set feats want flag got ok name rc
    for set in "cuda,rocm:0 0 g g 2" "none:0 0 3 3 2" "cuda:0 0 g 3 2" "rocm:0 0 3 g 2"; do
        feats="${set%%:*}" want="${set#*:}"
        if [ "$feats" = none ]; then flag=(); else flag=(--features "$feats"); fi
        if [ "$feats" != cuda,rocm ]; then
            cargo build -q -p specula --example pick_backend "${flag[@]}"
        fi
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
            return 1
        fi
    done
}

link_candle() {
    # tests/link-candle depends on cudarc as candle-core's `cuda` feature does and on specula
    # with `cuda`, handing its own cudarc slice to Specula (which type-checks only where both
    # name one cudarc major); with Specula's default version, and with the application naming
    # its own version (default features off); on cudarc 0.19 (candle-core 0.9.2) and 0.16
    # (candle-core 0.9.1). Negative controls: two CUDA versions at once, and two cudarc majors
    # in Specula at once, must not build.
    cd tests/link-candle
    export CARGO_TARGET_DIR="$target/link-candle"
    cargo check -q
    cargo check -q --no-default-features --features own-version,major-19
    cargo check -q --no-default-features --features pinned,major-16
    cargo check -q --no-default-features --features own-version,major-16
    if cargo check -q --features own-version 2>/dev/null; then
        echo "negative control built: the check cannot see a version conflict" >&2
        return 1
    fi
    if cargo check -q --features major-16 2>/dev/null; then
        echo "negative control built: two cudarc majors were not refused" >&2
        return 1
    fi
    echo "links with candle's cudarc features on cudarc 0.19 and 0.16; two CUDA versions and two cudarc majors refused as expected"
}

cudarc_majors() {
    # specula-cuda against each cudarc major it supports (0.16 to 0.19, a feature each), and
    # no major or two refused: cargo check only, in its own target directory.
    CARGO_TARGET_DIR="$target/cudarc-majors" scripts/cudarc-majors.sh
}

candle_engine() {
    # The `candle` feature (candle-core 0.9, CPU tensors): clippy over everything it adds, its
    # tests (the `candle` modules of the library and of the `it` binary) and doc tests, then
    # the engine_step example end to end (candle tensors in, vLLM tokens out, /metrics served
    # by axum and scraped once, flushed at shutdown). Its own target directory: no other step
    # builds candle, so the main build's artifacts stay as they are.
    export CARGO_TARGET_DIR="$target/candle"
    local f=candle,axum
    cargo clippy -q -p specula --all-targets --features "$f" -- -D warnings
    cargo nextest run -p specula --features "$f" -E 'test(/^candle::/)' --cargo-quiet \
        --status-level fail --final-status-level fail
    cargo test -q -p specula --features "$f" --doc candle
    cargo run -q -p specula --example engine_step --features "$f"
    echo "candle: clippy clean, tests and doc tests pass, engine_step ran (tokens and /metrics checked)"
}

cuda13() {
    # The test binary loads NVRTC at run time: the one built for the debug tests (same
    # packages and features: nothing is rebuilt), run again with NVRTC/ptxas 13.5.
    SPECULA_NVRTC="$SPECULA_CUDA13_NVRTC" SPECULA_PTXAS="$SPECULA_CUDA13_PTXAS" \
        SPECULA_EXPECT_NVRTC_MAJOR=13 cargo nextest run --workspace --features "$FEATURES" \
        -E 'package(specula-cuda) & binary(toolchain)' --success-output final
    # Found without SPECULA_NVRTC or the loader path: in $CUDA_HOME/lib64, as a toolkit has it.
    # (Only the loading test: the kernel was compiled by NVRTC 13 just above.)
    local home
    home="$(mktemp -d)"
    ln -s "$(dirname "$SPECULA_CUDA13_NVRTC")" "$home/lib64"
    env -u LD_LIBRARY_PATH CUDA_HOME="$home" SPECULA_EXPECT_NVRTC_MAJOR=13 \
        SPECULA_PTXAS="$SPECULA_CUDA13_PTXAS" cargo nextest run --workspace --features "$FEATURES" \
        -E 'package(specula-cuda) & binary(toolchain) & test(=nvrtc::nvrtc_loads_the_expected_major)'
    rm -rf "$home"
}

kernel_report() {
    # Compiles the kernel's probes with the crate's NVRTC options for sm_80 and sm_90, reads
    # the SASS (the kernel itself from the NVRTC 12.9 test's cache), fails on spills in a row
    # loop or a pass over its instruction budget, and prints the model's predictions.
    python3 scripts/kernel-report.py --kernel-cache "$target/kernel-cache"
}

statistics() {
    # The statistics tier, the `statistics` binaries: small-V chi-square, tails at V = 128k-256k,
    # the race variate map, the logits and filter laws, token trees (reference and GPU path),
    # exact entropy (specula-tests); the collector's freshness sweep at CI size (specula-core).
    # Cargo's `statistics` profile: release code with overflow checks in the test code and the
    # core (the workspace Cargo.toml says why); `--test statistics` builds those binaries alone.
    cargo nextest run --workspace --cargo-profile statistics --profile statistics \
        --test statistics
}

no_std_builds() {
    export CARGO_TARGET_DIR="$target/no-std"
    local t
    for t in $targets; do
        cargo build -q -p specula-core --target "$t"
    done
    cargo build -q -p specula-core --target thumbv7em-none-eabihf --features defmt
    cargo build -q -p specula-core --target riscv32imc-unknown-none-elf --features critical-section
    echo "built for $targets (and defmt, critical-section)"
}

# Miri finds undefined behaviour, which only unsafe code (gpu/) can cause, and runs the metrics'
# atomics under its weak-memory model. Verification has neither (`#![forbid(unsafe_code)]` in
# core/src/verify/mod.rs, no atomics), so its tests run in the debug and statistics steps only:
# the lib's `verify::` modules and doc examples, and the `it` files whose subject is the
# reference arithmetic (none of them reaches gpu/). Measured one test at a time
# (`--test-threads=1 -Zunstable-options --report-time`): about 60 s of 490 (lib 61 -> 33 s,
# doc tests 11 -> 2.5 s, `it` 24 s); the rest is the collector and delivery simulations and
# the gpu/ tests over the fake driver.
# Also left to the debug step, by `#[cfg_attr(miri, ignore)]` or `cfg!(miri)` in the tests: the
# scans of the kernel text (160 KB of `str` searches, about 4 minutes under Miri) and the longest
# collector, delivery and unaligned-timers simulations (safe code on one thread: no unsafe
# operation and no second thread for Miri to check; the short ones still run here), and
# `gpu::methods_and_filters_are_staged_and_passed` takes 5 of its 15 input combinations and 4 of
# its 16 replays (each the same unsafe launch). The `it` binary under Miri: 468 -> 131 s of CPU
# (docs/PERFORMANCE.md, "The full CI run").
miri() {
    cargo +nightly miri test -p specula-core -- --skip verify:: --skip reference:: \
        --skip validate:: --skip numerics:: --skip batch:: --skip recovered::
}

loom() {
    RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR="$target/loom" \
        cargo test -p specula-core --release --test loom
}

mutants() {
    # The mutants on the lines changed since the merge base with main (on main itself: by the
    # last commit); fails on a surviving mutant not explained in core/mutants-survivors.txt.
    # (cargo-mutants builds a copy of the tree in a directory of its own.)
    MUTANTS_OUT="$target/mutants" scripts/mutants.sh --changed
}

package_check() {
    # Release readiness: the README as a guide, the docs.rs build (nightly, --cfg docsrs),
    # each example as a crate depending on `specula` alone, the publish dry run, the MSRV builds
    # (1.86, and the `candle` and `cuda` floors, 1.87 and 1.88).
    scripts/package-check.sh
}

prometheus_checks() {
    # The program the debug tests built (every feature): the check compares what Prometheus
    # scraped with what the demo printed, whatever its speed; a release build for this step
    # alone was a cold build of the program and its dependencies, 120 s of CPU
    # (docs/PERFORMANCE.md, "The full CI run"). Built here only when run out of order.
    local bin="$target/debug/specula"
    [ -x "$bin" ] || cargo build -q -p specula-cli --features "$FEATURES"
    SPECULA_BIN="$bin" scripts/prometheus-check.sh
    # Again on the tree drafter: the tree families, the dashboard's tree panels with data.
    SPECULA_BIN="$bin" DEMO_ARGS="--tree 2x4" scripts/prometheus-check.sh
}

if [ "$tier" = quick ]; then
    step "format" format
    step "clippy (workspace, all targets, every feature; warnings denied)" \
        cargo clippy --workspace --all-targets --features "$FEATURES" -- -D warnings
    step "tests (debug, nextest profile quick)" tests_debug quick
    summary
    exit 0
fi

# The second lane: nothing here shares a target directory with the main build.
second=()
[ "$have_miri" = 1 ] && second+=(miri)
second+=(loom)
[ "$have_targets" = 1 ] && second+=(no_std_builds)
second+=(link_candle cudarc_majors candle_engine package_check)
[ "$have_mutants" = 1 ] && second+=(mutants)
lane "${second[@]}"

step "format" format
step "clippy (all targets, warnings denied)" clippy_all
step "docs (warnings denied: broken links, missing docs)" docs
step "tests (debug, nextest profile default: unit tests, fast and toolchain tiers)" tests_debug
step "doctests" doctests
step "examples (host-std/examples, built by the tests above)" examples
step "pick_backend under every feature set (a backend not compiled in exits 3)" pick_backend
if [ -n "${SPECULA_CUDA13_NVRTC:-}" ]; then
    step "kernel compile checks with NVRTC and ptxas 13" cuda13
fi
if [ "$have_cuda" = 1 ] && [ -n "${SPECULA_CUOBJDUMP:-}" ]; then
    step "kernel report: SASS per pass (instructions/element, registers, spills, bytes in flight), budgets, model predictions" kernel_report
fi
step "statistics tier (cargo and nextest profile statistics: optimised)" statistics
if [ "$have_prometheus" = 1 ]; then
    step "real Prometheus scraping the demo" prometheus_checks
fi
printf '\n=== waiting for the second lane\n'
t0=$(date +%s)
join
printf '%6d s  %s\n' $(($(date +%s) - t0)) "waiting for the second lane" | tee -a "$STEP_LOG"
summary
