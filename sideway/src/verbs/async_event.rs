//! Asynchronous device events (`struct ibv_async_event`): port state changes, QP and CQ
//! errors, SRQ limits, read from the device context's async fd.
//!
//! [`DeviceContext::get_async_event`] waits (with an optional timeout, through poll(2) on
//! [`DeviceContext::async_fd`]) and returns a typed [`AsyncEvent`] that names its object:
//! the port number, the sideway [`SharedReceiveQueue`] when it is still alive, the QP
//! number, or the CQ's handle. Each event is copied out and acknowledged
//! (`ibv_ack_async_event`) before it is returned, so no destroy verb ever waits on one.

use std::fmt;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use rdma_mummy_sys as ffi;

use crate::errno::{fresh, from_ret};
pub use crate::fd::EventError;
use crate::fd::{set_nonblocking, wait_readable};
use crate::macros::c_enum;
use crate::verbs::device::DeviceContext;
use crate::verbs::shared_receive_queue::{self, SharedReceiveQueue};

c_enum! {
    /// What happened.
    pub enum AsyncEventKind: "ibv_event_type" {
        /// A CQ overran or its device failed.
        CqErr = ffi::ibv_event_type::IBV_EVENT_CQ_ERR,
        /// A QP hit an error it cannot report in a completion; it is in the error state.
        QpFatal = ffi::ibv_event_type::IBV_EVENT_QP_FATAL,
        /// Invalid request local work queue error.
        QpReqErr = ffi::ibv_event_type::IBV_EVENT_QP_REQ_ERR,
        /// Local access violation error.
        QpAccessErr = ffi::ibv_event_type::IBV_EVENT_QP_ACCESS_ERR,
        /// Communication established (a first packet arrived in RTR).
        CommEst = ffi::ibv_event_type::IBV_EVENT_COMM_EST,
        /// The send queue drained (SQD).
        SqDrained = ffi::ibv_event_type::IBV_EVENT_SQ_DRAINED,
        /// Path migrated.
        PathMig = ffi::ibv_event_type::IBV_EVENT_PATH_MIG,
        /// Path migration failed.
        PathMigErr = ffi::ibv_event_type::IBV_EVENT_PATH_MIG_ERR,
        /// The device failed; the context must be closed.
        DeviceFatal = ffi::ibv_event_type::IBV_EVENT_DEVICE_FATAL,
        /// A port became active.
        PortActive = ffi::ibv_event_type::IBV_EVENT_PORT_ACTIVE,
        /// A port went down.
        PortErr = ffi::ibv_event_type::IBV_EVENT_PORT_ERR,
        /// A port's LID changed.
        LidChange = ffi::ibv_event_type::IBV_EVENT_LID_CHANGE,
        /// A port's P_Key table changed.
        PkeyChange = ffi::ibv_event_type::IBV_EVENT_PKEY_CHANGE,
        /// The subnet manager changed.
        SmChange = ffi::ibv_event_type::IBV_EVENT_SM_CHANGE,
        /// An SRQ failed.
        SrqErr = ffi::ibv_event_type::IBV_EVENT_SRQ_ERR,
        /// Fewer receives than the armed limit are left in an SRQ.
        SrqLimitReached = ffi::ibv_event_type::IBV_EVENT_SRQ_LIMIT_REACHED,
        /// The last WQE of a QP attached to an SRQ was reached.
        QpLastWqeReached = ffi::ibv_event_type::IBV_EVENT_QP_LAST_WQE_REACHED,
        /// The subnet manager asks clients to register again.
        ClientReregister = ffi::ibv_event_type::IBV_EVENT_CLIENT_REREGISTER,
        /// A port's GID table changed.
        GidChange = ffi::ibv_event_type::IBV_EVENT_GID_CHANGE,
        /// A work queue failed.
        WqFatal = ffi::ibv_event_type::IBV_EVENT_WQ_FATAL,
    }
}

impl fmt::Display for AsyncEventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // SAFETY: ibv_event_type_str accepts any value and returns a static string.
        let text = unsafe { ffi::ibv_event_type_str(u32::from(*self)) };
        if text.is_null() {
            return write!(f, "event {}", u32::from(*self));
        }
        // SAFETY: non-NULL static NUL-terminated string.
        let text = unsafe { std::ffi::CStr::from_ptr(text) }.to_string_lossy();
        write!(f, "{text}")
    }
}

