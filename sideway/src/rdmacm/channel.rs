//! The event channel (`struct rdma_event_channel`): the descriptor an id's events arrive on,
//! and the lock every call on its ids takes. Creating ids is in `id`, reading events in
//! `event`.

use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::os::raw::c_int;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use rdma_mummy_sys as ffi;

use super::address::Endpoints;
use super::error::{ensure_loaded, CmError};
use crate::errno::{fresh, non_null};

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves no half-updated state behind (they
    // guard C calls, not Rust invariants), so a poisoned lock is still usable.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(super) fn millis(timeout: Duration) -> c_int {
    c_int::try_from(timeout.as_millis()).unwrap_or(c_int::MAX)
}

/// An rdma_cm event channel (`struct rdma_event_channel`): the file descriptor every event of
/// its ids arrives on.
#[doc(alias = "rdma_event_channel")]
pub struct EventChannel {
    raw: NonNull<ffi::rdma_event_channel>,
    /// Serialises every call that reads or writes the fields of this channel's ids; see the
    /// module documentation.
    lock: Mutex<()>,
    /// This channel's own `Arc`, for the ids that connection requests create on it.
    me: Weak<EventChannel>,
}

// SAFETY: the channel is a file descriptor; every librdmacm call that touches it or its ids'
// fields runs under `lock`.
unsafe impl Send for EventChannel {}
// SAFETY: as above.
unsafe impl Sync for EventChannel {}

impl fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventChannel")
            .field("fd", &self.as_raw_fd())
            .finish()
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        // SAFETY: every id of the channel holds an Arc of it, so none is left; the call
        // cannot fail (it closes the descriptor and frees the struct).
        unsafe { ffi::rdma_destroy_event_channel(self.raw.as_ptr()) };
    }
}

impl AsRawFd for EventChannel {
    /// The channel's descriptor, for poll/epoll: readable when an event is waiting. It is in
    /// non-blocking mode; read events with [`EventChannel::try_get_event`](super::EventChannel::try_get_event).
    fn as_raw_fd(&self) -> RawFd {
        // SAFETY: raw is a live channel; fd is a plain field set at creation.
        unsafe { (*self.raw.as_ptr()).fd }
    }
}

impl AsFd for EventChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the descriptor stays open for as long as the channel, which outlives the
        // borrow.
        unsafe { BorrowedFd::borrow_raw(self.as_raw_fd()) }
    }
}

impl EventChannel {
    /// Opens an event channel (`rdma_create_event_channel`) and puts its descriptor in
    /// non-blocking mode, so waiting happens in [`get_event`](Self::get_event)'s `poll`.
    #[doc(alias = "rdma_create_event_channel")]
    pub fn new() -> Result<Arc<EventChannel>, CmError> {
        ensure_loaded()?;
        // SAFETY: no arguments; returns NULL with errno on failure.
        let raw =
            non_null(fresh(|| unsafe { ffi::rdma_create_event_channel() })).map_err(|source| {
                CmError::Call {
                    call: "rdma_create_event_channel",
                    endpoints: Endpoints::default(),
                    source,
                }
            })?;
        let channel = Arc::new_cyclic(|me| EventChannel {
            raw,
            lock: Mutex::new(()),
            me: Weak::clone(me),
        });
        let fd = channel.as_raw_fd();
        // SAFETY: fd is the channel's open descriptor; F_GETFL/F_SETFL take and return ints.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above.
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(CmError::Call {
                call: "fcntl(O_NONBLOCK) on the rdma_cm channel",
                endpoints: Endpoints::default(),
                source: io::Error::last_os_error(),
            });
        }
        Ok(channel)
    }

    /// The raw channel, valid while this channel is alive.
    pub fn as_raw(&self) -> *mut ffi::rdma_event_channel {
        self.raw.as_ptr()
    }

    /// This channel's `Arc` (always there while `&self` is: every channel lives in one).
    pub(super) fn arc(&self) -> Option<Arc<EventChannel>> {
        self.me.upgrade()
    }

    pub(super) fn guard(&self) -> MutexGuard<'_, ()> {
        lock(&self.lock)
    }
}
