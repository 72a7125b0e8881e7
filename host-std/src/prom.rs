//! Prometheus: a `prometheus-client` [`Collector`] that reads the slots at scrape time.
//!
//! No timer runs on this path: each scrape reads every slot once (a consistent snapshot per
//! rank) and encodes its cumulative totals as counters. Because the values are the slot's own
//! totals, a scrape can never double count, whatever the scrape and collection schedules.

use crate::clock::StdClock;
use crate::wiring::Slots;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use specula_core::{Clock, Snapshot};
use std::fmt::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Exposition formats the HTTP endpoint can serve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0 text (`# EOF` terminated).
    OpenMetrics,
    /// The classic Prometheus text format 0.0.4 (what `promtool check metrics` reads).
    Text,
}

impl Format {
    /// The `Content-Type` of a response in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Self::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Self::Text => "text/plain; version=0.0.4; charset=utf-8",
        }
    }

    /// The format to answer a client whose `Accept` header is `accept` with, by the same rules
    /// as [`http::negotiate`](crate::http::negotiate) (quality values, specificity,
    /// case-insensitive media types); where neither format is acceptable, the classic text
    /// format, which every scraper reads. A server that answers `406 Not Acceptable` instead
    /// calls [`http::negotiate`](crate::http::negotiate) itself.
    pub fn negotiate(accept: Option<&str>) -> Self {
        crate::http::negotiate(accept).unwrap_or(Self::Text)
    }
}

/// Encodes `registry` in `format`.
pub fn render(registry: &Registry, format: Format) -> Result<String, std::fmt::Error> {
    let mut out = String::new();
    match format {
        Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut out, registry)?,
        Format::Text => prometheus_client::encoding::prometheus_text::encode(&mut out, registry)?,
    }
    Ok(out)
}

/// What the collector exports besides its own `specula_*` families.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// Also export the `vllm:spec_decode_*` counters existing dashboards use.
    pub vllm_compat: bool,
}

/// Reads [`Slots`] at scrape time and encodes them as Prometheus counters.
///
/// Families (each with an `engine` label, the slot's label):
/// `specula_drafts_total`, `specula_draft_tokens_total`, `specula_accepted_tokens_total`,
/// `specula_emitted_tokens_total`, `specula_accepted_tokens_per_position_total{position}`,
/// `specula_draft_tokens_per_position_total{position}`, `specula_readback_errors_total`; and
/// `specula_build_info{version,max_draft}` = 1. Given the collectors' clock
/// ([`with_clock`](SpecCollector::with_clock)) also the gauges
/// `specula_last_collection_timestamp_seconds` (Unix time of the last successful collection,
/// the snapshot's `at_ns`) and `specula_last_collection_age_seconds` (how old the data is at
/// the scrape), so a stalled collection shows as an age that grows. With
/// [`Options::vllm_compat`] also
/// `vllm:spec_decode_num_drafts_total`, `vllm:spec_decode_num_draft_tokens_total`,
/// `vllm:spec_decode_num_accepted_tokens_total` and
/// `vllm:spec_decode_num_accepted_tokens_per_pos_total{position}`.
#[derive(Debug)]
pub struct SpecCollector<const K: usize> {
    slots: Slots<K>,
    options: Options,
    clock: Option<StdClock>,
}

impl<const K: usize> SpecCollector<K> {
    /// A collector over `slots`.
    pub fn new(slots: Slots<K>, options: Options) -> Self {
        Self {
            slots,
            options,
            clock: None,
        }
    }

    /// Exports the time of each slot's last successful collection and its age, reading the
    /// snapshots' `at_ns` on `clock` — the clock the collectors tick with (a [`StdClock`] is
    /// `Copy` and every copy shares its epoch).
    #[must_use]
    pub fn with_clock(mut self, clock: StdClock) -> Self {
        self.clock = Some(clock);
        self
    }

    /// A new registry holding only this collector.
    pub fn into_registry(self) -> Registry {
        let mut r = Registry::default();
        r.register_collector(Box::new(self));
        r
    }
}

/// Position label values "0", "1", … without allocating per scrape beyond one small string.
fn position_labels<const K: usize>() -> [String; K] {
    std::array::from_fn(|i| {
        let mut s = String::new();
        let _ = write!(s, "{i}");
        s
    })
}

fn counter_family(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: &[(&str, u64)],
) -> Result<(), std::fmt::Error> {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (engine, v) in rows {
        let labels = [("engine", *engine)];
        m.encode_family(&labels)?
            .encode_counter::<NoLabelSet, _, u64>(v, None)?;
    }
    Ok(())
}

fn gauge_family(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: &[(&str, f64)],
) -> Result<(), std::fmt::Error> {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (engine, v) in rows {
        let labels = [("engine", *engine)];
        m.encode_family(&labels)?.encode_gauge(v)?;
    }
    Ok(())
}

/// How old a snapshot taken at `at_ns` is at `now_ns` (zero if it is from the future).
pub fn age(at_ns: u64, now_ns: u64) -> Duration {
    Duration::from_nanos(now_ns.saturating_sub(at_ns))
}

