#!/usr/bin/env bash
# package-check.sh: what a release needs, checked without publishing anything.
#
#   1. README     README.md is a guide: at most 200 lines, the dependency line, a verify call
#                 and the Prometheus wiring in its first 100; its quick start is the `specula`
#                 crate's docs.rs example, character for character (both are doc tests).
#   2. docs.rs    each published crate's docs as docs.rs builds them: nightly, `--cfg docsrs`,
#                 the features of its [package.metadata.docs.rs], warnings denied, links to the
#                 other crates resolved as on docs.rs; then no intra-doc link left unresolved.
#   3. examples   every host-std/examples/*.rs checked as the only file of a fresh crate that
#                 depends on `specula` alone (path dependency, the example's required
#                 features), plus only the integration crate the example shows (EXTRA_DEPS).
#   4. publish    `cargo publish --workspace --dry-run` (packages every published crate, with
#                 its licence files, and builds each from its package), and the file lists.
#   5. MSRV       `cargo +<toolchain> check --locked` at each floor docs/RELEASING.md states
#                 ("MSRV"): the workspace's rust-version (the library crates with every feature
#                 but `candle` and `cuda`, the program, the core without default features;
#                 specula-cuda and `cuda` on cudarc 0.16 to 0.18), 1.87 for `candle`
#                 (candle-core 0.9.2), 1.88 for specula-cuda and `cuda` on cudarc 0.19 (the
#                 default). Missing toolchains are installed (rustup, minimal profile).
#
# Each step prints its name and its time; the run fails if any step fails (all steps run).
# A step whose tool is missing (nightly, the MSRV toolchain, network for the dry run) prints
# "SKIPPED: ..."; with CI=true it fails instead, so a broken set-up never passes as green.
# scripts/test.sh calls this script; it also runs on its own from any directory.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root="$(pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
scratch="$target/package-check"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
start=$(date +%s)
failed=() skipped=() times=()

# skip WHAT: a check that cannot run here; under CI=true, a failure.
skip() {
    echo "SKIPPED: $*"
    skipped+=("$*")
    if [ "${CI:-}" = "true" ]; then
        echo "FAIL: a tool is missing under CI=true: $*" >&2
        return 1
    fi
}

# run NAME FUNCTION: runs one step, timed; a failing step is recorded, the others still run.
run() {
    local step_name="$1" t0 rc
    shift
    printf '\n=== %s\n' "$step_name"
    t0=$(date +%s)
    "$@"
    rc=$?
    local dt=$(($(date +%s) - t0))
    times+=("$(printf '%6d s  %s' "$dt" "$step_name")")
    if [ "$rc" -ne 0 ]; then
        echo "FAILED: $step_name"
        failed+=("$step_name")
    fi
}

# toolchain NAME: the toolchain is installed (or installed now, minimal profile).
toolchain() {
    rustup run "$1" rustc --version >/dev/null 2>&1 && return 0
    command -v rustup >/dev/null || return 1
    rustup toolchain install "$1" --profile minimal >/dev/null 2>&1 &&
        rustup run "$1" rustc --version >/dev/null 2>&1
}

meta="$(cargo metadata --no-deps --format-version 1)" || exit 1
# The published crates, as "name features-of-docs.rs manifest-dir", one a line.
published="$(printf '%s' "$meta" | python3 -c '
import json, os, sys
m = json.load(sys.stdin)
for p in m["packages"]:
    if p["publish"] == []:
        continue
    docs = ((p.get("metadata") or {}).get("docs") or {}).get("rs") or {}
    print(p["name"], ",".join(docs.get("features", [])) or "-", os.path.dirname(p["manifest_path"]))
