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
