//! Events: [`EventChannel::get_event`](super::EventChannel::get_event) and its kin copy everything out of librdmacm's event
//! and acknowledge it before returning; [`Event`](super::Event) holds the ids it names.

use std::ffi::c_void;
use std::fmt;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::{self, NonNull};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_mummy_sys as ffi;

use super::address::Endpoints;
use super::channel::{millis, EventChannel};
use super::conn_param::{PeerConnParam, PortSpace};
use super::error::CmError;
use super::event_type::{EventType, RejectReason};
use super::id::{CmId, ContextRef};
use super::ud::UdParam;
use crate::errno::{fresh, from_ret};

/// What one `rdma_get_cm_event` produced.
enum Fetched {
    Nothing,
    Event(Event),
    /// The event was for an id being dropped; it was acknowledged and discarded.
    Discarded,
}

impl EventChannel {
    /// Waits for the next event (`poll` on the descriptor, then `rdma_get_cm_event`), at most
    /// `timeout` (`None`: without limit), and acknowledges it (`rdma_ack_cm_event`) after
    /// copying out what it carries. No event within `timeout` is a [`CmError::Timeout`](super::CmError::Timeout).
    ///
    /// Events for ids that are being dropped are acknowledged and skipped.
    #[doc(alias = "rdma_get_cm_event")]
    #[doc(alias = "rdma_ack_cm_event")]
    pub fn get_event(&self, timeout: Option<Duration>) -> Result<Event, CmError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(event) = self.try_get_event()? {
                return Ok(event);
            }
            let wait_ms = match deadline {
                None => -1,
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(CmError::Timeout {
                            timeout: timeout.unwrap_or_default(),
                            waiting_for: None,
                            endpoints: Endpoints::default(),
                        });
                    }
                    // Round up, so a sub-millisecond remainder still sleeps instead of spinning.
                    let left = deadline - now;
                    millis(left + Duration::from_micros(999))
                }
            };
            let mut pfd = libc::pollfd {
                fd: self.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: pfd is one valid pollfd for the duration of the call.
            let n = unsafe { libc::poll(&mut pfd, 1, wait_ms) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EINTR) {
                    return Err(CmError::Call {
                        call: "poll on the rdma_cm channel",
                        endpoints: Endpoints::default(),
                        source: e,
                    });
                }
            }
        }
    }

    /// The next event if one is waiting, without blocking (`rdma_get_cm_event` on the
    /// non-blocking descriptor): the non-blocking mode, for use after poll/epoll said the
    /// descriptor is readable.
    #[doc(alias = "rdma_get_cm_event")]
    pub fn try_get_event(&self) -> Result<Option<Event>, CmError> {
        loop {
            match self.fetch()? {
                Fetched::Nothing => return Ok(None),
                Fetched::Event(event) => return Ok(Some(event)),
                Fetched::Discarded => {}
            }
        }
    }

    /// Waits like [`get_event`](Self::get_event) for an event of type `expected`; an event
    /// that reports a failure becomes its typed error ([`Event::into_result`](super::Event::into_result)), any other type
    /// a [`CmError::UnexpectedEvent`](super::CmError::UnexpectedEvent). Meant for channels whose events come in a known order
    /// (one id per channel, or one connection step at a time). A [`CmError::Timeout`](super::CmError::Timeout) names
    /// the event waited for; [`CmId::wait_for`](super::CmId::wait_for) adds the id's addresses.
    pub fn wait_for(
        &self,
        expected: EventType,
        timeout: Option<Duration>,
    ) -> Result<Event, CmError> {
        let event = match self.get_event(timeout) {
            Err(CmError::Timeout {
                timeout, endpoints, ..
            }) => {
                return Err(CmError::Timeout {
                    timeout,
                    waiting_for: Some(expected),
                    endpoints,
                })
            }
            other => other?,
        };
        event.expect_type(expected)
    }

    fn fetch(&self) -> Result<Fetched, CmError> {
        // Whatever this returns, including on error, is dropped after the lock is released:
        // dropping the last Arc of an id destroys it, which takes the lock.
        let guard = self.guard();
        let mut raw: *mut ffi::rdma_cm_event = ptr::null_mut();
        // SAFETY: the channel is open and its descriptor non-blocking, so this returns at once;
        // raw is a valid out-pointer.
        let ret = fresh(|| unsafe { ffi::rdma_get_cm_event(self.as_raw(), &mut raw) });
        if let Err(source) = from_ret(ret) {
            return match source.raw_os_error() {
                Some(libc::EAGAIN | libc::EINTR) => Ok(Fetched::Nothing),
                _ => Err(CmError::Call {
                    call: "rdma_get_cm_event",
                    endpoints: Endpoints::default(),
                    source,
                }),
            };
        }
        let Some(raw) = NonNull::new(raw) else {
            return Ok(Fetched::Nothing);
        };
        // SAFETY: a successful rdma_get_cm_event hands out a valid event that stays valid
        // until it is acknowledged below, and the ids it names stay alive at least as long.
        let fetched = unsafe { Event::copy_from(raw.as_ptr(), self) };
        // SAFETY: raw is the event just retrieved; it is acknowledged exactly once, here, and
        // nothing read from it is used afterwards (everything was copied).
        let ret = fresh(|| unsafe { ffi::rdma_ack_cm_event(raw.as_ptr()) });
        drop(guard);
        match from_ret(ret) {
            Ok(()) => Ok(fetched),
            Err(source) => {
                drop(fetched);
                Err(CmError::Call {
                    call: "rdma_ack_cm_event",
                    endpoints: Endpoints::default(),
                    source,
                })
            }
        }
    }
}

