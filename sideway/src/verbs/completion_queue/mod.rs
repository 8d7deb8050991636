//! Completion queues (`struct ibv_cq`, `struct ibv_cq_ex`).

#[allow(unsafe_code)]
mod cq;

pub use cq::*;
