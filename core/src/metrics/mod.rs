//! The metrics path: the counters the verifier accumulates, the lock-free slot they are
//! published through, the collector that reads them back without blocking a decode step, the
//! cursors every consumer reads them with, and what is derived from them (rates, the log line,
//! per-request acceptance, the acceptance-length distribution, the draft-length advisor).
//!
//! * Counting: [`Counters`] (what a verification step adds), [`Snapshot`] (what is published).
//! * Publishing: [`SeqSlot`] (one writer, many readers, no lock), its [`Words`] payload.
//! * Collecting: [`Collector`] drives a [`Readback`] on an [`Interval`] of a [`Clock`], with at
//!   most [`MAX_IN_FLIGHT`] copies in a [`Flight`].
//! * Consuming: a [`Cursor`] per consumer turns published totals into exact deltas
//!   ([`Taken`]); [`Report`] and [`VllmReport`] print them; [`Rates`] derive ratios.
//! * Insight: [`RequestAcceptance`] per request, [`AcceptanceLengths`] and the [`Advisor`].

mod acceptance;
mod advisor;
mod clock;
mod collector;
mod counters;
mod cursor;
mod flight;
mod interval;
mod rates;
mod readback;
mod report;
mod request;
mod slot;
mod words;

pub use self::acceptance::*;
pub use self::advisor::*;
pub use self::clock::*;
pub use self::collector::*;
pub use self::counters::*;
pub use self::cursor::*;
pub use self::flight::*;
pub use self::interval::*;
pub use self::rates::*;
pub use self::readback::*;
pub use self::report::*;
pub use self::request::*;
pub use self::slot::*;
pub use self::words::*;