')" || exit 1
# The lowest rust-version a crate declares (the workspace's).
msrv="$(printf '%s' "$meta" | python3 -c '
import json, sys
ps = json.load(sys.stdin)["packages"]
v = lambda s: tuple(int(x) for x in s.split("."))
print(min((p["rust_version"] for p in ps if p["rust_version"]), key=v))
')" || exit 1
# The `cuda` feature's floor on its default cudarc major: cudarc 0.19.1 and later depend on
# libloading 0.9, which declares 1.88 (specula-cuda's own code and cudarc 0.16 to 0.18 need
# the workspace's, checked below with it).
cuda_msrv=1.88
# The `candle` feature's floor: candle-core 0.9.2 (the first with i32 tensors, which the vLLM
# outputs are) calls u*::is_multiple_of, stable in 1.87, and declares no rust-version.
candle_msrv=1.87

# ---------------------------------------------------------------------------------------- 1
readme_is_a_guide() {
    python3 - <<'EOF'
import re, sys
readme = open("README.md").read()
front = open("host-std/README.md").read()
lines = readme.splitlines()
bad = []
if len(lines) > 200:
    bad.append(f"README.md has {len(lines)} lines (at most 200)")
first = "\n".join(lines[:100])
for what, needle in (("the dependency line", "[dependencies]"), ("a verify call", ".verify("),
                     ("the Prometheus wiring", "SpecCollector")):
    if needle not in first:
        bad.append(f"README.md: {what} ({needle}) is not in the first 100 lines")
block = lambda s: (re.search(r"```rust\n(.*?)```", s, re.S) or [None, None])[1]
if block(readme) is None or block(readme) != block(front):
    bad.append("README.md's quick start differs from host-std/README.md's example (keep them equal)")
for b in bad:
    print(b)
print(f"README.md: {len(lines)} lines" + ("" if bad else "; quick start = specula's docs.rs example"))
sys.exit(1 if bad else 0)
EOF
}

# ---------------------------------------------------------------------------------------- 2
docs_rs() {
    if ! toolchain nightly; then
        skip "docs.rs build: no nightly toolchain"
        return
    fi
    # docs.rs links every dependency to its own docs.rs page; the workspace crates are path
    # dependencies here, so name their future pages the same way.
    local version ext="" rc=0 crate features
    version="$(printf '%s' "$meta" | python3 -c 'import json,sys; print(json.load(sys.stdin)["packages"][0]["version"])')"
    while read -r crate _ _; do
        ext="$ext --extern-html-root-url=${crate//-/_}=https://docs.rs/$crate/$version/"
    done <<<"$published"
    while read -r crate features _; do
        local flags=(--no-deps -p "$crate")
        [ "$features" = "-" ] || flags+=(--features "$features")
        echo "--- $crate (features: $features)"
        if ! RUSTDOCFLAGS="--cfg docsrs -D warnings -Zunstable-options$ext" \
            CARGO_TARGET_DIR="$scratch/docsrs" cargo +nightly doc -Zrustdoc-map "${flags[@]}"; then
            rc=1
            continue
        fi
        # An intra-doc link rustdoc resolved but could not turn into a URL stays "[`name`]".
        local dir="$scratch/docsrs/doc/${crate//-/_}" unresolved
        unresolved="$(grep -rhoE '\[<code>[^<]{1,80}</code>\]' "$dir" | sort | uniq -c | sort -rn)"
        if [ -n "$unresolved" ]; then
            echo "$crate: intra-doc links left unresolved:"
            echo "$unresolved" | head -20
            rc=1
        fi
    done <<<"$published"
    return $rc
}

