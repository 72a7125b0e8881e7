#!/usr/bin/env python3
"""Checks, through a real Prometheus' HTTP API, that a `specula demo --vllm-compat` scrape

1. answers every panel query of host-std/dashboards/specula.json with data that agrees with the demo's
   own summary (exact for cumulative panels, within a stated tolerance for ratios and rates),
2. holds every series, metric type, label and template variable that vLLM's
   speculative-decoding dashboard selects (host-std/tests/fixtures/vllm_spec_decode_dashboard.txt),
3. answers the queries that dashboard's panels are built from (quantiles of the inter-token
   latency histogram, accepted / generated tokens) with the demo's numbers.

Standard library only. Run by scripts/prometheus-check.sh, which starts the demo and Prometheus.
Usage: prometheus_dashboards.py PROM_URL JOB FINAL_LINE ELAPSED_S DASHBOARD FIXTURE
       [ADVICE_LINE [REQUESTS_LINE]]
(the demo's `ADVICE …` line, absent for token trees, and its `REQUESTS …` line).
"""

import json
import math
import sys
import time
import urllib.parse
import urllib.request

PROM, JOB, FINAL, ELAPSED, DASHBOARD, FIXTURE = sys.argv[1:7]
ADVICE = sys.argv[7] if len(sys.argv) > 7 else ""
REQUESTS = sys.argv[8] if len(sys.argv) > 8 else ""
ELAPSED = float(ELAPSED)
# Ratios over the run agree with the totals' ratios up to the part of the run before the first
# scrape and Prometheus' extrapolation; rates also depend on how steady the loop ran.
RATIO_TOL = 0.05
RATE_TOL = 0.30

failures = []


def fail(msg):
    failures.append(msg)
    print(f"prometheus-check: FAIL: {msg}", file=sys.stderr)


def api(path, **params):
    url = f"{PROM}/api/v1/{path}?" + urllib.parse.urlencode(params, doseq=True)
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"{path} {params}: {body}")
    return body["data"]


def final_fields(line):
    out = {}
    for part in line.split()[1:]:
        k, v = part.split("=", 1)
        out[k] = [int(x) for x in v.split(",")] if "," in v or k == "accepted_per_position" else int(v)
    return out


f = final_fields(FINAL)
drafts, draft_tokens = f["drafts"], f["draft_tokens"]
accepted, emitted = f["accepted_tokens"], f["emitted_tokens"]
per_pos = f["accepted_per_position"]
# Token trees (the FINAL line has these fields only when trees were verified).
trees, tree_nodes = f.get("tree_drafts", 0), f.get("tree_draft_tokens", 0)
# The acceptance-length distribution and the conditional acceptance, from the per-position
# counts: the demo drafts k tokens every step (a tree: its depth), so both are exact functions of
# them (A[-1] = drafts; the last length counts k accepted, that is, all of them).
reach = [drafts] + per_pos
length_shares = [(reach[j] - reach[j + 1]) / drafts for j in range(len(per_pos))] + [
    per_pos[-1] / drafts]
conditional = [reach[i + 1] / reach[i] for i in range(len(per_pos)) if reach[i] > 0]


def fields_of(line):
    """`NAME k=v k=v,…` as a dict of floats and float lists."""
    out = {}
    for part in line.split()[1:]:
        k, v = part.split("=", 1)
        out[k] = [float(x) for x in v.split(",")] if "," in v else float(v)
    return out


advice = fields_of(ADVICE) if ADVICE else {}
as_list = lambda v: v if isinstance(v, list) else [v]
requests = fields_of(REQUESTS) if REQUESTS else {"finished": 0, "drafted": 0, "low": 0, "high": 0}

# The samples Prometheus holds of the run: a loaded machine can miss scrapes, so the window
# of the rate panels is measured from the data, not assumed from the scrape interval.
now = time.time()
raw = api("query", query=f'specula_drafts_total{{job="{JOB}"}}[15m]', time=now)["result"]
samples = [(float(t), int(float(v))) for t, v in raw[0]["values"]] if raw else []
print(f"prometheus-check: {len(samples)} scrapes of the demo; drafts: "
      f"{[v for _, v in samples][:40]}")
