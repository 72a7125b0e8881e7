#!/usr/bin/env bash
# End-to-end check of the /metrics exposition against a real Prometheus server.
#
# Runs `specula demo` with a token budget and --linger, scrapes it with a throw-away Prometheus
# (own config, temporary storage, 1 s scrape interval, loopback only, not the system service),
# and checks through Prometheus' query API that the accepted/draft token counters equal the
# demo's own printed final totals (specula_* and vllm:* names), and that `promtool check
# metrics` accepts the exposition. Takes about 30 s after the build.
#
# Env: SPECULA_BIN (prebuilt binary; default: cargo build --release -p specula --features cli),
#      DEMO_PORT (default 19464), PROM_PORT (default 19090).
set -euo pipefail

DEMO_PORT="${DEMO_PORT:-19464}"
PROM_PORT="${PROM_PORT:-19090}"
LINGER=40
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "prometheus-check: FAIL: $*" >&2; exit 1; }

if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
  echo "prometheus-check: installing Debian's prometheus package"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
# The package may start its own service; this check never uses it.
command -v curl >/dev/null || fail "curl is required"

if [[ -z "${SPECULA_BIN:-}" ]]; then
  (cd "$root" && cargo build --release -q -p specula --features cli)
  SPECULA_BIN="${CARGO_TARGET_DIR:-$root/target}/release/specula"
fi
[[ -x "$SPECULA_BIN" ]] || fail "no specula binary at $SPECULA_BIN"

# 1. The demo: fixed token budget, then it keeps serving its final totals for $LINGER s.
"$SPECULA_BIN" demo --tokens 300000 --batch 8 --k 4 --seed 7 --threads 2 \
  --log-interval 1 --collect-interval 0.05 --vllm-compat \
  --metrics-addr "127.0.0.1:$DEMO_PORT" --linger "$LINGER" >"$work/demo.out" 2>"$work/demo.err" &
pids+=($!)
final=""
for _ in $(seq 1 120); do
  final="$(grep '^FINAL ' "$work/demo.out" || true)"
  [[ -n "$final" ]] && break
  kill -0 "${pids[0]}" 2>/dev/null || { cat "$work/demo.err" >&2; fail "demo exited early"; }
  sleep 0.5
done
[[ -n "$final" ]] || fail "demo printed no final totals"
echo "prometheus-check: demo: $final"
field() { sed -n "s/.* $1=\([0-9]*\).*/\1/p" <<<"$final"; }
want_accepted="$(field accepted_tokens)"
want_draft="$(field draft_tokens)"
want_drafts="$(field drafts)"

# 2. promtool on the exposition (classic text format, as curl asks for it).
curl -sf --max-time 5 "http://127.0.0.1:$DEMO_PORT/metrics" >"$work/metrics.txt" \
  || fail "cannot fetch /metrics"
# promtool's linter flags ':' in metric names; those are the vllm: names dashboards already
# use, kept on purpose, so that one finding is allowed and any other fails the check.
if ! promtool check metrics <"$work/metrics.txt" >"$work/promtool.out" 2>&1; then
  # (Into a file, not `| grep -q`: under pipefail an early exit of grep -q can fail the pipe.)
  grep -v -e "metric names should not contain ':'" "$work/promtool.out" >"$work/promtool.rest" || true
  if [ -s "$work/promtool.rest" ]; then
    cat "$work/promtool.out" >&2
    fail "promtool check metrics found problems"
  fi
fi
# Without the compatibility names the exposition must be lint-clean outright.
grep -v '^vllm:\|^# [A-Z]* vllm:' "$work/metrics.txt" | promtool check metrics \
  || fail "promtool check metrics on the specula_* families"
echo "prometheus-check: promtool check metrics passed"

# 3. A throw-away Prometheus scraping the demo every second.
cat >"$work/prometheus.yml" <<YML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: specula
    static_configs:
      - targets: ['127.0.0.1:$DEMO_PORT']
YML
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/data" \
  --web.listen-address="127.0.0.1:$PROM_PORT" >"$work/prom.log" 2>&1 &
pids+=($!)

query() {
  curl -sf --max-time 3 --get "http://127.0.0.1:$PROM_PORT/api/v1/query" \
    --data-urlencode "query=$1" |
    python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else "")' \
    2>/dev/null || true
}
check() { # name expected
  local got=""
  for _ in $(seq 1 30); do
    got="$(query "$1")"
    [[ "$got" == "$2" ]] && { echo "prometheus-check: $1 = $got"; return 0; }
    sleep 1
  done
  tail -5 "$work/prom.log" >&2
  fail "$1 = '${got}', the demo printed $2"
}
check 'specula_accepted_tokens_total{engine="rank0"}' "$want_accepted"
check 'specula_draft_tokens_total{engine="rank0"}' "$want_draft"
check 'specula_drafts_total{engine="rank0"}' "$want_drafts"
check '{__name__="vllm:spec_decode_num_accepted_tokens_total",engine="rank0"}' "$want_accepted"
check '{__name__="vllm:spec_decode_num_draft_tokens_total",engine="rank0"}' "$want_draft"
check 'up{job="specula"}' 1
echo "prometheus-check: PASS"
