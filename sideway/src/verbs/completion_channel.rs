//! Completion event channels (`struct ibv_comp_channel`): the descriptor a thread sleeps on
//! until a completion queue has work, and the registry of the CQs made with it. Below the
//! completion queue, which holds its channel's `Arc`; waiting for an event and arming a CQ
//! are in `completion_event`, above both.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use rdma_mummy_sys as ffi;

use crate::errno::{fresh, from_ret, non_null};
use crate::fd::{set_nonblocking, EventError};
use crate::verbs::completion_queue::error::CompletionQueueError;
use crate::verbs::device::DeviceContext;

/// A completion event channel (`struct ibv_comp_channel`): completion queues created with it
/// can wake a sleeping thread instead of being spun on. One channel may serve many CQs; its
/// descriptor plugs into poll/epoll (it is [`AsFd`](std::os::fd::AsFd)).
///
/// ```no_run
/// # fn demo() -> Result<(), sideway::Report> {
/// use std::time::Duration;
/// let ctx = sideway::open_device(None)?;
/// let channel = ctx.create_comp_channel()?;
/// let cq = ctx.create_cq_builder().cqe(256).channel(&channel).build()?;
/// // ... create QPs on cq and post ...
/// cq.req_notify(false)?; // arm, then look once more before sleeping
/// let mut done = cq.poll()?.count();
/// while done == 0 {
///     let fired = channel.get_cq_event(Some(Duration::from_secs(5)))?; // sleeps
///     fired.req_notify(false)?;
///     for wc in fired.poll()? {
///         wc.ok()?;
///         done += 1;
///     }
/// }
/// # Ok(()) }
/// ```
#[doc(alias = "ibv_comp_channel")]
pub struct CompletionChannel {
    raw: NonNull<ffi::ibv_comp_channel>,
    ctx: Arc<DeviceContext>,
    /// The CQs created with this channel, so an event hands back the sideway CQ.
    pub(crate) cqs: ChannelCqs,
}

// SAFETY: a completion channel is a file descriptor wrapper; libibverbs allows its use from
// any thread.
unsafe impl Send for CompletionChannel {}
// SAFETY: as above.
unsafe impl Sync for CompletionChannel {}

impl DeviceContext {
    /// Creates a completion event channel (`ibv_create_comp_channel`).
    #[doc(alias = "ibv_create_comp_channel")]
    pub fn create_comp_channel(
        self: &Arc<Self>,
    ) -> Result<Arc<CompletionChannel>, CompletionQueueError> {
        // SAFETY: the context is open.
        let ch = fresh(|| unsafe { ffi::ibv_create_comp_channel(self.as_raw()) });
        let raw = non_null(ch).map_err(|source| CompletionQueueError::CreateChannel {
            device: self.name().to_owned(),
            source,
        })?;
        let channel = CompletionChannel {
            raw,
            ctx: Arc::clone(self),
            cqs: Default::default(),
        };
        // Non-blocking from the start, once: taking an event then never sleeps past a
        // poll(2) deadline, and costs no fcntl per call (a wait that looks at the channel
        // on every sleep paid one or two). Dropping `channel` on failure destroys it.
        set_nonblocking(channel.fd(), "a completion event").map_err(|e| {
            CompletionQueueError::CreateChannel {
                device: self.name().to_owned(),
                source: match e {
                    EventError::Call { source, .. } => source,
                    EventError::Timeout { .. } => std::io::Error::other(e.to_string()),
                },
            }
        })?;
        Ok(Arc::new(channel))
    }
}

impl CompletionChannel {
    /// The channel's file descriptor (`ibv_comp_channel.fd`), for poll/epoll: readable
    /// when an event is waiting. This crate sets it non-blocking when it creates the channel
    /// (clearing `O_NONBLOCK` on it makes [`try_get_cq_event`](Self::try_get_cq_event)
    /// block until an event comes); do not read it, call
    /// [`get_cq_event`](Self::get_cq_event) or [`try_get_cq_event`](Self::try_get_cq_event).
    /// The channel is also [`AsFd`] and [`AsRawFd`], with this descriptor.
    pub fn fd(&self) -> RawFd {
        // SAFETY: the channel is live; fd is set at creation and never changes.
        unsafe { (*self.as_raw()).fd }
    }

    /// The raw channel, valid while this channel is alive.
    pub fn as_raw(&self) -> *mut ffi::ibv_comp_channel {
        self.raw.as_ptr()
    }

    /// The device context.
    pub fn context(&self) -> &Arc<DeviceContext> {
        &self.ctx
    }
}

impl Drop for CompletionChannel {
    fn drop(&mut self) {
        // SAFETY: every CQ using the channel holds an Arc of it, so none is left.
        let ret = fresh(|| unsafe { ffi::ibv_destroy_comp_channel(self.raw.as_ptr()) });
        if let Err(e) = from_ret(ret) {
            crate::diagnostics::report_drop_failure(
                "ibv_destroy_comp_channel",
                "a completion channel",
                &e,
            );
        }
    }
}

impl fmt::Debug for CompletionChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionChannel")
            .field("device", &self.ctx.name())
            .finish()
    }
}

/// The CQs of one channel, by address, each as `Weak<dyn Any>`: the channel sits below the
/// completion queue (which holds the channel's `Arc`), so it keeps them without naming
/// their type; `completion_event` hands a fired one back as the `CompletionQueue` it is.
#[derive(Default)]
pub(crate) struct ChannelCqs(Mutex<HashMap<usize, Weak<dyn Any + Send + Sync>>>);

impl ChannelCqs {
    fn lock(&self) -> MutexGuard<'_, HashMap<usize, Weak<dyn Any + Send + Sync>>> {
        // Single inserts and removes leave the map consistent even after a panic.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers the CQ at `raw`, made with this channel.
    pub(crate) fn register(&self, raw: *mut ffi::ibv_cq, cq: Weak<dyn Any + Send + Sync>) {
        self.lock().insert(raw as usize, cq);
    }

    /// The live CQ at `raw`, if it is still registered and not being dropped.
    pub(crate) fn find(&self, raw: *mut ffi::ibv_cq) -> Option<Arc<dyn Any + Send + Sync>> {
        self.lock().get(&(raw as usize)).and_then(Weak::upgrade)
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
        lends_its_fd::<crate::device::DeviceContext>();
        lends_its_fd::<Arc<crate::device::DeviceContext>>();
        lends_its_fd::<crate::rdmacm::EventChannel>();
        lends_its_fd::<Arc<crate::rdmacm::EventChannel>>();
    }
}