# The end of the run: the first scrape that saw the final totals; the window reaches back to
# the first scrape (rates need two samples in it).
end = next((t for t, v in samples if v == drafts), None)
if end is None or samples[0][1] == drafts:
    print("prometheus-check: FAIL: Prometheus has no scrape of the run before its final totals "
          "(every scrape during the run failed: is the machine overloaded?)", file=sys.stderr)
    sys.exit(1)
window = f"{math.ceil(end - samples[0][0]) + 1}s"
before = [t for t, _ in samples if t < end]
AGE_BOUND = end - before[-1] + 2.0
print(f"prometheus-check: evaluating at the end of the run, window {window}")
# The loop's pace inside the window, from the same samples: on a shared machine it is not
# steady over the run (a neighbouring job can slow its second half by a third), so a rate panel
# is compared with the demo's average rate scaled by the drafts' pace in the window against the
# run's. The panel must still pick the right series: drafted, accepted and emitted tokens stand
# in fixed ratios to drafts that differ by far more than the tolerance.
first_t, first_v = samples[0]
PACE = (drafts - first_v) / (end - first_t) / (drafts / ELAPSED)
print(f"prometheus-check: drafts' pace in the window / over the run = {PACE:.3f}")

def query(expr):
    return api("query", query=expr, time=end)["result"]


def close(got, want, tol):
    return abs(got - want) <= tol * abs(want) + 1e-9


