//! Devices (`struct ibv_device`) and their opened contexts (`struct ibv_context`): the
//! device list, opening a device, and what a context can be asked.

#[allow(unsafe_code)]
mod context;

pub use context::*;
