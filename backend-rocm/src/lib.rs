#![doc = include_str!("../README.md")]
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod compile;
mod device;
mod driver;
mod error;
mod ffi;
mod memory;

pub use compile::{
    COMPILE_OPTIONS, CodeObject, EM_AMDGPU, compile, hiprtc_version, unbundle, valid_target_id,
};
pub use device::{RocmDevice, RocmEvent, RocmStream, device_count, runtime_version};
pub use driver::{
    RocmDriver, RocmGraph, RocmOut, RocmReadback, RocmRows, RocmVerifier, RowElement,
};
pub use error::RocmError;
pub use memory::{DeviceCopy, RocmDeviceBuffer, RocmPinnedBuffer};
