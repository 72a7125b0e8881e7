//! Prometheus exposition: totals equal the slots', counter semantics, vllm compatibility names.

use specula::HostReadback;
use specula::prom::{Format, Options, SpecCollector, render};
use specula::specula_core::Counters;
use specula::specula_core::StepTiming;
use specula::{StdClock, Ticker, wire};
use std::time::Duration;

/// The value of the sample `name{labels}` (labels exactly as rendered), if present.
fn sample(text: &str, series: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn setup(options: Options) -> (prometheus_client::registry::Registry, [Counters<4>; 2]) {
    let wired = wire::<4, _>(["rank0", "rank1"]).unwrap();
    let clock = StdClock::new();
    let mut totals = [Counters::<4>::ZERO; 2];
    for (i, w) in wired.writers.into_iter().enumerate() {
        let mut d = Ticker::new(
            HostReadback::<4>::default(),
            w,
            Duration::from_secs(3600),
            clock,
        )
        .unwrap();
        for s in 0..(50 + 30 * i) {
            let k = 1 + s % 4;
            d.collector_mut()
                .readback_mut()
                .record(k, (s * 7 + i) % (k + 1))
                .unwrap();
        }
        // Token trees on rank 1 only: rank 0's tree series are exported, at zero.
        for s in 0..(20 * i) {
            let depth = 1 + s % 3;
            d.collector_mut()
                .readback_mut()
                .record_tree(depth, 2 * depth + s % 5, s % (depth + 1))
                .unwrap();
        }
        d.flush().unwrap();
        totals[i] = *d.collector().readback().counters();
    }
    (
        SpecCollector::new(wired.slots, options).into_registry(),
        totals,
    )
}

#[test]
fn totals_equal_the_slots_in_both_formats() {
    let (reg, totals) = setup(Options::default());
    for format in [Format::Text, Format::OpenMetrics] {
        let text = render(&reg, format).unwrap();
        for (i, t) in totals.iter().enumerate() {
            let e = format!("engine=\"rank{i}\"");
            let get = |name: &str| sample(&text, &format!("{name}{{{e}}}"));
            assert_eq!(get("specula_drafts_total"), Some(t.drafts), "{text}");
            assert_eq!(get("specula_draft_tokens_total"), Some(t.draft_tokens));
            assert_eq!(
                get("specula_accepted_tokens_total"),
                Some(t.accepted_tokens)
            );
            assert_eq!(get("specula_emitted_tokens_total"), Some(t.emitted_tokens));
            assert_eq!(get("specula_readback_errors_total"), Some(0));
            assert_eq!(get("specula_tree_drafts_total"), Some(t.tree_drafts));
            assert_eq!(
                get("specula_tree_draft_tokens_total"),
                Some(t.tree_draft_tokens)
            );
            assert_eq!(t.tree_drafts, 20 * i as u64);
            for p in 0..4 {
                let s =
                    format!("specula_accepted_tokens_per_position_total{{{e},position=\"{p}\"}}");
                assert_eq!(sample(&text, &s), Some(t.accepted_per_position[p]));
                let s = format!("specula_draft_tokens_per_position_total{{{e},position=\"{p}\"}}");
                assert_eq!(sample(&text, &s), Some(t.drafted_per_position[p]));
            }
        }
        assert!(text.contains("specula_build_info{version=\""), "{text}");
        assert!(!text.contains("vllm:"), "compat names are opt-in");
        // A scrape reads; it never changes what the next scrape sees.
        assert_eq!(render(&reg, format).unwrap(), text);
    }
    let om = render(&reg, Format::OpenMetrics).unwrap();
    assert!(om.ends_with("# EOF\n"));
    assert!(om.contains("# TYPE specula_accepted_tokens counter"));
    let txt = render(&reg, Format::Text).unwrap();
    assert!(txt.contains("# TYPE specula_accepted_tokens_total counter"));
    for name in [
        "specula_tree_drafts_total",
        "specula_tree_draft_tokens_total",
    ] {
        assert!(txt.contains(&format!("# TYPE {name} counter")), "{txt}");
        assert!(txt.contains(&format!("# HELP {name} ")), "{txt}");
    }
}

#[test]
fn vllm_compat_names_carry_the_same_totals() {
    let (reg, totals) = setup(Options { vllm_compat: true });
    let text = render(&reg, Format::Text).unwrap();
    for (i, t) in totals.iter().enumerate() {
        // Compat mode: vLLM's engine index, on every family.
        let e = format!("engine=\"{i}\"");
        assert_eq!(
            sample(&text, &format!("specula_drafts_total{{{e}}}")),
            Some(t.drafts)
        );
        let get = |name: &str| sample(&text, &format!("vllm:spec_decode_{name}_total{{{e}}}"));
        assert_eq!(
            get("num_accepted_tokens"),
            Some(t.accepted_tokens),
            "{text}"
        );
        assert_eq!(get("num_draft_tokens"), Some(t.draft_tokens));
        assert_eq!(get("num_drafts"), Some(t.drafts));
        for p in 0..4 {
            let s = format!(
                "vllm:spec_decode_num_accepted_tokens_per_pos_total{{{e},position=\"{p}\"}}"
            );
            assert_eq!(sample(&text, &s), Some(t.accepted_per_position[p]));
        }
        // v0's emitted counter and gauges, from the same cumulative counts.
        assert_eq!(get("num_emitted_tokens"), Some(t.emitted_tokens));
        let gauge = |name: &str| sample_f64(&text, &format!("vllm:spec_decode_{name}{{{e}}}"));
        let rate = t.accepted_tokens as f64 / t.draft_tokens as f64;
        assert!((gauge("draft_acceptance_rate").unwrap() - rate).abs() < 1e-12);
        let eff = t.emitted_tokens as f64 / (t.draft_tokens + t.drafts) as f64;
        assert!((gauge("efficiency").unwrap() - eff).abs() < 1e-12);
    }
    assert!(!text.contains("engine=\"rank"), "{text}");
    // vLLM's types and help texts (v0's spelling included).
    for (name, kind, help) in [
        (
            "vllm:spec_decode_num_drafts_total",
            "counter",
            "Number of spec decoding drafts.",
        ),
        (
            "vllm:spec_decode_num_draft_tokens_total",
            "counter",
            "Number of draft tokens.",
        ),
        (
            "vllm:spec_decode_num_accepted_tokens_total",
            "counter",
            "Number of accepted tokens.",
        ),
        (
            "vllm:spec_decode_num_accepted_tokens_per_pos_total",
            "counter",
            "Accepted tokens per draft position.",
        ),
        (
            "vllm:spec_decode_num_emitted_tokens_total",
            "counter",
            "Number of emitted tokens.",
        ),
        (
            "vllm:spec_decode_draft_acceptance_rate",
            "gauge",
            "Speulative token acceptance rate.",
        ),
        (
            "vllm:spec_decode_efficiency",
            "gauge",
            "Speculative decoding system efficiency.",
        ),
    ] {
        assert!(text.contains(&format!("# TYPE {name} {kind}\n")), "{name}");
        assert!(text.contains(&format!("# HELP {name} {help}\n")), "{name}");
    }
}

#[test]
fn v0_gauges_are_nan_before_the_first_draft() {
    let wired = wire::<4, _>(["rank0"]).unwrap();
    let reg = SpecCollector::new(wired.slots, Options { vllm_compat: true }).into_registry();
    let text = render(&reg, Format::Text).unwrap();
    for name in ["draft_acceptance_rate", "efficiency"] {
        let v = sample_f64(&text, &format!("vllm:spec_decode_{name}{{engine=\"0\"}}"));
        assert!(v.is_some_and(f64::is_nan), "{name}: {v:?}\n{text}");
    }
}

#[test]
fn constant_labels_are_validated() {
    use specula::prom::{ConstLabels, LabelError, check_label_name};
    let ok = ConstLabels::model_name("meta-llama/Llama-3-8B \"q\"").unwrap();
    assert_eq!(ok.len(), 1);
    for bad in ["", "2x", "a-b", "a.b", "__x", "é"] {
        assert_eq!(
            check_label_name(bad),
            Err(LabelError::BadName(bad.into())),
            "{bad:?}"
        );
    }
    for reserved in ["engine", "position", "le", "job", "instance", "quantile"] {
        assert_eq!(
            ConstLabels::new().with(reserved, "x"),
            Err(LabelError::Reserved(reserved.into()))
        );
    }
    assert_eq!(
        ok.clone().with("model_name", "y"),
        Err(LabelError::Duplicate("model_name".into()))
    );
    let long = "x".repeat(specula::prom::MAX_LABEL_VALUE + 1);
    for bad in ["", "a\nb", long.as_str()] {
        assert_eq!(
            ConstLabels::new().with("region", bad),
            Err(LabelError::BadValue("region".into()))
        );
    }
    let mut l = ConstLabels::new();
    assert_eq!(
        l.push_pair("novalue"),
        Err(LabelError::NoEquals("novalue".into()))
    );
    l.push_pair("dc=a=b").unwrap();
    assert_eq!(l.get("dc"), Some("a=b"));
    // Errors say what is wrong, for the CLI's exit-2 message.
    assert!(
        LabelError::Reserved("le".into())
            .to_string()
            .contains("reserved")
    );
}

#[test]
fn constant_labels_and_draft_len_shape_every_series() {
    use specula::prom::{ConstLabels, DraftLenError};
    let wired = wire::<4, _>(["rank0"]).unwrap();
    let labels = ConstLabels::model_name("m\"1")
        .unwrap()
        .with("region", "eu")
        .unwrap();
    assert_eq!(
        SpecCollector::new(wired.slots.clone(), Options::default())
            .with_draft_len(5)
            .err(),
        Some(DraftLenError { got: 5, max: 4 })
    );
    assert!(
        SpecCollector::new(wired.slots.clone(), Options::default())
            .with_draft_len(0)
            .is_err()
    );
    for compat in [false, true] {
        let reg = SpecCollector::new(
            wired.slots.clone(),
            Options {
                vllm_compat: compat,
            },
        )
        .with_clock(StdClock::new())
        .with_labels(labels.clone())
        .with_draft_len(2)
        .unwrap()
        .into_registry();
        let text = render(&reg, Format::Text).unwrap();
        let samples: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert!(samples.len() > 10, "{text}");
        for l in &samples {
            // The value is escaped as the exposition format requires.
            assert!(l.contains("{model_name=\"m\\\"1\",region=\"eu\","), "{l}");
        }
        // Two positions (the draft length), not K = 4.
        assert!(text.contains("position=\"1\""));
        assert!(!text.contains("position=\"2\""), "{text}");
    }
}

/// `name{labels} value` sample lines of `family` (exactly that name).
fn samples_of<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with('{') || r.starts_with(' '))
        })
        .collect()
}

