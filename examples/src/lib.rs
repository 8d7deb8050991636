//! Shared pieces of the example programs.
//!
//! The binaries in this crate are wire-compatible with rdma-core's programs of the same name;
//! what they exchange on the wire lives here, once, so every program speaks it the same way.

#![warn(missing_docs)]
#![deny(unsafe_code)]

pub mod pingpong_wire;
