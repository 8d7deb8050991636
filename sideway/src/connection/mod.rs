//! What two programs need around a connection, beyond the verbs themselves: telling each other
//! where their queue pairs are, telling each other where their buffers are, and waiting for
//! the completion of one work request while others complete too.
//!
//! - [`Endpoint`]'s text and byte forms, and rdma-core's pingpong line (below); the TCP
//!   exchange of endpoints that `ibv_rc_pingpong` and its kin speak, in [`exchange`].
//! - [`RemoteBuffer`]: a buffer's address, rkey and length in 16 bytes, as rdma-core's
//!   `rping` sends them and as private data of `rdma_connect`/`rdma_accept` carries them.
//! - [`CompletionWaiter`]: waits for given `wr_id`s on a CQ, keeping completions of other
//!   work requests for a later wait, by polling or through a completion channel.
//!
//! # Endpoints as text and bytes
//!
//! **Text** ([`Display`](std::fmt::Display) and [`FromStr`](std::str::FromStr)): `LID:QPN:PSN:GID`
//! as rdma-core's `ibv_rc_pingpong` prints it (`%04x:%06x:%06x:%s`): the LID in 4 hex digits, the
//! QP number and PSN in 6 (24 bits each), and the GID in 32 hex digits in wire (network) order,
//! e.g. `0000:000123:abcdef:00000000000000000000ffffc6120001`. Parsing takes either case and
//! exactly these widths.
//!
//! **Pingpong line** ([`Endpoint::to_pingpong_line`], [`Endpoint::from_pingpong_line`]): the
//! text followed by a NUL, [`PINGPONG_LINE_LEN`] (52) bytes, which rdma-core's
//! `ibv_*_pingpong` programs send over TCP; [`exchange`] speaks their whole exchange.
//!
//! **Bytes** ([`Endpoint::to_bytes`], [`Endpoint::from_bytes`]): a fixed layout of
//! [`ENDPOINT_BYTES_LEN`] (28) bytes for programs that send endpoints in binary (as private
//! data, in a file, in their own protocol):
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 1 | version, [`ENDPOINT_BYTES_VERSION`] (1) |
//! | 1 | 1 | reserved, 0 |
//! | 2 | 2 | LID, big-endian |
//! | 4 | 4 | QP number, big-endian (24 bits used) |
//! | 8 | 4 | PSN, big-endian (24 bits used) |
//! | 12 | 16 | GID, wire order |
//!
//! A later layout gets a new version number; this one stays readable.
//!
//! ```
//! use sideway::gid::Gid;
//! use sideway::queue_pair::Endpoint;
//!
//! let ep = Endpoint { lid: 0, qp_num: 0x123, psn: 0xabcdef, gid: "::ffff:198.18.0.1".parse()? };
//! let text = ep.to_string();
//! assert_eq!(text, "0000:000123:abcdef:00000000000000000000ffffc6120001");
//! assert_eq!(text.parse::<Endpoint>()?, ep);
//! assert_eq!(Endpoint::from_bytes(&ep.to_bytes()?)?, ep);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # When the peer leaves
//!
//! Nothing on the CQ says that the peer left: its QP going away raises no completion here,
//! and a wait for a message it will never send simply runs into its timeout (or, with
//! [`CompletionWaiter::NO_TIMEOUT`], never ends). With rdma_cm, the news comes on the
//! connection's event channel instead: an
//! [`EventType::Disconnected`](crate::rdmacm::EventType::Disconnected) event
//! (`RDMA_CM_EVENT_DISCONNECTED`) for its id, once the peer called `rdma_disconnect`, exited, or
//! was cut off. A program that waits for completions and must also notice the peer leaving asks the
//! channel while it waits: [`CompletionWaiter::wait_all_unless`] calls its `stop` whenever the CQ
//! is idle, and `stop` reads the channel without blocking
//! ([`EventChannel::try_get_event`](crate::rdmacm::EventChannel::try_get_event)). Answer the peer's
//! disconnect with [`CmId::disconnect`](crate::rdmacm::CmId::disconnect), as rdma_cm expects. (With
//! a TCP exchange of endpoints instead, as the pingpongs do, there is no such event: a side learns
//! it only from a timeout or a failed completion.)
//!
//! ```no_run
//! use std::sync::Arc;
//! use sideway::connection::{CompletionWaiter, WaitError};
//! use sideway::rdmacm::{CmError, CmId, EventChannel, EventType};
//! use sideway::completion_queue::WorkCompletion;
//!
//! #[derive(Debug)]
//! enum Stop {
//!     Wait(WaitError),
//!     Cm(CmError),
//! }
//! impl From<WaitError> for Stop {
//!     fn from(e: WaitError) -> Self {
//!         Stop::Wait(e)
//!     }
//! }
//!
//! /// The completion of `wr_id`, or `None` when the peer left first.
//! fn wait_unless_peer_left(
//!     waiter: &mut CompletionWaiter,
//!     channel: &EventChannel,
//!     id: &Arc<CmId>,
//!     wr_id: u64,
//! ) -> Result<Option<WorkCompletion>, Stop> {
//!     let got = waiter.wait_all_unless(&[wr_id], || {
//!         let left = match channel.try_get_event().map_err(Stop::Cm)? {
//!             Some(event) => {
//!                 Arc::ptr_eq(event.id(), id) && event.event_type() == EventType::Disconnected
//!             }
//!             None => false,
//!         };
//!         Ok::<bool, Stop>(left)
//!     })?;
//!     Ok(got.map(|mut wcs| wcs.remove(0)))
//! }
//! ```
//!
//! Every decoder here takes bytes from a peer: none panics, and every error is safe to
//! print (peer text goes through [`crate::peer_text::printable`]). They are fuzzed in
//! `sideway/tests/fuzz_decoders.rs`.
//!
//! This module uses the verbs objects and the QP's [`Endpoint`](crate::queue_pair::Endpoint);
//! nothing below it uses this module.
//!
//! [`Endpoint`]: crate::queue_pair::Endpoint
//! [`Endpoint::to_pingpong_line`]: crate::queue_pair::Endpoint::to_pingpong_line
//! [`Endpoint::from_pingpong_line`]: crate::queue_pair::Endpoint::from_pingpong_line
//! [`Endpoint::to_bytes`]: crate::queue_pair::Endpoint::to_bytes
//! [`Endpoint::from_bytes`]: crate::queue_pair::Endpoint::from_bytes

mod endpoint;
pub mod exchange;
mod private_data;
mod wait;

pub use endpoint::{EndpointError, ENDPOINT_BYTES_LEN, ENDPOINT_BYTES_VERSION, PINGPONG_LINE_LEN};

pub use private_data::{RemoteBuffer, RemoteBufferError, REMOTE_BUFFER_LEN};
pub use wait::{CompletionWaiter, WaitError};
