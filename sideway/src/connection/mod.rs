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