# ---------------------------------------------------------------------------------------- 3
# The crates an example may use besides `specula`: the server or signal library it shows.
# Everything of Specula's own, `log`, `prometheus_client` and `half` included, comes through
# `specula`'s re-exports; an example that needs anything else fails to build here. `cargo check`:
# what is checked is which crates an example can name, which type checking decides;
# scripts/test.sh compiles, links and runs every example in the workspace (its examples and
# pick_backend steps, engine_step in the candle step), and a build here cost, besides, a cold
# debug build of the examples' dependencies (candle's too).
declare -A EXTRA_DEPS=(
    [axum_metrics]='axum = { version = "0.8", default-features = false, features = ["http1", "tokio"] }
tokio = { version = "1.44", default-features = false, features = ["rt", "net", "macros"] }'
    [engine_step]='axum = { version = "0.8", default-features = false, features = ["http1", "tokio"] }
tokio = { version = "1.44", default-features = false, features = ["rt", "net", "macros", "sync"] }'
    [graceful_shutdown]='[target.'"'"'cfg(unix)'"'"'.dependencies]
signal-hook = { version = "0.4", default-features = false, features = ["iterator"] }'
)
examples_as_crates() {
    local ws="$scratch/examples" rc=0 members=() e features src
    mkdir -p "$ws"
    local list
    list="$(printf '%s' "$meta" | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    if p["name"] != "specula":
        continue
    for t in p["targets"]:
        if "example" in t["kind"]:
            print(t["name"], ",".join(t.get("required-features") or []) or "-", t["src_path"])
')" || return 1
    while read -r e features src; do
        members+=("\"$e\"")
        mkdir -p "$ws/$e/src"
        # Copied only when it changed, so a warm run rebuilds nothing.
        cmp -s "$src" "$ws/$e/src/main.rs" || cp "$src" "$ws/$e/src/main.rs"
        local feat=""
        [ "$features" = "-" ] || feat=", features = [\"${features//,/\", \"}\"]"
        cat >"$ws/$e/Cargo.toml.new" <<EOF
[package]
name = "ex-${e//_/-}"
version = "0.0.0"
edition = "2024"
publish = false

[dependencies]
specula = { path = "$root/host-std"$feat }
${EXTRA_DEPS[$e]:-}
EOF
        # Rewritten only when it changes, so cargo's cache stays warm between runs.
        cmp -s "$ws/$e/Cargo.toml.new" "$ws/$e/Cargo.toml" || mv "$ws/$e/Cargo.toml.new" "$ws/$e/Cargo.toml"
        rm -f "$ws/$e/Cargo.toml.new"
    done <<<"$list"
    local joined
    joined="$(printf '%s, ' "${members[@]}")"
    printf '[workspace]\nresolver = "3"\nmembers = [%s]\n' "${joined%, }" >"$ws/Cargo.toml.new"
    cmp -s "$ws/Cargo.toml.new" "$ws/Cargo.toml" || mv "$ws/Cargo.toml.new" "$ws/Cargo.toml"
    rm -f "$ws/Cargo.toml.new"
    # The workspace's versions of every dependency (cargo drops what this workspace lacks).
    [ -f "$ws/Cargo.lock" ] || cp Cargo.lock "$ws/Cargo.lock"
    while read -r e features _; do
        local with="specula"
        [ "$features" = "-" ] || with="$with (features $features)"
        [ -z "${EXTRA_DEPS[$e]:-}" ] || with="$with + $(grep -oE '^[a-z-]+ =' <<<"${EXTRA_DEPS[$e]}" | tr -d ' =' | paste -sd, -)"
        echo "--- $e: $with"
        # One package at a time: its own features, not the union of all the examples'.
        (cd "$ws" && cargo check -q -p "ex-${e//_/-}") || rc=1
    done <<<"$list"
    return $rc
}

