//! What two programs need around a connection, beyond the verbs themselves: telling each other
//! where their queue pairs are, telling each other where their buffers are, and waiting for
//! the completion of one work request while others complete too.
//!
//! - [`Endpoint`](crate::Endpoint)'s text and byte forms, and rdma-core's pingpong line, in
//!   [`endpoint`]; the TCP exchange of endpoints that `ibv_rc_pingpong` and its kin speak,
//!   in [`exchange`].
//! - [`RemoteBuffer`]: a buffer's address, rkey and length in 16 bytes, as rdma-core's
//!   `rping` sends them and as private data of `rdma_connect`/`rdma_accept` carries them.
//! - [`CompletionWaiter`]: waits for given `wr_id`s on a CQ, keeping completions of other
//!   work requests for a later wait, by polling or through a completion channel.
//!
//! # When the peer leaves
//!
//! Nothing on the CQ says that the peer left: its QP going away raises no completion here,
//! and a wait for a message it will never send simply runs into its timeout (or, with
//! [`CompletionWaiter::NO_TIMEOUT`], never ends). With rdma_cm, the news comes on the
//! connection's event channel instead: an [`EventType::Disconnected`](crate::rdmacm::EventType::Disconnected)
//! event (`RDMA_CM_EVENT_DISCONNECTED`) for its id, once the peer called `rdma_disconnect`,
//! exited, or was cut off. A program that waits for completions and must also notice the
//! peer leaving asks the channel while it waits: [`CompletionWaiter::wait_all_unless`] calls
//! its `stop` whenever the CQ is idle, and `stop` reads the channel without blocking
//! ([`EventChannel::try_get_event`](crate::rdmacm::EventChannel::try_get_event)). Answer
//! the peer's disconnect with [`CmId::disconnect`](crate::rdmacm::CmId::disconnect), as
//! rdma_cm expects. (With a TCP exchange of endpoints instead, as the pingpongs do, there is
//! no such event: a side learns it only from a timeout or a failed completion.)
//!
//! ```no_run
//! use std::sync::Arc;
//! use sideway::connection::{CompletionWaiter, WaitError};
//! use sideway::rdmacm::{CmError, CmId, EventChannel, EventType};
//! use sideway::WorkCompletion;
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
//! This module uses the verbs objects and the QP's [`Endpoint`](crate::Endpoint); nothing
//! below it uses this module.

pub mod endpoint;
pub mod exchange;
pub mod private_data;
pub mod wait;

pub use endpoint::{EndpointError, ENDPOINT_BYTES_LEN, ENDPOINT_BYTES_VERSION, PINGPONG_LINE_LEN};
pub use exchange::ExchangeError;
pub use private_data::{RemoteBuffer, RemoteBufferError, REMOTE_BUFFER_LEN};
pub use wait::{CompletionWaiter, WaitError};
