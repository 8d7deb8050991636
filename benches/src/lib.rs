//! Support code for the data-path benchmarks.
//!
//! The benchmarks claim zero heap allocations per work request and per completion; the
//! [`alloc_counter`] module is how that claim is checked rather than asserted.

#![warn(missing_docs)]

pub mod alloc_counter;