/// Looks up the `CmId` whose weak reference an id's `context` holds.
///
/// # Safety
///
/// `raw` is a live id of this crate whose context, when non-NULL, is its `CmId`'s
/// `ContextRef` (released only after `rdma_destroy_id`).
unsafe fn id_of(raw: *mut ffi::rdma_cm_id) -> Option<Arc<CmId>> {
    if raw.is_null() {
        return None;
    }
    // SAFETY: raw is a live id (caller); context is a plain field.
    let ctx = unsafe { (*raw).context };
    // SAFETY: ctx is NULL or CmId::adopt's ContextRef, released only after the id is
    // destroyed.
    unsafe { ContextRef::<CmId>::upgrade(ctx) }
}

/// An rdma_cm event, with everything it carried copied out; librdmacm's event was already
/// acknowledged when this value was made.
#[doc(alias = "rdma_cm_event")]
pub struct Event {
    event_type: EventType,
    status: i32,
    id: Arc<CmId>,
    listener: Option<Arc<CmId>>,
    private_data: Vec<u8>,
    conn: Option<PeerConnParam>,
    ud: Option<UdParam>,
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Event")
            .field("event_type", &self.event_type)
            .field("status", &self.status)
            .field("id", &self.id)
            .field("private_data_len", &self.private_data.len())
            .field("conn", &self.conn)
            .field("ud", &self.ud)
            .finish_non_exhaustive()
    }
}

