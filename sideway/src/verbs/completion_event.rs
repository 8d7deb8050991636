//! Completion events: sleeping until a completion queue has work, instead of spinning.
//!
//! A [`CompletionChannel`] may serve many CQs (each created with
//! [`CompletionQueueBuilder::channel`](crate::CompletionQueueBuilder::channel)). Arm a CQ with
//! [`CompletionQueue::req_notify`]; [`CompletionChannel::get_cq_event`] then waits (with an
//! optional timeout, through poll(2) on [`CompletionChannel::fd`]) and hands back the
//! sideway CQ that fired, as an `Arc`. Poll that CQ, and arm it again before sleeping next.
//!
//! Acknowledgement (`ibv_ack_cq_events`) is the crate's job: each CQ counts the events it
//! was handed and acknowledges them in batches, and all that are left before it is
//! destroyed (`ibv_destroy_cq` would otherwise wait for ever).

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::os::raw::c_void;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use rdma_mummy_sys as ffi;

use crate::errno::{fresh, from_ret};
use crate::fd::{set_nonblocking, wait_readable, EventError};
use crate::verbs::completion_queue::{CompletionChannel, CompletionQueue};

/// Events acknowledged at once: `ibv_ack_cq_events` takes a lock, so it is not called per
/// event.
const ACK_BATCH: u32 = 64;

const COMPLETION: &str = "a completion event";

/// The CQs of one channel, by address.
#[derive(Default)]
pub(crate) struct ChannelCqs(Mutex<HashMap<usize, Weak<CompletionQueue>>>);

impl ChannelCqs {
    fn lock(&self) -> MutexGuard<'_, HashMap<usize, Weak<CompletionQueue>>> {
        // Single inserts and removes leave the map consistent even after a panic.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn register(&self, cq: &Arc<CompletionQueue>) {
        self.lock().insert(cq.as_raw() as usize, Arc::downgrade(cq));
    }
}

/// Called by the CQ's drop before `ibv_destroy_cq`: forgets the CQ in its channel, then
/// acknowledges every event it was handed.
pub(crate) fn before_destroy(
    raw: *mut ffi::ibv_cq,
    unacked: &AtomicU32,
    channel: Option<&CompletionChannel>,
) {
    if let Some(channel) = channel {
        channel.cqs.lock().remove(&(raw as usize));
    }
    let n = unacked.swap(0, Ordering::AcqRel);
    if n > 0 {
        // SAFETY: raw is the live CQ being dropped; n events were received on it and not
        // yet acknowledged.
        unsafe { ffi::ibv_ack_cq_events(raw, n) };
    }
}

/// The channel's file descriptor (`ibv_comp_channel.fd`), as [`CompletionChannel::fd`]:
/// readable when an event is waiting. Register it with poll(2), epoll, mio or tokio's
/// `AsyncFd` (an `Arc<CompletionChannel>` is `AsFd` too), then take the events with
/// [`CompletionChannel::try_get_cq_event`]; never read the descriptor itself.
///
/// ```no_run
/// use std::os::fd::{AsFd, AsRawFd};
/// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let ctx = sideway::open_device(None)?;
/// let channel = ctx.create_comp_channel()?;
/// let cq = ctx.create_cq_builder().channel(&channel).build()?;
/// cq.req_notify(false)?;
/// // One poll(2) over the channel and, say, a socket: no new dependency needed.
/// let mut fds = [libc::pollfd {
///     fd: channel.as_fd().as_raw_fd(),
///     events: libc::POLLIN,
///     revents: 0,
/// }];
/// // SAFETY: fds is one valid pollfd.
/// let ready = unsafe { libc::poll(fds.as_mut_ptr(), 1, 1000) };
/// if ready > 0 {
///     while let Some(cq) = channel.try_get_cq_event()? {
///         cq.req_notify(false)?; // arm again, then poll the CQ
///         for wc in cq.poll()? {
///             wc.ok()?;
///         }
///     }
/// }
/// # Ok(()) }
/// ```
impl AsFd for CompletionChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the descriptor is open for as long as the channel lives (it is closed by
        // ibv_destroy_comp_channel in Drop), which outlives the borrow of self.
        unsafe { BorrowedFd::borrow_raw(self.fd()) }
    }
}

/// The channel's file descriptor; see the [`AsFd`] implementation.
impl AsRawFd for CompletionChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.fd()
    }
}

impl CompletionChannel {
    /// The channel's file descriptor (`ibv_comp_channel.fd`), for poll/epoll: readable
    /// when an event is waiting. This crate sets it non-blocking; do not read it, call
    /// [`get_cq_event`](Self::get_cq_event) or [`try_get_cq_event`](Self::try_get_cq_event).
    /// The channel is also [`AsFd`] and [`AsRawFd`], with this descriptor.
    pub fn fd(&self) -> RawFd {
        // SAFETY: the channel is live; fd is set at creation and never changes.
        unsafe { (*self.as_raw()).fd }
    }

    /// Waits for the next completion event (`ibv_get_cq_event`) for at most `timeout`
    /// (`None`: for ever) and returns the CQ that fired. Its notification is then disarmed:
    /// poll it, and call [`CompletionQueue::req_notify`] before waiting again. A timeout is
    /// [`EventError::Timeout`].
    #[doc(alias = "ibv_get_cq_event")]
    pub fn get_cq_event(
        &self,
        timeout: Option<Duration>,
    ) -> Result<Arc<CompletionQueue>, EventError> {
        set_nonblocking(self.fd(), COMPLETION)?;
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
        set_nonblocking(self.fd(), COMPLETION)?;
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
            let found = self.cqs.lock().get(&(cq as usize)).and_then(Weak::upgrade);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A compile-time check: every type with a descriptor worth polling lends it the
    /// standard way, also behind the `Arc` the crate hands out.
    #[test]
    fn every_fd_bearing_type_is_as_fd_and_as_raw_fd() {
        fn lends_its_fd<T: AsFd + AsRawFd + ?Sized>() {}
        lends_its_fd::<CompletionChannel>();
        lends_its_fd::<Arc<CompletionChannel>>();
        lends_its_fd::<crate::DeviceContext>();
        lends_its_fd::<Arc<crate::DeviceContext>>();
        lends_its_fd::<crate::rdmacm::EventChannel>();
        lends_its_fd::<Arc<crate::rdmacm::EventChannel>>();
    }
}