# 1. Our dashboard.
dash = json.load(open(DASHBOARD))
expect = {
    "Acceptance rate": ("ratio", [accepted / draft_tokens]),
    "Mean acceptance length": ("ratio", [emitted / drafts]),
    "Drafts (total)": ("exact", [drafts]),
    "Accepted tokens (total)": ("exact", [accepted]),
    "Readback errors (total)": ("exact", [0]),
    "Acceptance rate by engine": ("ratio", [accepted / draft_tokens]),
    "Mean acceptance length by engine": ("ratio", [emitted / drafts]),
    "System efficiency by engine": ("ratio", [emitted / (draft_tokens + drafts)]),
    # The demo drafts k tokens every step: drafts that reached a position = all drafts.
    "Per-position acceptance (per draft)": ("positions", [a / drafts for a in per_pos]),
    "Per-position acceptance (conditional)": ("positions", [a / drafts for a in per_pos]),
    "Drafted and accepted throughput": (
        "rate", [PACE * draft_tokens / ELAPSED, PACE * accepted / ELAPSED]),
    "Emitted tokens / s": ("rate", [PACE * emitted / ELAPSED]),
    "Readback errors": ("exact", [0]),
    # At the first scrape after the run the newest data is at most one scrape interval old,
    # plus whatever scrapes a loaded machine missed (the gap before `end`).
    "Snapshot age": ("age", [AGE_BOUND]),
    "Time since last collection": ("age", [AGE_BOUND]),
    "Token trees (total)": ("exact", [trees]),
    # A ratio over trees: no data at all while only chains are verified (0 / 0 is dropped).
    "Mean tree size by engine": ("ratio", [tree_nodes / trees]) if trees else ("none", [0]),
    # The advice: the recent window (60 s) still covers the whole run, so it is the demo's final
    # advice over its totals and step timings (the ADVICE line); none for trees (no cost source).
    "Recommended draft length": ("exact", [advice["recommended"]]) if advice else ("none", [0]),
    "Draft cost ratio": ("ratio", [advice["cost_ratio"]]) if advice else ("none", [0]),
    "Rejection saving": ("ratio", [advice["rejection_saving"]]) if advice else ("none", [0]),
    "Expected speedup by draft length": ("keyed:draft_length:1", as_list(advice["speedup"]))
    if advice else ("none", [0]),
    "Expected tokens per step by draft length": (
        "keyed:draft_length:1", as_list(advice["expected_tokens"])) if advice else ("none", [0]),
    "Acceptance length distribution": ("keyed:length:0", length_shares),
    "Per-position acceptance (given reached)": ("keyed:position:0", conditional),
    "Finished requests (total)": ("exact", [requests["finished"]]),
    "Finished requests at the extremes": ("exact", [requests["low"], requests["high"]]),
    "Mean acceptance rate of finished requests": (
        "ratio", [requests["rate_sum_micros"] / 1e6 / requests["drafted"]])
    if requests["drafted"] else ("none", [0]),
    "Finished requests by acceptance rate": ("cumulative", [requests["drafted"]])
    if requests["drafted"] else ("none", [0]),
}
panels = [p for p in dash["panels"] if p["type"] != "row"]
for p in panels:
    title = p["title"]
    if title not in expect:
        fail(f"panel {title!r} has no expectation here: add one")
        continue
    kind, want = expect[title]
    for i, t in enumerate(p["targets"]):
        expr = (t["expr"].replace("$__rate_interval", window)
                .replace('"$job"', f'"{JOB}"').replace('"$model_name"', '".*"')
                .replace('"$instance"', '".*"').replace('"$engine"', '".*"'))
        result = query(expr)
        if kind == "none":
            if result:
                fail(f"panel {title!r} target {t['refId']}: data {result} where none is due")
            else:
                print(f"prometheus-check: panel {title!r} {t['refId']}: no data (demo: none)")
            continue
        if not result:
            fail(f"panel {title!r} target {t['refId']}: no data for {expr}")
            continue
        values = [float(r["value"][1]) for r in result]
        if not all(math.isfinite(v) for v in values):
            fail(f"panel {title!r}: non-finite {values}")
            continue
        if kind == "positions" or kind.startswith("keyed:"):
            # One series per value of a label (position, length, draft_length) from `first` on.
            label, first = ("position", 0) if kind == "positions" else kind.split(":")[1:]
            got = sorted((int(r["metric"][label]), float(r["value"][1])) for r in result)
            ok = [pos for pos, _ in got] == list(range(int(first), int(first) + len(want))) and all(
                abs(v - w) <= RATIO_TOL * w + 0.01 for (_, v), w in zip(got, want))
            shown = [round(v, 4) for _, v in got]
        elif kind == "cumulative":
            # A histogram's buckets over the window: cumulative in `le`, +Inf the largest, and
            # no more requests than the demo finished with a draft.
            got = sorted((float(r["metric"]["le"]), float(r["value"][1])) for r in result)
            counts = [v for _, v in got]
            ok = (len(got) == 13 and got[-1][0] == math.inf and
                  all(a <= b + 1e-9 for a, b in zip(counts, counts[1:])) and
                  0 < counts[-1] <= want[0] * (1 + RATE_TOL))
            shown = [round(v, 2) for v in counts]
        else:
            v, w = values[0], want[i]
            ok = len(values) == 1 and {
                "exact": lambda: v == w,
                "ratio": lambda: close(v, w, RATIO_TOL),
                "rate": lambda: close(v, w, RATE_TOL),
                "age": lambda: 0.0 <= v < w,
            }[kind]()
            shown = round(v, 4)
        want_shown = ([round(x, 4) for x in want] if kind == "positions" or kind.startswith("keyed:")
                      else f"at most {want[0]}" if kind == "cumulative" else round(want[i], 4))
        if kind == "age":
            want_shown = f"bound {want_shown}"
        if ok:
            print(f"prometheus-check: panel {title!r} {t['refId']}: {shown} (demo: {want_shown})")
        else:
            fail(f"panel {title!r} {t['refId']}: Prometheus {shown}, demo {want_shown} ({kind})")
for v in dash["templating"]["list"]:
    if v["type"] != "query":
        continue
    metric, label = v["query"][len("label_values("):-1].rsplit(", ", 1)
    metric = metric.replace('"$job"', f'"{JOB}"').replace('"$model_name"', '".*"').replace('"$instance"', '".*"')
    values = api(f"label/{label}/values", **{"match[]": metric})
    if values:
        print(f"prometheus-check: variable ${v['name']}: {values}")
    else:
        fail(f"variable ${v['name']}: label_values({metric}, {label}) is empty")