impl Event {
    /// Copies an event out of librdmacm.
    ///
    /// # Safety
    ///
    /// `raw` is an event from `rdma_get_cm_event` on `channel`, not yet acknowledged, and the
    /// caller holds `channel`'s lock.
    unsafe fn copy_from(raw: *mut ffi::rdma_cm_event, channel: &EventChannel) -> Fetched {
        // SAFETY: the caller guarantees a valid event.
        let e = unsafe { &*raw };
        let event_type = EventType::from(e.event);
        let (id, listener) = if event_type == EventType::ConnectRequest {
            // SAFETY: listen_id is a live id of this crate (its context is ours).
            let listener = unsafe { id_of(e.listen_id) };
            let Some(new_raw) = NonNull::new(e.id) else {
                return Fetched::Discarded;
            };
            let (Some(listener), Some(channel)) = (listener, channel.arc()) else {
                // The listener is being dropped: nobody can take the new id. Destroying it
                // waits for nothing (the request counts against the listener), and its context
                // still names the listener's weak reference, which is not ours to reclaim.
                // SAFETY: new_raw is the new id librdmacm just made, referenced nowhere else.
                let _ = unsafe { ffi::rdma_destroy_id(new_raw.as_ptr()) };
                return Fetched::Discarded;
            };
            // SAFETY: new_raw is the new id, known to nobody yet; it belongs to the listener's
            // channel and port space.
            let id = unsafe { CmId::adopt(new_raw, channel, listener.port_space()) };
            (id, Some(listener))
        } else {
            // SAFETY: e.id is a live id of this crate.
            match unsafe { id_of(e.id) } {
                Some(id) => (id, None),
                None => return Fetched::Discarded,
            }
        };
        let multicast = matches!(
            event_type,
            EventType::MulticastJoin | EventType::MulticastError
        );
        let mut event = Event {
            event_type,
            status: e.status,
            id,
            listener,
            private_data: Vec::new(),
            conn: None,
            ud: None,
        };
        match event.id.port_space() {
            PortSpace::Tcp => {
                // SAFETY: TCP ids' events carry the conn member of the union (zeroed when the
                // event has no parameters).
                let c = unsafe { e.param.conn };
                // SAFETY: when non-NULL, private_data points to private_data_len bytes inside
                // the event, valid until the acknowledgement.
                event.private_data = unsafe { copy_private(c.private_data, c.private_data_len) };
                event.conn = Some(PeerConnParam {
                    responder_resources: c.responder_resources,
                    initiator_depth: c.initiator_depth,
                    flow_control: c.flow_control,
                    retry_count: c.retry_count,
                    rnr_retry_count: c.rnr_retry_count,
                    srq: c.srq != 0,
                    qp_num: c.qp_num,
                });
            }
            PortSpace::Udp => {
                // SAFETY: UDP ids' events carry the ud member of the union.
                let u = unsafe { e.param.ud };
                if !multicast {
                    // SAFETY: as for conn; multicast events put the join context in this
                    // pointer instead, so they are skipped.
                    event.private_data =
                        unsafe { copy_private(u.private_data, u.private_data_len) };
                }
                event.ud = Some(UdParam {
                    ah_attr: u.ah_attr,
                    qp_num: u.qp_num,
                    qkey: u.qkey,
                });
            }
        }
        Fetched::Event(event)
    }

    /// The event's type.
    pub fn event_type(&self) -> EventType {
        self.event_type
    }

    /// The event's status: 0 on success, else a negative errno or a transport-specific value
    /// (for [`EventType::Rejected`](super::EventType::Rejected), the reject reason).
    pub fn status(&self) -> i32 {
        self.status
    }

    /// The id the event is about. For [`EventType::ConnectRequest`](super::EventType::ConnectRequest), the new id of the
    /// incoming connection: accept or reject it, and keep it (it is destroyed with its last
    /// `Arc`).
    pub fn id(&self) -> &Arc<CmId> {
        &self.id
    }

    /// The listening id, for [`EventType::ConnectRequest`](super::EventType::ConnectRequest).
    pub fn listener(&self) -> Option<&Arc<CmId>> {
        self.listener.as_ref()
    }

    /// The private data the peer sent with `rdma_connect`, `rdma_accept` or `rdma_reject`.
    ///
    /// On InfiniBand and RoCE this is the transport's whole private data field (e.g. 56 bytes
    /// for a connect request): the peer's bytes, then zeros. The length the peer gave is not
    /// transmitted; carry it in the data if it matters.
    pub fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// The peer's connection parameters, for events of `RDMA_PS_TCP` ids (meaningful for
    /// [`EventType::ConnectRequest`](super::EventType::ConnectRequest), [`EventType::ConnectResponse`](super::EventType::ConnectResponse) and
    /// [`EventType::Established`](super::EventType::Established)).
    pub fn conn_param(&self) -> Option<&PeerConnParam> {
        self.conn.as_ref()
    }

