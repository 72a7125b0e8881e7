#!/usr/bin/env bash
# End-to-end check of the /metrics exposition against a real Prometheus server.
#
# Runs `specula demo --vllm-compat` for a fixed duration with --linger, scrapes it with a
# throw-away Prometheus (own config, temporary storage, 1 s scrape interval, loopback only, not
# the system service), and checks through Prometheus' query API that
#  - the counters equal the demo's own printed final totals (specula_* and vllm:* names),
#  - every panel query of host-std/dashboards/specula.json returns data that agrees with the demo's
#    summary, and everything vLLM's speculative-decoding dashboard selects (series, types,
#    labels, template variables: host-std/tests/fixtures/vllm_spec_decode_dashboard.txt) is
#    there (scripts/prometheus_dashboards.py),
#  - `promtool check metrics` accepts the exposition,
#  - the log carries vLLM v1's exact "SpecDecoding metrics: " line.
# Takes about a minute after the build; nothing is downloaded at test time beyond the
# prometheus package when it is missing.
#
# Env: SPECULA_BIN (prebuilt binary; default: cargo build --release -p specula-cli),
#      DEMO_PORT (default 19464), PROM_PORT (default 19090).
set -euo pipefail

DEMO_PORT="${DEMO_PORT:-19464}"
# DEMO_ARGS: more demo flags, word-split. `DEMO_ARGS="--tree 2x4"` checks everything on the
# tree drafter (depth 4: the four positions the log check expects), the tree panels with data.
PROM_PORT="${PROM_PORT:-19090}"
LINGER=90
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
  (cd "$root" && cargo build --release -q -p specula-cli)
  SPECULA_BIN="${CARGO_TARGET_DIR:-$root/target}/release/specula"
fi
[[ -x "$SPECULA_BIN" ]] || fail "no specula binary at $SPECULA_BIN"

# 0. A throw-away Prometheus scraping the demo every second, started first so that it scrapes
#    the whole run (the rate panels need samples from during the run, not only its totals).
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

# 1. The demo: a fixed duration (long enough for several scrapes during the run, which the
#    rate panels need), then it keeps serving its final totals for $LINGER s.
"$SPECULA_BIN" demo --duration 12 --batch 8 --k 4 --seed 7 --threads 2 \
  --log-interval 1 --collect-interval 0.05 --vllm-compat \
  --model-name specula-check --label region=ci \
  --metrics-addr "127.0.0.1:$DEMO_PORT" --linger "$LINGER" ${DEMO_ARGS:-} >"$work/demo.out" 2>"$work/demo.err" &
demo_pid=$!
pids+=("$demo_pid")
final=""
for _ in $(seq 1 120); do
  final="$(grep '^FINAL ' "$work/demo.out" || true)"
  [[ -n "$final" ]] && break
  kill -0 "$demo_pid" 2>/dev/null || { cat "$work/demo.err" >&2; fail "demo exited early"; }
  sleep 0.5
done
[[ -n "$final" ]] || fail "demo printed no final totals"
echo "prometheus-check: demo: $final"
# The advice (chains only) and the finished requests, printed just before the FINAL line.
advice="$(grep '^ADVICE ' "$work/demo.out" || true)"
requests="$(grep '^REQUESTS ' "$work/demo.out" || true)"
[[ -n "$requests" ]] || fail "demo printed no REQUESTS line"
echo "prometheus-check: demo: ${advice:-no ADVICE line (token trees)}"
echo "prometheus-check: demo: $requests"
field() { sed -n "s/.* $1=\([0-9]*\).*/\1/p" <<<"$final"; }
want_accepted="$(field accepted_tokens)"
want_draft="$(field draft_tokens)"
want_drafts="$(field drafts)"
elapsed="$(sed -n 's/^throughput: .* over \([0-9.]*\) s$/\1/p' "$work/demo.out")"
[[ -n "$elapsed" ]] || fail "no elapsed time in the demo's summary"

# The log: vLLM v1's line, exactly its prefix, fields and number formats (what a vLLM log
# parser matches), one value per drafted position, and no native line beside it.
vllm_line='SpecDecoding metrics: Mean acceptance length: [0-9]+\.[0-9]{2}, Accepted throughput: [0-9]+\.[0-9]{2} tokens/s, Drafted throughput: [0-9]+\.[0-9]{2} tokens/s, Accepted: [0-9]+ tokens, Drafted: [0-9]+ tokens, Per-position acceptance rate: [0-9]\.[0-9]{3}, [0-9]\.[0-9]{3}, [0-9]\.[0-9]{3}, [0-9]\.[0-9]{3}, Avg Draft acceptance rate: [0-9]+\.[0-9]%$'
grep -Eq "$vllm_line" "$work/demo.err" || { cat "$work/demo.err" >&2; fail "no vLLM-format log line"; }
if grep -q 'SpecDecoding metrics \[\|lifetime:' "$work/demo.err"; then
  fail "a native line in compat mode"
fi
echo "prometheus-check: log lines in vLLM v1's format: $(grep -Ec "$vllm_line" "$work/demo.err")"

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
# Compat mode: vLLM's engine index and the constant labels on every series.
sel='model_name="specula-check",region="ci",engine="0"'
check "specula_accepted_tokens_total{$sel}" "$want_accepted"
check "specula_draft_tokens_total{$sel}" "$want_draft"
check "specula_drafts_total{$sel}" "$want_drafts"
check "{__name__=\"vllm:spec_decode_num_accepted_tokens_total\",$sel}" "$want_accepted"
check "{__name__=\"vllm:spec_decode_num_draft_tokens_total\",$sel}" "$want_draft"
check "{__name__=\"vllm:spec_decode_num_drafts_total\",$sel}" "$want_drafts"
check 'up{job="specula"}' 1

# 4. Both dashboards against this Prometheus.
python3 "$root/scripts/prometheus_dashboards.py" "http://127.0.0.1:$PROM_PORT" specula "$final" \
  "$elapsed" "$root/host-std/dashboards/specula.json" \
  "$root/host-std/tests/fixtures/vllm_spec_decode_dashboard.txt" "$advice" "$requests" \
  || fail "dashboard checks (above)"
echo "prometheus-check: PASS"