#[test]
fn everything_vllms_dashboard_selects_is_in_compat_output() {
    use specula::prom::{ConstLabels, VllmEngineMetrics};
    let wired = wire::<4, _>(["rank0"]).unwrap();
    let labels = ConstLabels::model_name("demo").unwrap();
    let mut reg = SpecCollector::new(wired.slots, Options { vllm_compat: true })
        .with_labels(labels.clone())
        .into_registry();
    let engine = VllmEngineMetrics::new(&labels, 0);
    engine.register(&mut reg);
    engine.set_running(3);
    engine.add_generation_tokens(12);
    engine.observe_inter_token_latency(0.02, 3);
    let text = render(&reg, Format::Text).unwrap();

    let fixture = include_str!("../fixtures/vllm_spec_decode_dashboard.txt");
    let mut series: Vec<(&str, &str)> = Vec::new();
    let mut checked_labels = 0;
    for line in fixture
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f[..] {
            ["series", name, kind] => {
                // Histograms are typed under their base name; counters under `_total`.
                assert!(
                    text.contains(&format!("# TYPE {name} {kind}\n")),
                    "{name} is not a {kind}:\n{text}"
                );
                let sample = if kind == "histogram" {
                    format!("{name}_bucket")
                } else {
                    name.to_owned()
                };
                assert!(!samples_of(&text, &sample).is_empty(), "{sample}");
                series.push((name, kind));
            }
            ["label", label, ref on @ ..] => {
                // job and instance come from Prometheus at scrape time (scripts/prometheus-check.sh).
                if matches!(label, "job" | "instance") {
                    continue;
                }
                let targets: Vec<String> = if on == ["*"] {
                    series
                        .iter()
                        .map(|(n, k)| {
                            if *k == "histogram" {
                                format!("{n}_bucket")
                            } else {
                                (*n).to_owned()
                            }
                        })
                        .collect()
                } else {
                    on.iter().map(|s| (*s).to_owned()).collect()
                };
                for t in targets {
                    let rows = samples_of(&text, &t);
                    assert!(!rows.is_empty(), "{t}");
                    for r in rows {
                        assert!(r.contains(&format!("{label}=\"")), "{label} missing: {r}");
                    }
                    checked_labels += 1;
                }
            }
            ["variable", label, on] => {
                let rows = samples_of(&text, on);
                assert!(
                    rows.iter().any(|r| r.contains(&format!("{label}=\"")))
                        || matches!(label, "job" | "instance"),
                    "{label} on {on}"
                );
            }
            _ => panic!("bad fixture line {line:?}"),
        }
    }
    assert_eq!(series.len(), 7);
    assert!(checked_labels >= 16);
    // vLLM's buckets (as numbers: its Python client writes "1.0" where ours writes "1";
    // Prometheus 3 normalizes both) and help texts for the engine metrics.
    let le: Vec<f64> = samples_of(&text, "vllm:inter_token_latency_seconds_bucket")
        .iter()
        .filter_map(|l| l.split("le=\"").nth(1)?.split('"').next()?.parse().ok())
        .collect();
    let mut want = specula::prom::VLLM_ITL_BUCKETS.to_vec();
    want.push(f64::INFINITY);
    assert_eq!(le, want);
    assert_eq!(
        &specula::prom::VLLM_ITL_BUCKETS[..4],
        &[0.01, 0.025, 0.05, 0.075],
        "vLLM's boundaries"
    );
    assert!(text.contains(
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
    ));
    assert!(
        text.contains(
            "# HELP vllm:generation_tokens_total Number of generation tokens processed.\n"
        )
    );
    assert!(text.contains(
        "# HELP vllm:inter_token_latency_seconds Histogram of inter-token latency in seconds.\n"
    ));
    assert_eq!(
        sample(
            &text,
            "vllm:generation_tokens_total{model_name=\"demo\",engine=\"0\"}"
        ),
        Some(12)
    );
}