/// The object an async event is about.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum AsyncEventObject {
    /// A port (port events).
    Port(u8),
    /// A queue pair, by number.
    QueuePair {
        /// The QP number.
        qp_num: u32,
    },
    /// A completion queue, by its kernel handle.
    CompletionQueue {
        /// The CQ's handle (`ibv_cq.handle`).
        handle: u32,
    },
    /// A shared receive queue of this crate that is still alive.
    SharedReceiveQueue(Arc<SharedReceiveQueue>),
    /// A shared receive queue that is being dropped, or not made by this crate.
    SrqHandle(u32),
    /// A work queue, by number.
    WorkQueue {
        /// The WQ number.
        wq_num: u32,
    },
    /// The whole device.
    Device,
}

/// One async event, already acknowledged.
#[doc(alias = "ibv_async_event")]
#[derive(Debug, Clone)]
pub struct AsyncEvent {
    kind: AsyncEventKind,
    object: AsyncEventObject,
}

impl AsyncEvent {
    /// What happened.
    pub fn kind(&self) -> AsyncEventKind {
        self.kind
    }

    /// What it happened to.
    pub fn object(&self) -> &AsyncEventObject {
        &self.object
    }

    /// The SRQ it names, when it names a live sideway SRQ.
    pub fn srq(&self) -> Option<&Arc<SharedReceiveQueue>> {
        match &self.object {
            AsyncEventObject::SharedReceiveQueue(s) => Some(s),
            _ => None,
        }
    }
}

impl fmt::Display for AsyncEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on ", self.kind)?;
        match &self.object {
            AsyncEventObject::Port(p) => write!(f, "port {p}"),
            AsyncEventObject::QueuePair { qp_num } => write!(f, "QP {qp_num:#x}"),
            AsyncEventObject::CompletionQueue { handle } => write!(f, "CQ {handle:#x}"),
            AsyncEventObject::SharedReceiveQueue(s) => write!(f, "SRQ {:#x}", s.handle()),
            AsyncEventObject::SrqHandle(h) => write!(f, "SRQ {h:#x}"),
            AsyncEventObject::WorkQueue { wq_num } => write!(f, "WQ {wq_num:#x}"),
            AsyncEventObject::Device => f.write_str("the device"),
        }
    }
}

const ASYNC: &str = "an async event";

/// The context's **async event** descriptor (`ibv_context.async_fd`), as
/// [`DeviceContext::async_fd`]: readable when an async event (port change, QP or CQ error,
/// SRQ limit) is waiting. It is the one descriptor of a context worth watching; the
/// context's command descriptor (`cmd_fd`) is libibverbs' own and is not exposed. Register
/// it with poll(2), epoll, mio or tokio's `AsyncFd` (an `Arc<DeviceContext>` is `AsFd`
/// too), then take the events with [`DeviceContext::try_get_async_event`]; never read the
/// descriptor itself.
///
/// ```no_run
/// use std::os::fd::{AsFd, AsRawFd};
/// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let ctx = sideway::open_device(None)?;
/// let mut fds = [libc::pollfd {
///     fd: ctx.as_fd().as_raw_fd(),
///     events: libc::POLLIN,
///     revents: 0,
/// }];
/// // SAFETY: fds is one valid pollfd.
/// if unsafe { libc::poll(fds.as_mut_ptr(), 1, 1000) } > 0 {
///     while let Some(event) = ctx.try_get_async_event()? {
///         println!("{}: {event:?}", ctx.name());
///     }
/// }
/// # Ok(()) }
/// ```
impl AsFd for DeviceContext {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: async_fd is open for as long as the context is (ibv_close_device in Drop
        // closes it), which outlives the borrow of self.
        unsafe { BorrowedFd::borrow_raw(self.async_fd()) }
    }
}

/// The async event descriptor; see the [`AsFd`] implementation.
impl AsRawFd for DeviceContext {
    fn as_raw_fd(&self) -> RawFd {
        self.async_fd()
    }
}

impl DeviceContext {
    /// The async event file descriptor (`ibv_context.async_fd`), for poll/epoll. Reading
    /// it directly is not allowed; call [`get_async_event`](Self::get_async_event) when it
    /// is readable. This crate sets it non-blocking. The context is also [`AsFd`] and
    /// [`AsRawFd`], with this descriptor.
    pub fn async_fd(&self) -> RawFd {
        // SAFETY: the context is open; async_fd is set at open and never changes.
        unsafe { (*self.as_raw()).async_fd }
    }