    /// The UD parameters, for events of `RDMA_PS_UDP` ids (meaningful for
    /// [`EventType::Established`](super::EventType::Established) and [`EventType::MulticastJoin`](super::EventType::MulticastJoin)).
    pub fn ud_param(&self) -> Option<&UdParam> {
        self.ud.as_ref()
    }

    /// The event, if it is of type `expected`: one that reports a failure becomes its typed
    /// error ([`into_result`](Self::into_result)), one of another type a
    /// [`CmError::UnexpectedEvent`](super::CmError::UnexpectedEvent). What
    /// [`EventChannel::wait_for`](super::EventChannel::wait_for) does with the event it got,
    /// for callers that wait their own way (an async reactor, say).
    pub fn expect_type(self, expected: EventType) -> Result<Event, CmError> {
        let event = self.into_result()?;
        if event.event_type() != expected {
            return Err(CmError::UnexpectedEvent {
                expected,
                got: event.event_type(),
                status: event.status(),
            });
        }
        Ok(event)
    }

    /// The event as a result: events that report a failure (`ADDR_ERROR`, `ROUTE_ERROR`,
    /// `CONNECT_ERROR`, `UNREACHABLE`, `REJECTED`, `MULTICAST_ERROR`, `DEVICE_REMOVAL`) become
    /// their typed [`CmError`](super::CmError), with the id's addresses; every other event is `Ok`.
    pub fn into_result(self) -> Result<Event, CmError> {
        let errno = |status: i32| {
            io::Error::from_raw_os_error(if status == 0 {
                libc::EIO
            } else {
                status.saturating_abs()
            })
        };
        let ends = self.id.endpoints();
        Err(match self.event_type {
            EventType::AddrError => match ends.remote {
                Some(dst) => CmError::AddrUnresolvable {
                    dst,
                    src: ends.local,
                    source: errno(self.status),
                },
                None => CmError::Call {
                    call: "rdma_resolve_addr",
                    endpoints: ends,
                    source: errno(self.status),
                },
            },
            EventType::RouteError => CmError::RouteUnresolvable {
                dst: ends.remote,
                source: errno(self.status),
            },
            EventType::Unreachable => CmError::Unreachable {
                remote: ends.remote,
                status: self.status,
            },
            EventType::Rejected => CmError::Rejected {
                remote: ends.remote,
                reason: RejectReason {
                    status: self.status,
                },
                private_data: self.private_data,
            },
            EventType::ConnectError => CmError::ConnectError {
                remote: ends.remote,
                status: self.status,
            },
            EventType::MulticastError => CmError::MulticastError {
                local: ends.local,
                status: self.status,
            },
            EventType::DeviceRemoval => CmError::DeviceRemoved { local: ends.local },
            _ => return Ok(self),
        })
    }
}

/// Copies an event's private data.
///
/// # Safety
///
/// `data` is NULL or points to `len` readable bytes.
unsafe fn copy_private(data: *const c_void, len: u8) -> Vec<u8> {
    if data.is_null() || len == 0 {
        return Vec::new();
    }
    // SAFETY: the caller guarantees len readable bytes at data.
    unsafe { std::slice::from_raw_parts(data.cast::<u8>(), usize::from(len)) }.to_vec()
}

impl CmId {
    /// Waits on this id's channel like [`EventChannel::wait_for`](super::EventChannel::wait_for); a timeout also names
    /// this id's addresses. For a channel whose next event is this id's (one id per channel,
    /// or one connection step at a time).
    pub fn wait_for(
        &self,
        expected: EventType,
        timeout: Option<Duration>,
    ) -> Result<Event, CmError> {
        self.channel()
            .wait_for(expected, timeout)
            .map_err(|e| match e {
                CmError::Timeout {
                    timeout,
                    waiting_for,
                    ..
                } => CmError::Timeout {
                    timeout,
                    waiting_for,
                    endpoints: self.endpoints(),
                },
                e => e,
            })
    }
}
