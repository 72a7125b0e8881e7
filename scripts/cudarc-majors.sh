#!/usr/bin/env bash
# cudarc-majors.sh: type-checks specula-cuda against every cudarc major it supports (0.16, 0.17,
# 0.18, 0.19), each picked by its feature `cudarc-0-NN` with the CUDA 12.6 bindings
# (`cuda-12060`) and, for 0.16 to 0.18, which have no fallback linking mode, `dynamic-loading`.
# No GPU and no CUDA toolkit needed: cudarc loads the libraries at run time.
#
#     scripts/cudarc-majors.sh           cargo check of the library, tests and bench per major,
#                                        then that no major and two majors are refused (CI:
#                                        scripts/test.sh runs this)
#     scripts/cudarc-majors.sh clippy    the same checks as clippy with warnings denied
#     scripts/cudarc-majors.sh test      the tests that need no GPU (nextest profile quick) per
#                                        major: the driver checks (a partial libcuda is a typed
#                                        error on every major), the NVRTC and error tests
#     scripts/cudarc-majors.sh oldest    cargo check against the oldest release of each major
#                                        that the workspace allows (the lower bounds in the
#                                        root Cargo.toml): rewrites Cargo.lock for the run and
#                                        restores it; run it alone, not beside other builds
#
# The versions are the committed Cargo.lock's (--locked), except in `oldest`. Its own target
# directory (target/cudarc-majors, or CARGO_TARGET_DIR): the main build's artefacts stay as
# they are. The MSRV of each major (1.86 for 0.16 to 0.18, 1.88 for 0.19) is checked by
# scripts/package-check.sh.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
mode="${1:-check}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target/cudarc-majors}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

# major NN: the features of a build against cudarc 0.NN.
features() {
    case "$1" in
    19) echo "cudarc-0-19,cuda-12060" ;;
    *) echo "cudarc-0-$1,cuda-12060,dynamic-loading" ;;
    esac
}

# check_major NN [--locked]: the library, tests and bench against cudarc 0.NN.
check_major() {
    local m="$1" t0 what
    shift
    t0=$(date +%s)
    case "$mode" in
    clippy)
        cargo clippy -q "$@" -p specula-cuda --all-targets --no-default-features \
            --features "$(features "$m")" -- -D warnings
        ;;
    test)
        cargo nextest run "$@" -p specula-cuda --profile quick --no-default-features \
            --features "$(features "$m")" --cargo-quiet --status-level fail \
            --final-status-level fail
        ;;
    *)
        cargo check -q "$@" -p specula-cuda --all-targets --no-default-features \
            --features "$(features "$m")"
        ;;
    esac
    what="cargo check clean"
    case "$mode" in
    clippy) what="clippy -D warnings clean" ;;
    test) what="quick tests pass" ;;
    esac
    printf 'cudarc 0.%s (%s): %s in %d s\n' "$m" "$(locked_version "$m")" "$what" \
        $(($(date +%s) - t0))
}

# locked_version NN: the cudarc 0.NN.x that Cargo.lock holds.
locked_version() {
    grep -A1 '^name = "cudarc"$' Cargo.lock | sed -n 's/^version = "\(0\.'"$1"'\.[0-9]*\)"$/\1/p'
}

# refused FEATURES MESSAGE: the build with FEATURES must fail with MESSAGE (the crate's
# compile_error!), not build and not fail for another reason.
refused() {
    local out
    if out="$(cargo check -q --locked -p specula-cuda --no-default-features --features "$1" 2>&1)"; then
        echo "built with features $1: expected the error \"$2\"" >&2
        return 1
    fi
    if ! grep -q -- "$2" <<<"$out"; then
        printf 'features %s failed, but not with "%s":\n%s\n' "$1" "$2" "$out" >&2
        return 1
    fi
    echo "features $1: refused (\"$2\")"
}

case "$mode" in
test)
    for m in 16 17 18 19; do
        check_major "$m" --locked
    done
    ;;
check | clippy)
    for m in 16 17 18 19; do
        check_major "$m" --locked
    done
    refused cuda-12060 "turn on one cudarc major feature"
    refused cudarc-0-16,cudarc-0-19,cuda-12060,dynamic-loading "two cudarc major features are on"
    ;;
oldest)
    # The lower bounds of the root Cargo.toml's cudarc_0NN requirements. 0.17.3, not 0.17.0:
    # candle-core's `cuda` feature (through ug-cuda 0.5) needs cudarc ^0.17.3 and shares the
    # workspace's lock file.
    saved="$(mktemp)"
    cp Cargo.lock "$saved"
    trap 'cp "$saved" Cargo.lock; rm -f "$saved"' EXIT
    for v in 0.16.0 0.17.3 0.18.0 0.19.0; do
        m="${v#0.}"
        m="${m%%.*}"
        cargo update -q -p "cudarc@$(locked_version "$m")" --precise "$v"
        check_major "$m"
    done
    ;;
*)
    sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
