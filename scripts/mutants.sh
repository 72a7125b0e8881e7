#!/usr/bin/env bash
# Mutation testing of specula-core with cargo-mutants (issue 19).
#
#   scripts/mutants.sh                  every mutant of the measured files (2 664 mutants, some 14 h
#                                       on 2 cores: a job for a machine left alone)
#   scripts/mutants.sh --changed [BASE] only the mutants on lines changed since BASE (the default:
#                                       the merge base with main, or HEAD~1 when HEAD is on main,
#                                       as in CI on a fresh clone of main); uncommitted changes count
#   scripts/mutants.sh ... -- ARGS      ARGS go to cargo-mutants (e.g. -- -f core/src/metrics/slot.rs)
#   MUTANTS_MAX=N (default 100)          --changed tests at most about N mutants (one slice of them)
#   MUTANTS_OUT=DIR (default target/mutants)  where cargo-mutants writes mutants.out
#
# What is measured, and with which tests, is in .cargo/mutants.toml. A mutant that no test catches
# must be listed in core/mutants-survivors.txt with a one-line reason (equivalent, or why no test
# can see it); the script fails (exit 1) on any surviving mutant that is not listed. A mutant that
# makes the tests hang past the timeout counts as caught. The full run also fails when the score
# (caught / viable) is below 95 %, and when a listed survivor no longer survives (stale entry).
# Needs cargo-mutants (`cargo install cargo-mutants --locked`; scripts/test.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."

SURVIVORS=core/mutants-survivors.txt
MIN_SCORE=95
mode=full
base=
extra=()
while [ $# -gt 0 ]; do
    case "$1" in
    --changed)
        mode=changed
        if [ $# -gt 1 ] && [ "${2#-}" = "$2" ]; then
            base="$2"
            shift
        fi
        ;;
    --)
        shift
        extra=("$@")
        break
        ;;
    -h | --help)
        sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *)
        echo "usage: $0 [--changed [BASE]] [-- CARGO_MUTANTS_ARGS...]" >&2
        exit 2
        ;;
    esac
    shift
done

