//! `stride-perf`: a perftest-style RDMA benchmark built on sideway.
//!
//! The crate measures what perftest measures, the same way, so that its numbers can stand
//! beside perftest's. The measurement, statistics, parameter checks and reporting live here; the
//! `stride-perf` binary drives them.

#![warn(missing_docs)]
#![deny(unsafe_code)]

pub mod bandwidth;
pub mod buffer;
pub mod cli;
pub mod clock;
pub mod cluster;
pub mod compare;
pub mod cpu;
pub mod cuda;
pub mod engine;
pub mod gid_select;
pub mod latency;
pub mod loop_cost;
pub mod mode;
pub mod oob;
pub mod pacing;
pub mod params;
pub mod plot;
pub mod post_clock;
pub mod preflight;
pub mod progress;
pub mod report;
pub mod stream_bench;
pub mod trespass_compare;
