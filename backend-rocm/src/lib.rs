#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod compile;
mod device;
mod error;
mod ffi;
mod memory;
mod readback;
mod verifier;

pub use compile::{
    COMPILE_OPTIONS, CodeObject, EM_AMDGPU, compile, hiprtc_version, unbundle, valid_target_id,
};
pub use device::{Device, device_count, runtime_version};
pub use error::RocmError;
pub use memory::{DeviceBuffer, DeviceCopy};
pub use readback::{DeviceCounters, RocmReadback};
pub use verifier::{DeviceBatch, DeviceOutputs, DeviceShape, RocmVerifier};
