//! The read-only pass the CPU benchmarks compare with (`benches/verify_cpu.rs`,
//! `benches/verify_inputs.rs`, `benches/tree_cpu.rs`): a sum over as many bytes as the verifier
//! reads, on as many threads, with the threads started once. A pass that spawned its threads on
//! every call would time the spawns (tens of microseconds), which at batch 1 is more than the
//! verification itself.

use std::hint::black_box;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};

/// The wrapping sum of `c`'s 64-bit words. Whole 64-bit words keep the pass bound by the loads:
/// 16-bit words widened one by one ran at about half a plain load pass's speed, flattering every
/// ratio printed against it.
fn sum(c: &[u64]) -> u64 {
    // Eight independent sums so the loop is bound by loads, not by one add chain.
    let mut acc = [0u64; 8];
    let chunks = c.chunks_exact(8);
    let tail = chunks
        .remainder()
        .iter()
        .fold(0u64, |a, &x| a.wrapping_add(x));
    for ch in chunks {
        for (a, &x) in acc.iter_mut().zip(ch) {
            *a = a.wrapping_add(x);
        }
    }
    acc.iter().fold(tail, |a, &x| a.wrapping_add(x))
}

/// Sums the first `len` 16-bit words of one buffer (so f32 and bf16 inputs are measured in
/// the same unit), read as 64-bit words, in one contiguous piece per thread, on threads started
/// once (the calling thread takes the first piece). The workers end when the pool is dropped.
#[derive(Debug)]
pub struct ReadPool {
    pool: Arc<Vec<u64>>,
    workers: Vec<(Sender<usize>, Receiver<u64>)>,
}

impl ReadPool {
    /// A pool over a buffer of at least `words` u16 words (2 bytes each; rounded up to whole
    /// 64-bit words), read by `threads` threads.
    #[must_use]
    pub fn new(words: usize, threads: usize) -> Self {
        let pool: Arc<Vec<u64>> = Arc::new((0..words.div_ceil(4) as u64).collect());
        let n = threads.max(1);
        let workers = (1..n)
            .map(|i| {
                let (tx, rx) = channel::<usize>();
                let (back, res) = channel::<u64>();
                let pool = Arc::clone(&pool);
                std::thread::spawn(move || {
                    // One request per call: the length to read (64-bit words); this worker's
                    // piece of it.
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

    /// 16-bit words in the buffer: the most one [`read`](Self::read) covers.
    #[must_use]
    pub fn words(&self) -> usize {
        self.pool.len() * 4
    }

    /// The wrapping sum of the 64-bit words that hold the first `len` 16-bit words (`len`
    /// rounded up to a multiple of 4, at most [`words`](Self::words)).
    ///
    /// # Panics
    /// If a worker thread has died (it cannot: its loop only ends when the pool is dropped).
    pub fn read(&self, len: usize) -> u64 {
        let len = len.div_ceil(4).min(self.pool.len());
        for (tx, _) in &self.workers {
            tx.send(len).expect("read worker");
        }
        let piece = len.div_ceil(self.workers.len() + 1);
        let mut s = sum(black_box(&self.pool[..piece.min(len)]));
        for (_, rx) in &self.workers {
            s = s.wrapping_add(rx.recv().expect("read worker"));
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
            // 1 003 words round up to 251 64-bit words holding 0, 1, …, 250.
            let p = ReadPool::new(1_003, threads);
            assert_eq!(p.words(), 1_004);
            for len in [0usize, 1, 7, 8, 999, 1_003, 5_000] {
                let n = len.div_ceil(4).min(251) as u64;
                assert_eq!(
                    p.read(len),
                    n * n.saturating_sub(1) / 2,
                    "{threads} threads, {len}"
                );
            }
        }
    }
}
