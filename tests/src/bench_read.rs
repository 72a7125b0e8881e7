//! The read-only pass the CPU benchmarks compare with (`benches/verify_cpu.rs`,
//! `benches/verify_inputs.rs`, `benches/tree_cpu.rs`): a sum over as many bytes as the verifier
//! reads, on as many threads, with the threads started once. A pass that spawned its threads on
//! every call would time the spawns (tens of microseconds), which at batch 1 is more than the
//! verification itself.

use std::hint::black_box;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};

/// The sum of `c` (as u16 words, so f32 and bf16 inputs read alike).
fn sum(c: &[u16]) -> u64 {
    // Eight independent sums so the loop is bound by loads, not by one add chain.
    let mut acc = [0u64; 8];
    let chunks = c.chunks_exact(8);
    let tail: u64 = chunks.remainder().iter().map(|&x| u64::from(x)).sum();
    for ch in chunks {
        for (a, &x) in acc.iter_mut().zip(ch) {
            *a += u64::from(x);
        }
    }
    acc.iter().sum::<u64>() + tail
}

/// Sums the first `len` words of one buffer, in one contiguous piece per thread, on threads
/// started once (the calling thread takes the first piece). The workers end when the pool is
/// dropped.
#[derive(Debug)]
pub struct ReadPool {
    pool: Arc<Vec<u16>>,
    workers: Vec<(Sender<usize>, Receiver<u64>)>,
}

impl ReadPool {
    /// A pool over a buffer of `words` u16 words (2 bytes each), read by `threads` threads.
    #[must_use]
    pub fn new(words: usize, threads: usize) -> Self {
        let pool: Arc<Vec<u16>> = Arc::new((0..words).map(|i| i as u16).collect());
        let n = threads.max(1);
        let workers = (1..n)
            .map(|i| {
                let (tx, rx) = channel::<usize>();
                let (back, res) = channel::<u64>();
                let pool = Arc::clone(&pool);
                std::thread::spawn(move || {
                    // One request per call: the length to read; this worker's piece of it.
                    while let Ok(len) = rx.recv() {
                        let piece = len.div_ceil(n);
                        let lo = (i * piece).min(len);
                        let hi = ((i + 1) * piece).min(len);
                        if back.send(sum(black_box(&pool[lo..hi]))).is_err() {
                            break;
                        }
                    }
                });
                (tx, res)
            })
            .collect();
        Self { pool, workers }
    }

    /// Words in the buffer: the most one [`read`](Self::read) covers.
    #[must_use]
    pub fn words(&self) -> usize {
        self.pool.len()
    }

    /// The sum of the first `len` words (at most [`words`](Self::words)).
    ///
    /// # Panics
    /// If a worker thread has died (it cannot: its loop only ends when the pool is dropped).
    pub fn read(&self, len: usize) -> u64 {
        let len = len.min(self.pool.len());
        for (tx, _) in &self.workers {
            tx.send(len).expect("read worker");
        }
        let piece = len.div_ceil(self.workers.len() + 1);
        let mut s = sum(black_box(&self.pool[..piece.min(len)]));
        for (_, rx) in &self.workers {
            s += rx.recv().expect("read worker");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::ReadPool;

    #[test]
    fn every_word_is_read_once_whatever_the_threads() {
        for threads in [1, 2, 3, 8] {
            let p = ReadPool::new(1_003, threads);
            for len in [0, 1, 7, 8, 999, 1_003, 5_000] {
                let n = len.min(1_003) as u64;
                assert_eq!(
                    p.read(len),
                    n * n.saturating_sub(1) / 2,
                    "{threads} threads, {len}"
                );
            }
        }
    }
}
