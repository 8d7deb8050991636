//! `stride-perf`: a perftest-style RDMA benchmark built on sideway.
//!
//! The crate measures what perftest measures, the same way, so that its numbers can stand
//! beside perftest's. It grows piece by piece; today it holds the latency statistics.

#![warn(missing_docs)]
#![deny(unsafe_code)]

pub mod latency;
