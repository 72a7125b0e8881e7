#![doc = include_str!("../README.md")]
#![no_std]
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod sync;

pub mod acceptance;
pub mod advisor;
pub mod clock;
pub mod collector;
pub mod counters;
pub mod cursor;
pub mod error_kind;
pub mod flight;
pub mod gpu;
pub mod interval;
pub mod metrics;
pub mod readback;
pub mod registry;
pub mod report;
pub mod request;
pub mod slot;
pub mod words;

// -- verification (reference algorithms, RNG, portable math, kernel text) --
// The numerics of the rules (specified in DETERMINISM.md): public for the backends and the
// test suite, hidden from the front page, which is for runtimes.
#[doc(hidden)]
pub mod exponential;
#[doc(hidden)]
pub mod fmath;
pub mod kernels;
#[doc(hidden)]
pub mod philox;
pub mod verify;

pub use acceptance::{CountRange, Reached};
pub use advisor::{Advice, AdviceError, Advisor, CostMeter, CostModel, StepTiming};
pub use clock::{Clock, VirtualClock};
pub use collector::{CollectError, Collector, Tick};
pub use counters::{CountError, Counters, Snapshot};
pub use cursor::{Cursor, Taken};
pub use error_kind::{ErrorKind, HasKind};
pub use flight::{Flight, MAX_IN_FLIGHT};
pub use interval::{Interval, ZeroPeriod};
pub use metrics::Rates;
pub use readback::{Misuse, Readback};
pub use registry::{Registry, RegistryError, RegistryReader};
pub use report::{Report, VllmReport};
pub use request::{Extremes, FinishedRequests, RequestAcceptance};
pub use slot::{SeqSlot, SlotReader, SlotWriter};
pub use words::Words;
