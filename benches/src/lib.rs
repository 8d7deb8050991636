//! Support code for the data-path benchmarks.
//!
//! - [`null_provider`]: verbs objects whose provider operations only count, so sideway's
//!   own cost can be timed on any machine, without a device or rdma-core's libraries.
//! - [`data_path`]: every benchmarked operation twice, over sideway and in C over verbs.h's
//!   inlines (`csrc/`), and the list of pairs the bench targets run.
//! - [`compare`]: interleaved timing of the two sides, for the comparison table.
//! - [`instruction_counts`]: instructions per operation with Valgrind's callgrind, the
//!   committed counts and the check against them (the `instruction-counts` binary).
//! - [`alloc_counter`]: a counting allocator, how "zero allocations per operation" is
//!   checked rather than asserted.
//! - [`null_provider_xrc`]: XRC domains, SRQs and QPs on the null provider, for the tests of
//!   sideway's XRC wrappers.

#![warn(missing_docs)]

pub mod alloc_counter;
pub mod compare;
pub mod data_path;
pub mod instruction_counts;
pub mod null_provider;
pub mod null_provider_dm;
pub mod null_provider_odp;
pub mod null_provider_xrc;
