//! Shared pieces of the example programs.
//!
//! The binaries in this crate are wire-compatible with rdma-core's programs of the same name;
//! what they exchange on the wire lives here, once, so every program speaks it the same way.
//! So do the edges every program shares ([`cli`]: picking devices, exit statuses) and the way
//! the device tools spell what a device reports ([`device_text`]). Peer text is made safe to
//! print by [`sideway::peer_text`].

#![warn(missing_docs)]
#![deny(unsafe_code)]

pub mod cli;
pub mod cm_connection;
pub mod cmtime_wire;
pub mod device_text;
pub mod pingpong;
pub mod rping_wire;
pub mod xsrq_wire;