# ---------------------------------------------------------------------------------------- 4
publish_dry_run() {
    if ! cargo publish --help 2>/dev/null | grep -q -- '--workspace'; then
        skip "publish dry run: this cargo has no 'cargo publish --workspace' (cargo 1.90 or newer)"
        return
    fi
    local rc=0 crate files
    # The package contents: licence files and README inside every package.
    while read -r crate _ _; do
        files="$(cargo package --list --allow-dirty -p "$crate" 2>/dev/null)" || {
            echo "cargo package --list -p $crate failed"
            rc=1
            continue
        }
        for f in LICENSE-MIT LICENSE-APACHE README.md Cargo.toml; do
            grep -qx "$f" <<<"$files" || {
                echo "$crate: $f is not in the package"
                rc=1
            }
        done
        echo "$crate: $(wc -l <<<"$files") files, licences and README included"
    done <<<"$published"
    # The dry run resolves the dependencies against the crates.io index.
    if command -v curl >/dev/null && ! curl -sf --max-time 30 -o /dev/null https://index.crates.io/config.json; then
        skip "publish dry run: the crates.io index is not reachable"
        return
    fi
    # The dry run verifies each package against the others through a local registry, which cargo
    # unpacks under $CARGO_HOME/registry/src/-<hash>/NAME-VERSION and never unpacks again while
    # that folder exists: a second run on the same machine would build against the first run's
    # sources (same version, old code). Remove our crates' copies there (only in that local
    # registry's folders, whose names start with '-'; crates.io's are untouched).
    local version home="${CARGO_HOME:-$HOME/.cargo}"
    version="$(printf '%s' "$meta" | python3 -c 'import json,sys; print(json.load(sys.stdin)["packages"][0]["version"])')"
    while read -r crate _ _; do
        rm -rf "$home"/registry/src/-*/"$crate-$version"
    done <<<"$published"
    # --allow-dirty: what is checked is what the working tree would publish.
    cargo publish --workspace --dry-run --allow-dirty || rc=1
    return $rc
}

# ---------------------------------------------------------------------------------------- 5
# check_at TOOLCHAIN ARGS...: `cargo check --locked` with that toolchain. --locked: the
# committed Cargo.lock, which the MSRV-aware resolver (resolver 3) keeps at versions whose
# declared rust-version is at most the workspace's. A target directory per toolchain: builds by
# different compilers share nothing.
check_at() {
    local t="$1"
    shift
    printf -- '--- Rust %s: %s\n' "$t" "$*"
    CARGO_TARGET_DIR="$scratch/msrv-$t" cargo "+$t" check --locked "$@"
}

msrv_check() {
    local t
    for t in "$msrv" "$candle_msrv" "$cuda_msrv"; do
        if ! toolchain "$t"; then
            skip "MSRV check: toolchain $t could not be installed"
            return
        fi
    done
    check_at "$msrv" -p specula-core -p specula-rocm -p specula -p specula-cli \
        --features specula/metrics,specula/http,specula/axum,specula/rocm &&
        check_at "$msrv" -p specula-core --no-default-features &&
        check_at "$msrv" -p specula-cuda -p specula --no-default-features \
            --features specula/cuda,specula/cuda-version,specula/cudarc-0-16,specula/cuda-dynamic-loading &&
        check_at "$msrv" -p specula-cuda --no-default-features \
            --features cudarc-0-17,cuda-12060,dynamic-loading &&
        check_at "$msrv" -p specula-cuda --no-default-features \
            --features cudarc-0-18,cuda-12060,dynamic-loading &&
        check_at "$candle_msrv" -p specula --features specula/candle &&
        check_at "$cuda_msrv" -p specula-cuda -p specula -p specula-cli \
            --features specula/cuda,specula-cli/cuda
}

run "README is a guide (length, first screen, quick start = docs.rs example)" readme_is_a_guide
run "docs.rs build of every published crate (nightly, --cfg docsrs, warnings denied)" docs_rs
run "examples as crates that depend on specula alone" examples_as_crates
run "cargo publish --workspace --dry-run" publish_dry_run
run "MSRV: Rust $msrv (workspace), $candle_msrv (candle), $cuda_msrv (cuda)" msrv_check

printf '\n=== summary\n'
printf '%s\n' "${times[@]}"
[ ${#skipped[@]} -eq 0 ] || printf 'SKIPPED: %s\n' "${skipped[@]}"
if [ ${#failed[@]} -ne 0 ]; then
    printf 'FAILED: %s\n' "${failed[@]}"
    echo "package checks failed after $(($(date +%s) - start)) s"
    exit 1
fi
echo "package checks passed in $(($(date +%s) - start)) s"
