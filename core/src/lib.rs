#![doc = include_str!("../README.md")]
#![no_std]
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod sync;

pub mod error_kind;
pub mod gpu;
pub mod metrics;
pub mod verify;

pub use error_kind::{ErrorKind, HasKind};
pub use metrics::{
    Advice, AdviceError, Advisor, Clock, CollectError, Collector, CostMeter, CostModel, CountError,
    CountRange, Counters, Cursor, Extremes, FinishedRequests, Flight, Interval, MAX_IN_FLIGHT,
    Misuse, Rates, Reached, Readback, Report, RequestAcceptance, SeqSlot, SlotReader, SlotWriter,
    Snapshot, StepTiming, Taken, Tick, VirtualClock, VllmReport, Words, ZeroPeriod,
};
