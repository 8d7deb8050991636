//! Queue pairs (`struct ibv_qp`, `struct ibv_qp_ex`): creating them, moving them through
//! their states, connecting two of them, and posting work requests.
//!
//! One type, [`QueuePair`], covers the classic QP ([`QueuePairBuilder::build`], posted with
//! one chained `ibv_post_send`) and the extended one ([`QueuePairBuilder::build_ex`], posted
//! with `ibv_wr_start` .. `ibv_wr_complete`): switching is one line. A QP holds the `Arc`s of
//! its protection domain and completion queues, and is itself an owned value: posting takes
//! `&mut self`, so the compiler guarantees one batch at a time per QP.
//!
//! - [`QueuePairAttribute`] sets and reads every `ibv_qp_attr` field; [`QueuePair::modify`]
//!   explains a rejected attribute mask by the IB spec's state table
//!   ([`transition_rule`]).
//! - [`QueuePair::connect`] takes a QP from Reset to RTS in one call, given the peer's
//!   [`Endpoint`] and [`ConnectOptions`] with sound defaults.
//! - [`QueuePair::start_post_send`] and [`QueuePair::start_post_recv`] hand out guards that
//!   batch work requests and ring one doorbell; see [`PostSendGuard`].
//!
//! ```no_run
//! use sideway::queue_pair::{ConnectOptions, SendFlags};
//! let ctx = sideway::open_device(None)?;
//! let pd = ctx.alloc_pd()?;
//! let cq = ctx.create_cq_builder().build()?;
//! let mut qp = pd.create_qp_builder().send_cq(&cq).recv_cq(&cq).build()?;
//! let opts = ConnectOptions::new();
//! let me = qp.local_endpoint(&opts)?; // send this to the peer, receive theirs
//! # let peer = me;
//! qp.connect(&opts, &peer)?;
//! let buf = pd.reg_buffer(4096, sideway::memory_region::AccessFlags::LOCAL_WRITE)?;
//! let mut batch = qp.start_post_send();
//! batch
//!     .wr(1, SendFlags::SIGNALED)
//!     .rdma_write(0x1234 /* peer's rkey */, 0x1000 /* peer's address */, buf.sge(0..64).unwrap());
//! batch.post()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#[allow(unsafe_code)]
mod attr;
#[allow(unsafe_code)]
mod bind_mw;
#[allow(unsafe_code)]
mod data_in_order;
#[allow(unsafe_code)]
mod ece;
mod error;
#[allow(unsafe_code)]
mod qp;
#[allow(unsafe_code)]
mod recv;
#[allow(unsafe_code)]
mod send;
mod state_table;
#[allow(unsafe_code)]
pub(crate) mod work_request;
#[allow(unsafe_code)]
mod xrc;

pub use crate::receive_batch::{ReceiveQueue, RecvBatch, RecvChain};
pub use crate::scatter_gather::{BufferBytes, SendData};
pub use attr::{MigState, QpAttrMask, QpCapabilities, QpState, QpType, QueuePairAttribute};
pub use data_in_order::{DataInOrderCaps, DataInOrderFlags, DataInOrderOp};
pub use ece::{Ece, EceError};
pub use error::{ConnectError, ModifyQpError, QueryQpError, QueuePairError};
pub use qp::*;
pub use recv::{PostRecvChain, PostRecvGuard};
pub use send::{PostSendChain, PostSendGuard, WorkRequestBuilder};
pub use state_table::{diagnose, transition_rule, MaskDiagnosis, TransitionRule};
pub use work_request::{InvalidWorkRequest, PostError, SendFlags, SendOpsFlags};
pub use xrc::XrcRecvQueuePair;
