//! Completion queues (`struct ibv_cq`, `struct ibv_cq_ex`).

#[allow(unsafe_code)]
mod cq;

pub use crate::work_completion::{
    WcFlags, WcOpcode, WcStatus, WorkCompletion, WorkCompletionError,
};
pub use cq::*;
