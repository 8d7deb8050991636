//! Fast, safe RDMA in Rust.
//!
//! `sideway` wraps rdma-core's libibverbs and librdmacm (loaded at run time through
//! `rdma-mummy-sys`, so nothing links rdma-core at build time). Every verbs object is owned
//! through an `Arc`, objects with many knobs are made by builders, errors are typed and carry
//! the context a person needs, and the data path costs no more than the C inline functions.
//!
//! The crate grows one verbs object at a time; today it holds the GID type that the device,
//! address-handle and connection layers share.

#![warn(missing_docs)]
#![deny(unsafe_code)]

pub mod gid;

pub use gid::{Gid, ParseGidError};