#[test]
fn our_dashboard_queries_only_exported_families() {
    let json: serde_json::Value =
        serde_json::from_str(include_str!("../../dashboards/specula.json")).unwrap();
    use specula::advice::{CostSource, Sources, request_slot};
    use specula::specula_core::metrics::CostModel;
    use specula::specula_core::{Extremes, Snapshot};
    // An engine with drafts, a cost and a finished-request histogram: every family the
    // dashboard reads has a series (the derived gauges need counts to derive from).
    let mut wired = wire::<4, _>(["rank0"]).unwrap();
    let mut s = Snapshot::<4>::ZERO;
    s.counters.record(4, 2).unwrap();
    wired.writers[0].publish(&s);
    let (_requests, reader) = request_slot(Extremes::default());
    let sources = Sources::new()
        .with_costs(
            "rank0",
            CostSource::Fixed(CostModel::from_ratio(0.1).unwrap()),
        )
        .with_requests("rank0", reader);
    let text = render(
        &SpecCollector::new(wired.slots, Options::default())
            .with_clock(StdClock::new())
            .with_sources(sources)
            .into_registry(),
        Format::Text,
    )
    .unwrap();
    let mut queries: Vec<String> = Vec::new();
    let mut ids = std::collections::HashSet::new();
    for p in json["panels"].as_array().unwrap() {
        assert!(
            ids.insert(p["id"].as_u64().unwrap()),
            "panel ids are unique"
        );
        if p["type"] == "row" {
            continue;
        }
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{}", p["title"]);
        queries.extend(
            targets
                .iter()
                .map(|t| t["expr"].as_str().unwrap().to_owned()),
        );
    }
    for v in json["templating"]["list"].as_array().unwrap() {
        if let Some(q) = v["query"].as_str().filter(|_| v["type"] == "query") {
            queries.push(q.to_owned());
        }
    }
    assert!(queries.len() >= 27);
    let mut names = 0;
    for q in &queries {
        for (i, _) in q.match_indices("specula_") {
            let name: String = q[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            assert!(
                text.contains(&format!("\n{name}{{")),
                "{name} (in {q}) is not exported"
            );
            names += 1;
        }
        for var in ["$job", "$model_name", "$instance"] {
            if q.contains("specula_drafts_total{") && !q.starts_with("label_values") {
                assert!(q.contains(var), "{q} ignores {var}");
            }
        }
    }
    assert!(names >= 40);
}

#[test]
fn content_negotiation() {
    assert_eq!(Format::negotiate(None), Format::Text);
    assert_eq!(Format::negotiate(Some("*/*")), Format::Text);
    let prom = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5";
    assert_eq!(Format::negotiate(Some(prom)), Format::OpenMetrics);
    // Same rules as the server's negotiation: q=0 excludes, a lower q loses.
    assert_eq!(
        Format::negotiate(Some("application/openmetrics-text;q=0, */*")),
        Format::Text
    );
    assert_eq!(
        Format::negotiate(Some("text/plain;q=0.2, application/openmetrics-text;q=0.9")),
        Format::OpenMetrics
    );
    // Nothing acceptable: the text format (a server that answers 406 uses http::negotiate).
    assert_eq!(Format::negotiate(Some("application/json")), Format::Text);
    assert_eq!(
        Format::OpenMetrics.content_type(),
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
}

/// The value of the sample `name{labels}` as a float.
fn sample_f64(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn last_collection_time_and_age_are_exported_with_the_clock() {
    use specula::prom::{age, unix_seconds};
    use specula::specula_core::Clock;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    // Explicit times: a snapshot as of 3 s on a clock that reads 10 s at Unix time 1000 s.
    let at_1000 = UNIX_EPOCH + Duration::from_secs(1000);
    assert_eq!(age(3_000_000_000, 10_000_000_000), Duration::from_secs(7));
    assert_eq!(unix_seconds(3_000_000_000, 10_000_000_000, at_1000), 993.0);
    // A snapshot from the clock's future (another clock) is not negative in age.
    assert_eq!(age(11, 10), Duration::ZERO);
    assert_eq!(unix_seconds(11, 10, at_1000), 1000.0);
    // Before the Unix epoch: 0, never a panic.
    assert_eq!(unix_seconds(0, u64::MAX, at_1000), 0.0);

    let wired = wire::<4, _>(["rank0", "stalled"]).unwrap();
    let clock = StdClock::new();
    let mut writers = wired.writers.into_iter();
    let mut d = Ticker::new(
        HostReadback::<4>::default(),
        writers.next().unwrap(),
        Duration::from_secs(3600),
        clock,
    )
    .unwrap();
    d.collector_mut().readback_mut().record(2, 1).unwrap();
    d.flush().unwrap();
    let collected_at = d.collector().last().at_ns;
    drop(writers); // the "stalled" rank never collects
    let without = render(
        &SpecCollector::new(wired.slots.clone(), Options::default()).into_registry(),
        Format::Text,
    )
    .unwrap();
    assert!(
        !without.contains("specula_last_collection"),
        "needs the clock"
    );
    let reg = SpecCollector::new(wired.slots, Options::default())
        .with_clock(clock)
        .into_registry();
    let before = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let text = render(&reg, Format::Text).unwrap();
    let after = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    assert!(text.contains("# TYPE specula_last_collection_timestamp_seconds gauge"));
    assert!(text.contains("# TYPE specula_last_collection_age_seconds gauge"));
    let ts = |e: &str| {
        sample_f64(
            &text,
            &format!("specula_last_collection_timestamp_seconds{{engine=\"{e}\"}}"),
        )
        .unwrap()
    };
    let age_of = |e: &str| {
        sample_f64(
            &text,
            &format!("specula_last_collection_age_seconds{{engine=\"{e}\"}}"),
        )
        .unwrap()
    };
    // The collected rank: its timestamp is its at_ns mapped to Unix time; timestamp + age is
    // the scrape's Unix time (within the float formatting).
    for e in ["rank0", "stalled"] {
        assert!(age_of(e) >= 0.0);
        let scrape = ts(e) + age_of(e);
        assert!(
            scrape >= before.as_secs_f64() - 1e-3 && scrape <= after.as_secs_f64() + 1e-3,
            "{e}: {scrape} not in [{before:?}, {after:?}]"
        );
    }
    // The stalled rank's data is as of the clock's epoch: older than the collected rank's.
    assert!(collected_at <= clock.now_ns());
    assert!(age_of("stalled") >= age_of("rank0"));
    assert!(ts("stalled") <= ts("rank0"));
    let om = render(&reg, Format::OpenMetrics).unwrap();
    assert!(om.contains("# TYPE specula_last_collection_age_seconds gauge"));
}

/// The samples of family `name` whose labels contain every `labels` pair, as (labels, value).
fn gauges_of(text: &str, name: &str, labels: &[&str]) -> Vec<(String, f64)> {
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix('{')?;
            let (set, value) = rest.split_once("} ")?;
            labels
                .iter()
                .all(|p| set.split(',').any(|x| x == *p))
                .then(|| (set.to_owned(), value.parse().ok()))
                .and_then(|(s, v)| Some((s, v?)))
        })
        .collect()
}

#[test]
fn distribution_conditionals_advice_and_requests_at_scrape_time() {
    use specula::advice::{CostSource, Sources, cost_slot, request_slot};
    use specula::specula_core::metrics::{CostModel, advise};
    use specula::specula_core::{Extremes, RequestAcceptance, Snapshot};
    let mut wired = wire::<4, _>(["rank0", "rank1"]).unwrap();
    let (mut costs, cost_reader) = cost_slot();
    let (mut finished, finished_reader) = request_slot(Extremes {
        min_drafted: 4,
        long_output: 8,
        ..Extremes::default()
    });
    let sources = Sources::new()
        .with_costs("rank0", CostSource::Measured(cost_reader))
        .with_requests("rank0", finished_reader);
    let reg = SpecCollector::new(wired.slots.clone(), Options::default())
        .with_draft_len(3)
        .unwrap()
        .with_sources(sources)
        .with_advice_window(Duration::from_secs(10))
        .into_registry();
    let second = 1_000_000_000u64;
    let mut s = Snapshot::<4>::ZERO;
    // 0..10 s: every draft fully accepted, cheap drafts.
    for _ in 0..20 {
        s.counters.record(3, 3).unwrap();
        costs.record(&StepTiming {
            draft_len: 3,
            fixed_ns: 10_000,
            scaled_ns: 300,
            ..StepTiming::default()
        });
    }
    s.at_ns = 2 * second;
    wired.writers[0].publish(&s);
    let mut r = RequestAcceptance::NEW;
    for _ in 0..4 {
        r.record(3, 3).unwrap(); // 12 of 12 over 16 tokens: high
    }
    finished.finish(&r);
    let mut low = RequestAcceptance::NEW;
    low.record(8, 0).unwrap();
    finished.finish(&low);
    finished.finish(&RequestAcceptance::NEW);
    let text = render(&reg, Format::Text).unwrap();
    let e = "engine=\"rank0\"";
    let lengths: Vec<u64> = (0..=3)
        .map(|j| {
            sample(
                &text,
                &format!("specula_drafts_by_accepted_length_total{{{e},length=\"{j}\"}}"),
            )
            .unwrap()
        })
        .collect();
    assert_eq!(lengths, [0, 0, 0, 20], "{text}");
    assert!(text.contains("# TYPE specula_conditional_acceptance_rate gauge"));
    let cond = gauges_of(&text, "specula_conditional_acceptance_rate", &[e]);
    assert_eq!(cond.len(), 6, "3 positions × 2 windows: {cond:?}");
    assert!(cond.iter().all(|(_, v)| *v == 1.0));
    let rec = |text: &str, w: &str| {
        gauges_of(text, "specula_recommended_draft_length", &[e, w])
            .first()
            .map(|x| x.1)
    };
    assert_eq!(rec(&text, "window=\"recent\""), Some(3.0));
    assert_eq!(rec(&text, "window=\"lifetime\""), Some(3.0));
    let speedups = gauges_of(&text, "specula_expected_speedup", &[e, "window=\"recent\""]);
    assert_eq!(speedups.len(), 3);
    let r0 = 100.0 / 10_000.0;
    assert!(
        speedups
            .iter()
            .any(|(l, v)| l.contains("draft_length=\"3\"") && *v == 4.0 / (1.0 + 3.0 * r0)),
        "{speedups:?}"
    );
    // rank1 has no sources: distribution and conditionals, no advice, no requests.
    assert!(gauges_of(&text, "specula_expected_speedup", &["engine=\"rank1\""]).is_empty());
    assert!(!text.contains("specula_requests_finished_total{engine=\"rank1\"}"));
    // The finished requests: 3 finished, 2 drafted; 1 low, 1 high.
    assert_eq!(
        sample(&text, &format!("specula_requests_finished_total{{{e}}}")),
        Some(3)
    );
    assert_eq!(
        sample(
            &text,
            &format!("specula_requests_low_acceptance_total{{{e}}}")
        ),
        Some(1)
    );
    assert_eq!(
        sample(
            &text,
            &format!("specula_requests_high_acceptance_total{{{e}}}")
        ),
        Some(1)
    );
    assert_eq!(
        sample(
            &text,
            &format!("specula_request_acceptance_rate_count{{{e}}}")
        ),
        Some(2)
    );
    assert_eq!(
        sample(
            &text,
            &format!("specula_request_acceptance_rate_bucket{{{e},le=\"0.05\"}}")
        ),
        Some(1)
    );
    assert_eq!(
        sample(
            &text,
            &format!("specula_request_acceptance_rate_bucket{{{e},le=\"0.95\"}}")
        ),
        Some(1)
    );
    assert_eq!(
        sample(
            &text,
            &format!("specula_request_acceptance_rate_bucket{{{e},le=\"+Inf\"}}")
        ),
        Some(2)
    );
    assert!(text.contains("# TYPE specula_request_acceptance_rate histogram"));
    // 12 s: a window has passed since 2 s; nothing accepted past position 0 and dear drafts.
    let at_12 = s.counters;
    s.at_ns = 12 * second;
    wired.writers[0].publish(&s);
    let _ = render(&reg, Format::Text).unwrap();
    for _ in 0..20 {
        s.counters.record(3, 1).unwrap();
        costs.record(&StepTiming {
            draft_len: 3,
            fixed_ns: 10_000,
            scaled_ns: 60_000,
            ..StepTiming::default()
        });
    }
    s.at_ns = 15 * second;
    wired.writers[0].publish(&s);
    let text = render(&reg, Format::OpenMetrics).unwrap();
    // Recent: from 2 s (the previous window's start) — only the new drafts differ from then.
    let recent = s.counters.delta_since(&at_12);
    assert_eq!(recent.drafts, 20);
    let cost_recent = CostModel::from_ratio(20_000.0 / 10_000.0).unwrap();
    let want = advise(&recent, &cost_recent).unwrap();
    assert_eq!(
        rec(&text, "window=\"recent\""),
        Some(want.recommended() as f64)
    );
    assert_eq!(want.recommended(), 1);
    let ratio = gauges_of(&text, "specula_draft_cost_ratio", &[e, "window=\"recent\""]);
    assert_eq!(ratio.first().map(|x| x.1), Some(2.0));
    let lifetime = advise(&s.counters, &costs.meter().cost_model().unwrap()).unwrap();
    assert_eq!(
        rec(&text, "window=\"lifetime\""),
        Some(lifetime.recommended() as f64)
    );
    let cond = gauges_of(
        &text,
        "specula_conditional_acceptance_rate",
        &[e, "position=\"1\"", "window=\"recent\""],
    );
    assert_eq!(cond.first().map(|x| x.1), Some(0.0));
    let cond = gauges_of(
        &text,
        "specula_conditional_acceptance_rate",
        &[e, "position=\"1\"", "window=\"lifetime\""],
    );
    assert_eq!(cond.first().map(|x| x.1), Some(0.5));
    // A constant label cannot take the new label names.
    for name in ["length", "draft_length", "window"] {
        assert!(specula::prom::check_label_name(name).is_err(), "{name}");
    }
}
