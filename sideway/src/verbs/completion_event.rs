//! Completion events: sleeping until a completion queue has work, instead of spinning.
//!
//! A [`CompletionChannel`] may serve many CQs (each created with
//! [`CompletionQueueBuilder::channel`](crate::completion_queue::CompletionQueueBuilder::channel)).
//! Arm a CQ with [`CompletionQueue::req_notify`]; [`CompletionChannel::get_cq_event`] then waits
//! (with an optional timeout, through poll(2) on [`CompletionChannel::fd`]) and hands back the
//! sideway CQ that fired, as an `Arc`. Poll that CQ, and arm it again before sleeping next.
//!
//! Acknowledgement (`ibv_ack_cq_events`) is the crate's job: each CQ counts the events it
//! was handed and acknowledges them in batches, and all that are left before it is
//! destroyed (`ibv_destroy_cq` would otherwise wait for ever).

use std::os::raw::c_void;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_mummy_sys as ffi;

use crate::errno::{fresh, from_ret};
use crate::fd::{wait_readable, EventError};
use crate::verbs::completion_channel::CompletionChannel;
use crate::verbs::completion_queue::CompletionQueue;

/// Events acknowledged at once: `ibv_ack_cq_events` takes a lock, so it is not called per
/// event.
const ACK_BATCH: u32 = 64;

const COMPLETION: &str = "a completion event";

impl CompletionChannel {
    /// Waits for the next completion event (`ibv_get_cq_event`) for at most `timeout`
    /// (`None`: for ever) and returns the CQ that fired. Its notification is then disarmed:
    /// poll it, and call [`CompletionQueue::req_notify`] before waiting again. A timeout is
    /// [`EventError::Timeout`].
    #[doc(alias = "ibv_get_cq_event")]
    pub fn get_cq_event(
        &self,
        timeout: Option<Duration>,
    ) -> Result<Arc<CompletionQueue>, EventError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(cq) = self.try_get_cq_event()? {
                return Ok(cq);
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left == Some(Duration::ZERO) || !wait_readable(self.fd(), left, COMPLETION)? {
                return Err(EventError::Timeout {
                    what: COMPLETION,
                    timeout: timeout.unwrap_or_default(),
                });
            }
        }
    }

    /// Returns the CQ of the next completion event if one is waiting, `None` if not
    /// (`ibv_get_cq_event` on the non-blocking fd); never waits.
    #[doc(alias = "ibv_get_cq_event")]
    pub fn try_get_cq_event(&self) -> Result<Option<Arc<CompletionQueue>>, EventError> {
        // The descriptor is non-blocking since the channel was created.
        loop {
            let mut cq: *mut ffi::ibv_cq = std::ptr::null_mut();
            let mut context: *mut c_void = std::ptr::null_mut();
            // SAFETY: the channel is live; cq and context are valid out-parameters.
            let ret =
                fresh(|| unsafe { ffi::ibv_get_cq_event(self.as_raw(), &mut cq, &mut context) });
            if let Err(source) = from_ret(ret) {
                if source.kind() == std::io::ErrorKind::WouldBlock {
                    return Ok(None);
                }
                return Err(EventError::Call {
                    call: "ibv_get_cq_event",
                    what: COMPLETION,
                    source,
                });
            }
            // Only CQs register with a channel, so the downcast cannot fail; were it to, the
            // event is acknowledged like that of a CQ being dropped.
            let found = self
                .cqs
                .find(cq)
                .and_then(|any| any.downcast::<CompletionQueue>().ok());
            match found {
                Some(found) => {
                    found.count_event();
                    return Ok(Some(found));
                }
                None => {
                    // The CQ is being dropped: its destroy waits for this event's
                    // acknowledgement, so cq is still valid; acknowledge it and go on.
                    // SAFETY: as just said; one event, received above.
                    unsafe { ffi::ibv_ack_cq_events(cq, 1) };
                }
            }
        }
    }
}

impl CompletionQueue {
    /// Arms the CQ (`ibv_req_notify_cq`): the next completion (with `solicited_only`, the
    /// next solicited or failed one) raises one event on the CQ's channel. Arm, then poll
    /// once more before sleeping, or a completion that came in between is missed.
    #[doc(alias = "ibv_req_notify_cq")]
    pub fn req_notify(&self, solicited_only: bool) -> Result<(), EventError> {
        // SAFETY: the CQ is live.
        let ret =
            fresh(|| unsafe { ffi::ibv_req_notify_cq(self.as_raw(), i32::from(solicited_only)) });
        from_ret(ret).map_err(|source| EventError::Call {
            call: "ibv_req_notify_cq",
            what: COMPLETION,
            source,
        })
    }

    /// Acknowledges now (`ibv_ack_cq_events`) the events this CQ was handed; otherwise
    /// that happens every 64 events and when the CQ is dropped.
    #[doc(alias = "ibv_ack_cq_events")]
    pub fn ack_events(&self) {
        let n = self.unacked_events.swap(0, Ordering::AcqRel);
        if n > 0 {
            // SAFETY: the CQ is live; n events were handed out and not acknowledged.
            unsafe { ffi::ibv_ack_cq_events(self.as_raw(), n) };
        }
    }

    /// Events handed out and not yet acknowledged.
    pub fn unacked_events(&self) -> u32 {
        self.unacked_events.load(Ordering::Acquire)
    }

    fn count_event(&self) {
        if self.unacked_events.fetch_add(1, Ordering::AcqRel) + 1 >= ACK_BATCH {
            self.ack_events();
        }
    }
}
