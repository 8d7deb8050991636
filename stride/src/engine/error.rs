//! Why a run failed: [`RunError`], a sentence saying what happened and what to do, and how
//! the errors of the layers below become one.

use std::fmt;

use crate::bandwidth::BandwidthError;
use crate::buffer::BufferError;
use crate::latency::TooFewSamples;
use crate::oob::OobError;
use crate::params::ParamError;

/// Why a run failed: a sentence saying what happened and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunError(String);

impl RunError {
    /// An error with this message.
    pub fn new(msg: impl Into<String>) -> Self {
        RunError(msg.into())
    }
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RunError {}

macro_rules! run_error_from {
    ($($t:ty),* $(,)?) => {$(
        impl From<$t> for RunError {
            fn from(e: $t) -> Self {
                RunError(e.to_string())
            }
        }
    )*};
}

run_error_from!(
    ParamError,
    OobError,
    BandwidthError,
    TooFewSamples,
    BufferError,
    crate::cuda::CudaError,
    sideway::DeviceError,
    sideway::protection_domain::AllocPdError,
    sideway::MemoryRegionError,
    sideway::CompletionQueueError,
    sideway::QueuePairError,
    sideway::ConnectError,
    sideway::PostError,
    sideway::WorkCompletionError,
    sideway::rdmacm::CmError,
    sideway::AddressHandleError,
    sideway::async_event::EventError,
    sideway::SharedReceiveQueueError,
    sideway::ModifyQpError,
    sideway::dv::DvError,
);