    /// Waits for the next async event (`ibv_get_async_event`, then `ibv_ack_async_event`)
    /// for at most `timeout` (`None`: for ever). A timeout is
    /// [`EventError::Timeout`].
    #[doc(alias = "ibv_get_async_event")]
    #[doc(alias = "ibv_ack_async_event")]
    pub fn get_async_event(&self, timeout: Option<Duration>) -> Result<AsyncEvent, EventError> {
        let fd = self.async_fd();
        set_nonblocking(fd, ASYNC)?;
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        loop {
            if let Some(ev) = self.try_get_async_event()? {
                return Ok(ev);
            }
            let left = deadline.map(|d| d.saturating_duration_since(std::time::Instant::now()));
            if left == Some(Duration::ZERO) || !wait_readable(fd, left, ASYNC)? {
                return Err(EventError::Timeout {
                    what: ASYNC,
                    timeout: timeout.unwrap_or_default(),
                });
            }
        }
    }

    /// Returns the next async event if one is pending, `None` if not; never waits.
    #[doc(alias = "ibv_get_async_event")]
    pub fn try_get_async_event(&self) -> Result<Option<AsyncEvent>, EventError> {
        set_nonblocking(self.async_fd(), ASYNC)?;
        let mut raw = MaybeUninit::<ffi::ibv_async_event>::zeroed();
        // SAFETY: the context is open; raw is a valid out-parameter.
        let ret = fresh(|| unsafe { ffi::ibv_get_async_event(self.as_raw(), raw.as_mut_ptr()) });
        if let Err(source) = from_ret(ret) {
            if source.kind() == io::ErrorKind::WouldBlock {
                return Ok(None);
            }
            return Err(EventError::Call {
                call: "ibv_get_async_event",
                what: ASYNC,
                source,
            });
        }
        // SAFETY: the verb succeeded and filled the event (zeroed before, so fully init).
        let mut raw = unsafe { raw.assume_init() };
        // SAFETY: the event is not yet acknowledged, so the object it names is alive
        // (its destroy verb waits for the acknowledgement); the union member read is the
        // one event_type selects.
        let event = unsafe { copy_event(&raw) };
        // SAFETY: raw came from ibv_get_async_event and is acknowledged once, here.
        unsafe { ffi::ibv_ack_async_event(&mut raw) };
        Ok(Some(event))
    }
}

/// Copies an unacknowledged event out.
///
/// # Safety
///
/// `raw` came from `ibv_get_async_event` and is not yet acknowledged.
unsafe fn copy_event(raw: &ffi::ibv_async_event) -> AsyncEvent {
    use AsyncEventKind as K;
    let kind = AsyncEventKind::from(raw.event_type);
    let el = &raw.element;
    // The caller guarantees the event is live: the object it names stays alive until the
    // acknowledgement. Each arm reads the union member its event type uses.
    let object = match kind {
        K::CqErr => {
            // SAFETY: as above; a CQ event carries a live CQ.
            let handle = unsafe { (*el.cq).handle };
            AsyncEventObject::CompletionQueue { handle }
        }
        K::QpFatal
        | K::QpReqErr
        | K::QpAccessErr
        | K::CommEst
        | K::SqDrained
        | K::PathMig
        | K::PathMigErr
        | K::QpLastWqeReached => {
            // SAFETY: as above; a QP event carries a live QP.
            let qp_num = unsafe { (*el.qp).qp_num };
            AsyncEventObject::QueuePair { qp_num }
        }
        K::SrqErr | K::SrqLimitReached => {
            // SAFETY: as above; an SRQ event carries a live SRQ.
            let srq = unsafe { el.srq };
            match shared_receive_queue::lookup(srq) {
                Some(s) => AsyncEventObject::SharedReceiveQueue(s),
                // SAFETY: as above.
                None => AsyncEventObject::SrqHandle(unsafe { (*srq).handle }),
            }
        }
        K::WqFatal => {
            // SAFETY: as above; a WQ event carries a live WQ.
            let wq_num = unsafe { (*el.wq).wq_num };
            AsyncEventObject::WorkQueue { wq_num }
        }
        K::PortActive
        | K::PortErr
        | K::LidChange
        | K::PkeyChange
        | K::SmChange
        | K::ClientReregister
        | K::GidChange => {
            // SAFETY: as above; a port event carries the port number.
            let port = unsafe { el.port_num };
            AsyncEventObject::Port(u8::try_from(port).unwrap_or(0))
        }
        K::DeviceFatal | K::Unknown(_) => AsyncEventObject::Device,
    };
    AsyncEvent { kind, object }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_kinds_survive() {
        assert_eq!(AsyncEventKind::from(15), AsyncEventKind::SrqLimitReached);
        assert!(matches!(AsyncEventKind::from(999), AsyncEventKind::Unknown(v) if v.get() == 999));
    }

    #[test]
    fn timeouts_are_typed() {
        let e = EventError::Timeout {
            what: ASYNC,
            timeout: Duration::from_millis(50),
        };
        assert_eq!(
            e.to_string(),
            "waited 50ms for an async event, and none arrived"
        );
    }
}
