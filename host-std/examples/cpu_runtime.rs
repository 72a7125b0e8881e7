//! A runtime's decode loop on the CPU backend, with its metrics: the verifier counts while it
//! verifies, a [`Ticker`] collects once per step (never blocking), the `metrics` facade and a
//! log line read the slot on their own schedules, and `flush()` at shutdown loses nothing.
//!
//! `cargo run -p specula --example cpu_runtime --features metrics`

use specula::cpu::CpuVerifier;
use specula::metrics_bridge::MetricsBridge;
use specula::specula_core::verify::{
    AcceptedOut, Batch, Check, Dims, Drafts, Method, Outputs, Streams, TokensOut,
};
use specula::specula_core::{Counters, Report};
use specula::{StdClock, Ticker, wire};
use std::time::Duration;

/// The longest draft the counters track per position.
const K: usize = 4;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let verifier = CpuVerifier::<K>::new(2)?;
    // One rank: its slot's unique writer goes to the driver, the slots to every consumer.
    let wired = wire::<K, _>(["rank0"])?;
    let writer = wired.writers.into_iter().next().ok_or("no writer")?;
    let mut driver = Ticker::new(
        verifier.readback(),
        writer,
        Duration::from_millis(10),
        StdClock::new(),
    )?;
    // With a `metrics` recorder installed (Prometheus exporter, StatsD, …) these counters
    // reach it; without one the calls are no-ops.
    let mut bridge = MetricsBridge::new(&wired.slots);
    let mut log = wired.slots.cursors();

    // A toy model: vocabulary 8, batches of 4 requests with 3-token drafts.
    let (vocab, k, batch) = (8usize, 3usize, 4usize);
    let mut target = vec![0f32; batch * (k + 1) * vocab];
    let ks = vec![k as u32; batch];
    let seeds: Vec<u64> = (0..batch as u64).collect();
    let mut offsets = vec![0u64; batch];
    let (mut accepted, mut tokens) = (vec![0u32; batch], vec![0u32; batch * (k + 1)]);
    let mut draft_ids = vec![0u32; batch * k];
    for step in 0..200u64 {
        // "The target model": a peaked distribution that moves with the step.
        for (row, probs) in target.chunks_exact_mut(vocab).enumerate() {
            probs.fill(0.02);
            probs[(row + step as usize) % vocab] = 1.0 - 0.02 * (vocab - 1) as f32;
        }
        // "The draft model": right three times out of four.
        for (i, id) in draft_ids.iter_mut().enumerate() {
            let row = (i / k) * (k + 1) + i % k;
            let best = (row + step as usize) % vocab;
            *id = if (i as u64 + step) % 4 == 0 {
                ((best + 1) % vocab) as u32
            } else {
                best as u32
            };
        }
        let b = Batch::dense(
            Dims { vocab, k_max: k },
            Drafts {
                k: &ks,
                ids: &draft_ids,
            },
            &target,
            Streams {
                seed: &seeds,
                offset: &offsets,
            },
        );
        let mut out = Outputs::new(AcceptedOut(&mut accepted), TokensOut(&mut tokens));
        verifier.verify(Method::Greedy, Check::Cheap, &b, &mut out)?;
        offsets.iter_mut().for_each(|o| *o += 1);
        driver.step(); // once per decode step: starts or polls a readback, never blocks
        if step % 50 == 49 {
            bridge.update();
            for (label, cursor) in &mut log {
                if let Some(taken) = cursor.take() {
                    println!("{}", Report::new(label, &taken));
                }
            }
        }
    }
    // Shutdown: one final readback, then the consumers take the last counts.
    driver.flush()?;
    bridge.update();
    let totals: Counters<K> = wired.slots.total().counters;
    assert_eq!(totals.drafts, 200 * batch as u64);
    println!(
        "final: {} drafts, {} of {} draft tokens accepted",
        totals.drafts, totals.accepted_tokens, totals.draft_tokens
    );
    Ok(())
}
