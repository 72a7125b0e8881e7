//! Helpers the tests share: `format!` without alloc and the known-answer digests.

use core::fmt::Write as _;

/// `format!` without alloc: the core's tests stay `no_std`-shaped, and a buffer overflow fails.
pub fn fmt<T: core::fmt::Display>(v: &T) -> heapless::String<256> {
    let mut s = heapless::String::new();
    write!(s, "{v}").expect("fits 256 bytes");
    s
}

pub fn dbg<T: core::fmt::Debug>(v: &T) -> heapless::String<256> {
    let mut s = heapless::String::new();
    write!(s, "{v:?}").expect("fits 256 bytes");
    s
}

/// FNV-1a over 64-bit words: one number that pins thousands of results.
pub struct Fnv(pub u64);

impl Fnv {
    pub fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
    pub fn add(&mut self, v: u64) {
        for b in v.to_le_bytes() {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

/// splitmix64: the test inputs' generator (the simulation's own).
pub use crate::sim::Mix;