# A full run narrowed by ARGS (say `-f FILE`) checks its survivors, not the score or stale entries.
if [ "$mode" = full ] && [ ${#extra[@]} -gt 0 ]; then
    mode=partial
fi

if ! cargo mutants --version >/dev/null 2>&1; then
    echo "cargo-mutants is not installed: cargo install cargo-mutants --locked" >&2
    exit 1
fi

out=${MUTANTS_OUT:-target/mutants}
rm -rf "$out"
mkdir -p "$out"
args=(--package specula-core --jobs 1 --timeout 30 --output "$out" --colors never)

if [ "$mode" = changed ]; then
    if [ -z "$base" ]; then
        head=$(git rev-parse HEAD)
        for ref in origin/main main; do
            if git rev-parse -q --verify "$ref^{commit}" >/dev/null; then
                mb=$(git merge-base HEAD "$ref" || true)
                if [ -n "$mb" ] && [ "$mb" != "$head" ]; then
                    base=$mb
                    break
                fi
            fi
        done
        if [ -z "$base" ]; then
            # On main itself (CI on a fresh clone): the last commit's changes. A shallow clone
            # may lack the parent: deepen it by one commit.
            if ! git rev-parse -q --verify 'HEAD~1^{commit}' >/dev/null; then
                git fetch --quiet --deepen=1 2>/dev/null || true
            fi
            if ! git rev-parse -q --verify 'HEAD~1^{commit}' >/dev/null; then
                echo "mutants: no base to compare with (HEAD has no parent here); give one:" \
                    "$0 --changed BASE" >&2
                exit 1
            fi
            base=HEAD~1
        fi
    fi
    diff_file="$out/changed.diff"
    # The working tree against BASE, core sources only (the only files cargo-mutants mutates).
    git diff --no-color "$base" -- core/src >"$diff_file"
    echo "mutants: lines of core/src changed since $(git rev-parse --short "$base") ($base)"
    if [ ! -s "$diff_file" ]; then
        echo "mutants: no core/src line changed: nothing to mutate"
        exit 0
    fi
    args+=(--in-diff "$diff_file")
    # Bound the CI step's time (about 3 s a mutant on 2 cores): past MUTANTS_MAX mutants, test
    # one slice of them, picked by the commit so that successive commits test different slices.
    n=$(cargo mutants "${args[@]}" "${extra[@]}" --list 2>/dev/null | grep -c . || true)
    max=${MUTANTS_MAX:-100}
    echo "mutants: $n mutants on the changed lines"
    if [ "$n" -eq 0 ]; then
        echo "mutants: no mutant on the changed lines (comments, tests or unmeasured files): nothing to test"
        exit 0
    fi
    if [ "$n" -gt "$max" ]; then
        shards=$(((n + max - 1) / max))
        shard=$((16#$(git rev-parse --short=8 HEAD) % shards))
        echo "mutants: more than MUTANTS_MAX=$max: testing slice $shard of 0..$((shards - 1));" \
            "the full run is scripts/mutants.sh"
        args+=(--shard "$shard/$shards")
        mode=slice
    fi
fi

start=$(date +%s)
# Debug info off: linking each mutant's test binaries is most of a mutant's build time.
set +e
CARGO_PROFILE_DEV_DEBUG=0 env -u CARGO_TARGET_DIR cargo mutants "${args[@]}" "${extra[@]}"
rc=$?
set -e
elapsed=$(($(date +%s) - start))
res="$out/mutants.out"
# Exit codes: 0 all caught, 2 some missed, 3 some timed out; anything else (1 usage, 4 the
# unmutated tree fails its tests) is an error of the run itself.
case "$rc" in
0 | 2 | 3) ;;
*)
    echo "mutants: cargo-mutants failed (exit $rc); see $res/debug.log" >&2
    exit 1
    ;;
esac

count() { if [ -f "$res/$1.txt" ]; then grep -c . "$res/$1.txt" || true; else echo 0; fi; }
# A mutant's name without its line and column: survivors stay listed when code moves.
names() { [ -f "$res/$1.txt" ] && sed -E 's/^([^:]+):[0-9]+:[0-9]+: /\1: /' "$res/$1.txt"; true; }
caught=$(count caught)
missed=$(count missed)
timeout=$(count timeout)
unviable=$(count unviable)
viable=$((caught + missed + timeout))

echo
echo "=== mutation score of specula-core ($mode run, ${elapsed} s)"
if [ "$viable" -gt 0 ]; then
    printf '%-34s %7s %7s %7s %7s\n' file caught timeout missed unviable
    for f in $(cat "$res"/{caught,missed,timeout,unviable}.txt 2>/dev/null | cut -d: -f1 | sort -u); do
        c() { [ -f "$res/$1.txt" ] && grep -c "^$f:" "$res/$1.txt" || true; }
        printf '%-34s %7s %7s %7s %7s\n' "$f" "$(c caught)" "$(c timeout)" "$(c missed)" "$(c unviable)"
    done
    score=$(((caught + timeout) * 1000 / viable))
    echo "caught $((caught + timeout)) of $viable viable mutants ($((score / 10)).$((score % 10)) %;" \
        "$timeout by a timeout); $unviable unviable"
else
    score=1000
    echo "no viable mutant in the selection"
fi

listed="$out/listed.txt"
grep -v '^[[:space:]]*\(#\|$\)' "$SURVIVORS" | sed 's/  # .*$//; s/[[:space:]]*$//' | sort -u >"$listed"
names missed | sort -u >"$out/survived.txt"
unlisted=$(comm -23 "$out/survived.txt" "$listed")
fail=0
if [ -n "$unlisted" ]; then
    echo
    echo "FAIL: surviving mutants not listed in $SURVIVORS (write a test that catches each, or"
    echo "list it there with the reason it is equivalent):"
    # shellcheck disable=SC2001
    echo "$unlisted" | sed 's/^/  /'
    fail=1
fi
if [ "$mode" = full ]; then
    stale=$(comm -13 "$out/survived.txt" "$listed")
    if [ -n "$stale" ]; then
        echo
        echo "FAIL: listed in $SURVIVORS but caught now (remove them):"
        # shellcheck disable=SC2001
        echo "$stale" | sed 's/^/  /'
        fail=1
    fi
    if [ "$score" -lt $((MIN_SCORE * 10)) ]; then
        echo "FAIL: score below $MIN_SCORE %" >&2
        fail=1
    fi
fi
[ "$fail" = 0 ] && echo "mutants: every surviving mutant is a listed, explained one"
exit "$fail"
