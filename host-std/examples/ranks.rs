//! Several engine ranks, each with its own collector thread, exported with an `engine` label
//! per rank: what a tensor- or data-parallel runtime wires at start-up.
//!
//! `cargo run -p specula --example ranks`

use specula::prom::{Format, Options, SpecCollector, render};
use specula::{HostReadback, StdClock, Ticker, wire_ranks};
use std::time::Duration;

const K: usize = 4;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Labels rank0..rank3; `specula::wire` takes any labels (`["tp0", "tp1"]`, …).
    let wired = wire_ranks::<K>(4)?;
    // The exporter reads every slot at scrape time: no timer, no double counting.
    let registry =
        SpecCollector::new(wired.slots.clone(), Options { vllm_compat: true }).into_registry();
    let ranks: Vec<_> = wired
        .writers
        .into_iter()
        .enumerate()
        .map(|(rank, writer)| {
            std::thread::spawn(move || -> Result<(), String> {
                // Each rank counts on the host here (a GPU backend's readback would take its
                // place) and collects on its own grid.
                let mut driver = Ticker::new(
                    HostReadback::<K>::default(),
                    writer,
                    Duration::from_millis(5),
                    StdClock::new(),
                )
                .map_err(|e| e.to_string())?;
                for step in 0..100 {
                    let accepted = (step + rank) % (K + 1);
                    driver
                        .collector_mut()
                        .readback_mut()
                        .record(K, accepted)
                        .map_err(|e| e.to_string())?;
                    driver.step();
                }
                driver.flush().map_err(|e| format!("{e:?}"))?;
                Ok(())
            })
        })
        .collect();
    for r in ranks {
        r.join().map_err(|_| "a rank panicked")??;
    }
    let text = render(&registry, Format::Text)?;
    for line in text
        .lines()
        .filter(|l| l.starts_with("specula_accepted_tokens_total"))
    {
        println!("{line}");
    }
    assert_eq!(wired.slots.total().counters.drafts, 400);
    Ok(())
}
