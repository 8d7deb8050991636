//! Completion queues (`struct ibv_cq`, `struct ibv_cq_ex`) and the completions they report.
//!
//! One type, [`CompletionQueue`], covers the classic CQ ([`CompletionQueueBuilder::build`],
//! polled with `ibv_poll_cq`) and the extended one ([`CompletionQueueBuilder::build_ex`],
//! polled with `ibv_start_poll`/`ibv_next_poll`/`ibv_end_poll`, with optional fields such as
//! hardware timestamps, read through [`Poller::completion_timestamp`]): switching is one
//! line, and everything downstream (queue pairs, pollers) takes either.
//!
//! Polling never allocates. [`CompletionQueue::poll`] hands out a [`Poller`], an iterator of
//! [`WorkCompletion`] values; [`CompletionQueue::poll_into`] fills a caller's slice. A loop
//! that polls one CQ again and again claims it once ([`CompletionQueue::claim`]) and polls the
//! [`ClaimedCq`]: an extended CQ then pays its one-poller-at-a-time check once, not per poll.
//!
//! Files: `error.rs` (the error), `poll.rs` (polling and [`Poller`]), `cq.rs` (the queue,
//! its builder and [`ClaimedCq`]). The channel a CQ may wake is
//! [`completion_channel`](crate::completion_channel); waiting on it is
//! [`completion_event`](crate::completion_event).

#[allow(unsafe_code)]
mod cq;
pub(crate) mod error;
#[allow(unsafe_code)]
mod poll;

pub use crate::work_completion::{
    WcFlags, WcOpcode, WcStatus, WorkCompletion, WorkCompletionError,
};
pub use cq::{ClaimedCq, CompletionQueue, CompletionQueueBuilder};
pub use error::CompletionQueueError;
pub use poll::{Poller, WcFlagsEx};
