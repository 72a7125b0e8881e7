#![doc = include_str!("../README.md")]
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod calls;
mod compile;
mod device;
mod driver;
mod error;
mod foreign;
mod nvrtc;
mod readback;
mod verifier;

pub use calls::{CallCounts, call_counts};
pub use compile::{
    DRIVER_SYMBOLS, compile_ptx, compile_source_ptx, compile_tree_ptx, driver_present,
    nvrtc_options, nvrtc_present, nvrtc_version,
};
pub use device::{CudaDevice, DeviceBuffer, PinnedWords};
pub use driver::{CudaDriver, EventHandle, GraphHandle};
pub use error::CudaError;
pub use foreign::{Foreign, ForeignMut};
pub use nvrtc::NVRTC_ENV;
pub use readback::CudaReadback;
pub use verifier::CudaVerifier;