/// The Unix time, in seconds, of `at_ns` on a clock that reads `now_ns` at the system time
/// `now` (before the Unix epoch: 0).
pub fn unix_seconds(at_ns: u64, now_ns: u64, now: SystemTime) -> f64 {
    now.checked_sub(age(at_ns, now_ns))
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0.0, |d| d.as_secs_f64())
}

fn position_family<const K: usize>(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    snaps: &[(&str, Snapshot<K>)],
    field: impl Fn(&Snapshot<K>) -> &[u64; K],
) -> Result<(), std::fmt::Error> {
    let positions = position_labels::<K>();
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (engine, s) in snaps {
        for (pos, v) in positions.iter().zip(field(s)) {
            let labels = [("engine", *engine), ("position", pos.as_str())];
            m.encode_family(&labels)?
                .encode_counter::<NoLabelSet, _, u64>(v, None)?;
        }
    }
    Ok(())
}

impl<const K: usize> Collector for SpecCollector<K> {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        // One read per slot per scrape: every family below comes from the same snapshot.
        let snaps: Vec<(&str, Snapshot<K>)> =
            self.slots.iter().map(|(l, r)| (&**l, r.read().0)).collect();
        let rows = |f: fn(&Snapshot<K>) -> u64| -> Vec<(&str, u64)> {
            snaps.iter().map(|(l, s)| (*l, f(s))).collect()
        };

        let drafts = rows(|s| s.counters.drafts);
        let draft_tokens = rows(|s| s.counters.draft_tokens);
        let accepted = rows(|s| s.counters.accepted_tokens);
        counter_family(
            &mut enc,
            "specula_drafts",
            "Verification steps with at least one draft token.",
            &drafts,
        )?;
        counter_family(
            &mut enc,
            "specula_draft_tokens",
            "Draft tokens proposed.",
            &draft_tokens,
        )?;
        counter_family(
            &mut enc,
            "specula_accepted_tokens",
            "Draft tokens accepted by the verifier.",
            &accepted,
        )?;
        counter_family(
            &mut enc,
            "specula_emitted_tokens",
            "Tokens emitted: accepted plus one recovered or bonus token per draft.",
            &rows(|s| s.counters.emitted_tokens),
        )?;
        position_family(
            &mut enc,
            "specula_accepted_tokens_per_position",
            "Drafts whose token at this position was accepted.",
            &snaps,
            |s| &s.counters.accepted_per_position,
        )?;
        position_family(
            &mut enc,
            "specula_draft_tokens_per_position",
            "Drafts that had a token at this position.",
            &snaps,
            |s| &s.counters.drafted_per_position,
        )?;
        counter_family(
            &mut enc,
            "specula_readback_errors",
            "Counter readbacks that failed or returned decreasing counts.",
            &rows(|s| s.readback_errors),
        )?;
        if let Some(clock) = self.clock {
            // One reading of both clocks per scrape: every engine's age is against the same now.
            let (now_ns, now) = (clock.now_ns(), SystemTime::now());
            let stamps: Vec<(&str, f64)> = snaps
                .iter()
                .map(|(l, s)| (*l, unix_seconds(s.at_ns, now_ns, now)))
                .collect();
            let ages: Vec<(&str, f64)> = snaps
                .iter()
                .map(|(l, s)| (*l, age(s.at_ns, now_ns).as_secs_f64()))
                .collect();
            gauge_family(
                &mut enc,
                "specula_last_collection_timestamp_seconds",
                "Unix time the counters of the last successful collection are as of.",
                &stamps,
            )?;
            gauge_family(
                &mut enc,
                "specula_last_collection_age_seconds",
                "Age of the last successful collection at this scrape; grows while collection \
                 is stalled.",
                &ages,
            )?;
        }
        {
            let k = K.to_string();
            let gauge = ConstGauge::new(1i64);
            let mut m = enc.encode_descriptor(
                "specula_build_info",
                "Specula build: version and maximum draft length; always 1.",
                None,
                gauge.metric_type(),
            )?;
            let labels = [("version", env!("CARGO_PKG_VERSION")), ("max_draft", &k)];
            gauge.encode(m.encode_family(&labels)?)?;
        }
        if self.options.vllm_compat {
            counter_family(
                &mut enc,
                "vllm:spec_decode_num_drafts",
                "Number of spec decoding drafts.",
                &drafts,
            )?;
            counter_family(
                &mut enc,
                "vllm:spec_decode_num_draft_tokens",
                "Number of draft tokens.",
                &draft_tokens,
            )?;
            counter_family(
                &mut enc,
                "vllm:spec_decode_num_accepted_tokens",
                "Number of accepted tokens.",
                &accepted,
            )?;
            position_family(
                &mut enc,
                "vllm:spec_decode_num_accepted_tokens_per_pos",
                "Accepted tokens per draft position.",
                &snaps,
                |s| &s.counters.accepted_per_position,
            )?;
        }
        Ok(())
    }
}