# 2. What vLLM's speculative-decoding dashboard selects.
series = {}
for line in open(FIXTURE):
    words = line.split()
    if not words or words[0].startswith("#"):
        continue
    if words[0] == "series":
        name, kind = words[1], words[2]
        names = [f"{name}_bucket", f"{name}_sum", f"{name}_count"] if kind == "histogram" else [name]
        for n in names:
            found = api("series", **{"match[]": f'{{__name__="{n}",job="{JOB}"}}'})
            series[n] = found
            if not found:
                fail(f"vLLM dashboard series {n} is not in Prometheus")
        # Metadata is keyed by the family name of the TYPE line: `_total` is part of it in the
        # classic text format and not in OpenMetrics.
        meta = api("metadata", metric=name) or api("metadata", metric=name.removesuffix("_total"))
        types = {m["type"] for ms in meta.values() for m in ms}
        if types == {kind}:
            print(f"prometheus-check: vLLM dashboard series {name}: {kind}")
        else:
            fail(f"{name}: Prometheus has type {types or 'none'}, vLLM's dashboard needs {kind}")
    elif words[0] == "label":
        label, on = words[1], words[2:]
        targets = list(series) if on == ["*"] else on
        for n in targets:
            found = series.get(n) or api("series", **{"match[]": f'{{__name__="{n}",job="{JOB}"}}'})
            if not found or not all(label in s for s in found):
                fail(f"label {label} missing on {n}")
        print(f"prometheus-check: vLLM dashboard label {label} on {len(targets)} series")
    elif words[0] == "variable":
        label, metric = words[1], words[2]
        values = api(f"label/{label}/values", **{"match[]": metric})
        if values:
            print(f"prometheus-check: label_values({metric}, {label}) = {values}")
        else:
            fail(f"label_values({metric}, {label}) is empty")

# 3. The numbers vLLM's panels are computed from.
gen = query(f'sum(vllm:generation_tokens_total{{job="{JOB}"}})')
if gen and int(float(gen[0]["value"][1])) == emitted:
    print(f"prometheus-check: vllm:generation_tokens_total = {emitted} (demo's emitted tokens)")
else:
    fail(f"vllm:generation_tokens_total {gen} != demo's emitted {emitted}")
share = query(f'sum(rate(vllm:spec_decode_num_accepted_tokens_total{{job="{JOB}"}}[{window}])) / '
              f'sum(rate(vllm:generation_tokens_total{{job="{JOB}"}}[{window}]))')
if share and close(float(share[0]["value"][1]), accepted / emitted, RATIO_TOL):
    print(f"prometheus-check: output from drafts = {float(share[0]['value'][1]):.4f} (demo: {accepted / emitted:.4f})")
else:
    fail(f"output from drafts {share} vs demo {accepted / emitted}")
for q in (0.5, 0.99):
    r = query(f'histogram_quantile({q}, sum by (le) (rate(vllm:inter_token_latency_seconds_bucket{{job="{JOB}"}}[{window}])))')
    if r and math.isfinite(float(r[0]["value"][1])) and float(r[0]["value"][1]) > 0:
        print(f"prometheus-check: inter-token latency p{int(q * 100)} = {float(r[0]['value'][1]):.4f} s")
    else:
        fail(f"inter-token latency quantile {q}: {r}")
count = query(f'sum(vllm:inter_token_latency_seconds_count{{job="{JOB}"}})')
# One observation per request per step; the demo's drafts are one per request per step too.
if count and int(float(count[0]["value"][1])) == drafts:
    print(f"prometheus-check: inter-token latency observations = {drafts} (one per request per step)")
else:
    fail(f"inter-token latency count {count} != drafts {drafts}")
running = query(f'max(vllm:num_requests_running{{job="{JOB}"}})')
if not running:
    fail("vllm:num_requests_running has no data")

sys.exit(1 if failures else 0)
