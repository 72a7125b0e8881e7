//! Prometheus exposition: totals equal the slots', counter semantics, vllm compatibility names.

use specula::HostReadback;
use specula::prom::{Format, Options, SpecCollector, render};
use specula::specula_core::Counters;
use specula::{Driver, StdClock, wire};
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
        let mut d = Driver::new(
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
}

#[test]
fn vllm_compat_names_carry_the_same_totals() {
    let (reg, totals) = setup(Options { vllm_compat: true });
    let text = render(&reg, Format::Text).unwrap();
    for (i, t) in totals.iter().enumerate() {
        let e = format!("engine=\"rank{i}\"");
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
    }
    assert!(text.contains("# TYPE vllm:spec_decode_num_accepted_tokens_total counter"));
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
    let mut d = Driver::new(
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
