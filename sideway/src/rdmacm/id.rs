//! The rdma_cm identifier [`CmId`](super::CmId): creating, binding, resolving, listening, connecting,
//! accepting, migrating between channels, multicast, and its device.

use std::ffi::c_void;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::os::raw::c_int;
use std::ptr::{self, NonNull};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use rdma_mummy_sys as ffi;

use super::address::{read_sockaddr, Endpoints, RawSockAddr};
use super::channel::{lock, millis, EventChannel};
use super::conn_param::{max_private_data, ConnParam, PortSpace, PrivateDataCall};
use super::device::lent_context;
use super::error::{addr_hint, route_hint, CmError};
use crate::errno::{fresh, from_ret, out_ptr, Fresh};
use crate::verbs::device::{DeviceContext, TransportType};

impl EventChannel {
    /// `Udp` for datagrams and multicast.
    #[doc(alias = "rdma_create_id")]
    pub fn create_id(self: &Arc<Self>, port_space: PortSpace) -> Result<Arc<CmId>, CmError> {
        let _guard = self.guard();
        let mut raw = ptr::null_mut();
        // SAFETY: the channel is open; raw is a valid out-pointer; the context is set below,
        // before any call on the id can produce an event.
        let ret = fresh(|| unsafe {
            ffi::rdma_create_id(self.as_raw(), &mut raw, ptr::null_mut(), port_space.raw())
        });
        from_ret(ret).map_err(|source| CmError::Call {
            call: "rdma_create_id",
            endpoints: Endpoints::default(),
            source,
        })?;
        let raw = out_ptr(raw).map_err(|source| CmError::Call {
            call: "rdma_create_id",
            endpoints: Endpoints::default(),
            source,
        })?;
        // SAFETY: raw is a fresh id of this channel, not yet known to anyone else.
        Ok(unsafe { CmId::adopt(raw, Arc::clone(self), port_space) })
    }
}

/// An rdma_cm identifier (`struct rdma_cm_id`): the RDMA analogue of a socket.
///
/// Always held in an `Arc`. Dropping the last one leaves the multicast groups it joined and
/// destroys the id (`rdma_destroy_id`). A QP created on the id ([`CmId::create_qp`](super::CmId::create_qp)) holds the
/// id's `Arc`, so the id is destroyed only after its QP.
#[doc(alias = "rdma_cm_id")]
pub struct CmId {
    raw: NonNull<ffi::rdma_cm_id>,
    /// The channel the id's events arrive on; [`CmId::migrate`](super::CmId::migrate) replaces it. Every call on
    /// the id holds this lock and then the channel's, in that order, so a call never runs
    /// under the lock of a channel the id has left.
    channel: Mutex<Arc<EventChannel>>,
    port_space: PortSpace,
    groups: Mutex<Vec<SocketAddr>>,
    /// The weak reference `raw`'s `context` holds, given back in `Drop`.
    context: ContextRef<CmId>,
}

// SAFETY: every call on the id and every read of its fields runs under its channel's lock
// (see the module documentation); librdmacm ids may be used from any thread. `context` is an
// address: dereferenced only through `Weak` (atomic counts), released once, in `Drop`.
unsafe impl Send for CmId {}
// SAFETY: as above.
unsafe impl Sync for CmId {}

impl fmt::Debug for CmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ends = self.endpoints();
        f.debug_struct("CmId")
            .field("port_space", &self.port_space)
            .field("local", &ends.local)
            .field("remote", &ends.remote)
            .field("qp_num", &self.qp_num())
            .finish()
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        // No other reference to the id is left, so nothing can migrate it meanwhile.
        let channel = Arc::clone(
            self.channel
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner),
        );
        let _guard = channel.guard();
        let raw = self.raw.as_ptr();
        self.leave_groups_locked();
        // Every event retrieved for this id was acknowledged before the channel lock was
        // released, so this does not wait on any.
        // SAFETY: the id is alive, and no Rust value refers to it after this.
        let ret = fresh(|| unsafe { ffi::rdma_destroy_id(raw) });
        match from_ret(ret) {
            Ok(()) => {
                // The id is gone, so no event can name this object any more: give back the
                // weak reference its context held.
                // SAFETY: rdma_destroy_id succeeded, so librdmacm hands the context to no one
                // again, and this is the one release.
                unsafe { self.context.release() };
            }
            Err(e) => {
                // The id may live on and its events may still name this allocation: keep the
                // weak reference (and so the allocation) alive rather than risk a dangling one.
                crate::diagnostics::report_drop_failure("rdma_destroy_id", "an rdma_cm id", &e);
            }
        }
    }
}

/// The weak reference to a value in an `Arc` that a C object's `context` field holds, so
/// that a callback or event naming the C object finds the value: leaked with
/// `Weak::into_raw` when the `Arc` is made, upgraded (never consumed) for each event, and
/// given back once by the value's `Drop`, after the C object is gone. Never given back
/// otherwise: when the C object may outlive the value (its destroy failed), the allocation
/// leaks rather than its context dangling.
///
/// The pointer kept is the one `Weak::into_raw` returned, which may reach the whole `Arc`
/// allocation (the counts beside the value). One made from `&mut self` in `Drop` may reach
/// only the value, and `Weak::from_raw` steps back from it to the counts: undefined
/// behaviour, which Miri's stacked borrows reports.
pub(super) struct ContextRef<T> {
    /// From `Weak::into_raw`; NULL once released.
    ptr: *const T,
}

impl<T> ContextRef<T> {
    /// Leaks one weak reference of `me` (from `Arc::new_cyclic`, or `Arc::downgrade`).
    pub(super) fn new(me: &Weak<T>) -> Self {
        ContextRef {
            ptr: Weak::into_raw(Weak::clone(me)),
        }
    }

    /// The pointer for the C object's `context` field.
    pub(super) fn as_context(&self) -> *mut c_void {
        self.ptr.cast_mut().cast()
    }

    /// The value a `context` field names, while any `Arc` of it is alive; `None` for NULL.
    ///
    /// # Safety
    ///
    /// `context` is NULL or the [`as_context`](Self::as_context) of a `ContextRef<T>` not
    /// yet released.
    pub(super) unsafe fn upgrade(context: *mut c_void) -> Option<Arc<T>> {
        if context.is_null() {
            return None;
        }
        // SAFETY: the caller's promise: context came from Weak::into_raw and its weak
        // reference is still leaked; ManuallyDrop leaves it so.
        let weak = std::mem::ManuallyDrop::new(unsafe { Weak::from_raw(context.cast::<T>()) });
        weak.upgrade()
    }

    /// Gives the weak reference back; does nothing the second time.
    ///
    /// # Safety
    ///
    /// No one will pass this reference's [`as_context`](Self::as_context) to
    /// [`upgrade`](Self::upgrade) again: the C object is gone, or its context cleared.
    pub(super) unsafe fn release(&mut self) {
        let ptr = std::mem::replace(&mut self.ptr, ptr::null());
        if !ptr.is_null() {
            // SAFETY: ptr came from Weak::into_raw (new) and has not been given back (the
            // field is cleared on the first release); its pointer, not one made from a
            // reference to the value, so it may reach the counts.
            drop(unsafe { Weak::from_raw(ptr) });
        }
    }
}

impl CmId {
    /// Wraps a raw id and points its context at the new object.
    ///
    /// # Safety
    ///
    /// `raw` is a live id of `channel` that no other `CmId` wraps, and the caller holds the
    /// channel's lock.
    pub(super) unsafe fn adopt(
        raw: NonNull<ffi::rdma_cm_id>,
        channel: Arc<EventChannel>,
        port_space: PortSpace,
    ) -> Arc<CmId> {
        let id = Arc::new_cyclic(|me| CmId {
            raw,
            channel: Mutex::new(channel),
            port_space,
            groups: Mutex::new(Vec::new()),
            context: ContextRef::new(me),
        });
        // SAFETY: raw is live and ours; context is a user field librdmacm hands back in
        // events. The weak reference is given back in Drop after rdma_destroy_id.
        unsafe { (*raw.as_ptr()).context = id.context.as_context() };
        id
    }

    /// The raw id, valid while this object is alive. Its fields change while librdmacm
    /// processes events; read them only with no other thread using the channel.
    pub fn as_raw(&self) -> *mut ffi::rdma_cm_id {
        self.raw.as_ptr()
    }

    /// The channel the id's events arrive on (until [`migrate`](Self::migrate) moves it).
    pub fn channel(&self) -> Arc<EventChannel> {
        Arc::clone(&lock(&self.channel))
    }

    /// Moves the id to another event channel (`rdma_migrate_id`): its later events, and
    /// those not yet read, arrive on `channel`. The way to serve connections concurrently:
    /// give each accepted id ([`Event::id`](super::Event::id) of a connection request) a
    /// channel of its own and a thread to wait on it, while the listener's channel keeps
    /// taking requests.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use sideway::rdmacm::{EventChannel, EventType, PortSpace};
    ///
    /// let listen_channel = EventChannel::new()?;
    /// let listener = listen_channel.create_id(PortSpace::Tcp)?;
    /// listener.bind_addr("0.0.0.0:7471".parse()?)?;
    /// listener.listen(64)?;
    /// loop {
    ///     let request = listen_channel.wait_for(EventType::ConnectRequest, None)?;
    ///     let id = request.id().clone();
    ///     drop(request);
    ///     id.migrate(&EventChannel::new()?)?;
    ///     std::thread::spawn(move || {
    ///         // create a QP, accept, and wait on id.channel(): no other id uses it
    ///         let _ = id.wait_for(EventType::Established, Some(Duration::from_secs(5)));
    ///     });
    /// }
    /// # #[allow(unreachable_code)] Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "rdma_migrate_id")]
    pub fn migrate(&self, channel: &Arc<EventChannel>) -> Result<(), CmError> {
        let mut current = lock(&self.channel);
        if Arc::ptr_eq(&current, channel) {
            return Ok(());
        }
        // Both channels' locks, always in address order, so two migrations in opposite
        // directions cannot wait on each other.
        let (first, second) = if Arc::as_ptr(&current) < Arc::as_ptr(channel) {
            (Arc::clone(&current), Arc::clone(channel))
        } else {
            (Arc::clone(channel), Arc::clone(&current))
        };
        let _first = first.guard();
        let _second = second.guard();
        // SAFETY: the id is alive and both channels are open and locked, so no event of the
        // id is being read; every event already read was acknowledged (get_event does so
        // before returning), which rdma_migrate_id waits for.
        let ret = fresh(|| unsafe { ffi::rdma_migrate_id(self.raw.as_ptr(), channel.as_raw()) });
        self.check("rdma_migrate_id", ret)?;
        *current = Arc::clone(channel);
        Ok(())
    }

    /// Leaves every multicast group the id joined, detaching its QP (if any) from them.
    /// The caller holds the channel's lock.
    pub(super) fn leave_groups_locked(&self) {
        let raw = self.raw.as_ptr();
        for group in std::mem::take(&mut *lock(&self.groups)) {
            let mut sa = RawSockAddr::new(group);
            // SAFETY: the id is alive and joined this group; librdmacm detaches the QP.
            let ret = fresh(|| unsafe { ffi::rdma_leave_multicast(raw, sa.as_mut_ptr()) });
            if let Err(e) = from_ret(ret) {
                crate::diagnostics::report_drop_failure(
                    "rdma_leave_multicast",
                    &group.to_string(),
                    &e,
                );
            }
        }
    }

    /// The lock that holds the id's channel; take it before the channel's own lock.
    pub(super) fn channel_slot(&self) -> &Mutex<Arc<EventChannel>> {
        &self.channel
    }

    /// The id's port space.
    pub fn port_space(&self) -> PortSpace {
        self.port_space
    }

    /// The local and remote addresses, as far as they are known (`rdma_get_local_addr`,
    /// `rdma_get_peer_addr`).
    #[doc(alias = "rdma_get_local_addr")]
    #[doc(alias = "rdma_get_peer_addr")]
    pub fn endpoints(&self) -> Endpoints {
        let channel = lock(&self.channel);
        let _guard = channel.guard();
        self.endpoints_locked()
    }

    pub(super) fn endpoints_locked(&self) -> Endpoints {
        let raw = self.raw.as_ptr();
        // SAFETY: the id is alive and the channel lock is held; the address unions are
        // sockaddr_storage-sized.
        let (local, remote) = unsafe {
            (
                read_sockaddr(ptr::addr_of!((*raw).route.addr.__bindgen_anon_1).cast()),
                read_sockaddr(ptr::addr_of!((*raw).route.addr.__bindgen_anon_2).cast()),
            )
        };
        let unspecified =
            |a: Option<SocketAddr>| a.filter(|a| a.port() != 0 || !a.ip().is_unspecified());
        Endpoints {
            local: unspecified(local),
            remote: unspecified(remote),
        }
    }

    /// The local address (`rdma_get_local_addr`).
    #[doc(alias = "rdma_get_local_addr")]
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.endpoints().local
    }

    /// The peer's address (`rdma_get_peer_addr`).
    #[doc(alias = "rdma_get_peer_addr")]
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.endpoints().remote
    }

    /// The device port the id is bound to (`port_num`; 0 before it is bound).
    pub fn port_num(&self) -> u8 {
        let channel = lock(&self.channel);
        let _guard = channel.guard();
        // SAFETY: the id is alive and the channel lock is held.
        unsafe { (*self.raw.as_ptr()).port_num }
    }

    pub(super) fn call_err(&self, call: &'static str, source: io::Error) -> CmError {
        CmError::Call {
            call,
            endpoints: self.endpoints_locked(),
            source,
        }
    }

    pub(super) fn check(&self, call: &'static str, ret: Fresh<c_int>) -> Result<(), CmError> {
        from_ret(ret).map_err(|source| self.call_err(call, source))
    }

    /// Binds the id to a local address and port (`rdma_bind_addr`). Port 0 picks a free one;
    /// a specific IP also binds the id to that IP's RDMA device.
    #[doc(alias = "rdma_bind_addr")]
    pub fn bind_addr(&self, addr: SocketAddr) -> Result<(), CmError> {
        let channel = lock(&self.channel);
        let _guard = channel.guard();
        let mut sa = RawSockAddr::new(addr);
        // SAFETY: the id is alive; sa is a valid sockaddr the call copies.
        let ret = fresh(|| unsafe { ffi::rdma_bind_addr(self.raw.as_ptr(), sa.as_mut_ptr()) });
        from_ret(ret).map_err(|source| CmError::Call {
            call: "rdma_bind_addr",
            endpoints: Endpoints {
                local: Some(addr),
                remote: None,
            },
            source,
        })
    }

    /// Starts resolving `dst` (and `src`, if given) to RDMA addresses (`rdma_resolve_addr`);
    /// [`EventType::AddrResolved`](super::EventType::AddrResolved) or [`EventType::AddrError`](super::EventType::AddrError) follows within `timeout`.
    /// Afterwards the id is bound to a device ([`device_context`](Self::device_context)).
    #[doc(alias = "rdma_resolve_addr")]
    pub fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<(), CmError> {
        let channel = lock(&self.channel);
        let _guard = channel.guard();
        let mut src_sa = src.map(RawSockAddr::new);
        let mut dst_sa = RawSockAddr::new(dst);
        let src_ptr = src_sa
            .as_mut()
            .map_or(ptr::null_mut(), RawSockAddr::as_mut_ptr);
        // SAFETY: the id is alive; both addresses are valid sockaddrs (or NULL) the call copies.
        let ret = fresh(|| unsafe {
            ffi::rdma_resolve_addr(
                self.raw.as_ptr(),
                src_ptr,
                dst_sa.as_mut_ptr(),
                millis(timeout),
            )
        });
        from_ret(ret).map_err(|source| {
            if addr_hint(&source).is_empty() {
                CmError::Call {
                    call: "rdma_resolve_addr",
                    endpoints: Endpoints {
                        local: src,
                        remote: Some(dst),
                    },
                    source,
                }
            } else {
                CmError::AddrUnresolvable { dst, src, source }
            }
        })
    }

    /// Starts resolving a route to the resolved destination (`rdma_resolve_route`);
    /// [`EventType::RouteResolved`](super::EventType::RouteResolved) or [`EventType::RouteError`](super::EventType::RouteError) follows within `timeout`.
    #[doc(alias = "rdma_resolve_route")]
    pub fn resolve_route(&self, timeout: Duration) -> Result<(), CmError> {
        let channel = lock(&self.channel);
        let _guard = channel.guard();
        let raw = self.raw.as_ptr();
        // SAFETY: the id is alive and the lock held; verbs is a plain field.
        if unsafe { (*raw).verbs }.is_null() {
            // librdmacm would dereference the missing device.
            return Err(CmError::NotBound {
                endpoints: self.endpoints_locked(),
            });
        }
        // SAFETY: the id is alive and bound to a device.
        let ret = fresh(|| unsafe { ffi::rdma_resolve_route(raw, millis(timeout)) });
        from_ret(ret).map_err(|source| {
            if route_hint(&source).is_empty() {
                self.call_err("rdma_resolve_route", source)
            } else {
                CmError::RouteUnresolvable {
                    dst: self.endpoints_locked().remote,
                    source,
                }
            }
        })
    }

    /// Listens for connection requests (`rdma_listen`); bind first. Each request arrives as an
    /// [`EventType::ConnectRequest`](super::EventType::ConnectRequest) whose id is the new connection.
    #[doc(alias = "rdma_listen")]
    pub fn listen(&self, backlog: i32) -> Result<(), CmError> {
        let channel = lock(&self.channel);
        let _guard = channel.guard();
        // SAFETY: the id is alive.
        let ret = fresh(|| unsafe { ffi::rdma_listen(self.raw.as_ptr(), backlog) });
        self.check("rdma_listen", ret)
    }

    fn transport(&self) -> TransportType {
        let raw = self.raw.as_ptr();
        // SAFETY: the id is alive and the lock held; verbs, when set, is an open context whose
        // device pointer is set by libibverbs.
        unsafe {
            let verbs = (*raw).verbs;
            if verbs.is_null() || (*verbs).device.is_null() {
                return TransportType::Infiniband;
            }
            TransportType::from((*(*verbs).device).transport_type as u32)
        }
    }

    /// The most private data `call` carries on this id: the InfiniBand/RoCE limits of
    /// [`max_private_data`], or the 255 bytes the C field holds on iWARP (whose driver may
    /// allow less).
    pub fn max_private_data(&self, call: PrivateDataCall) -> usize {
        let channel = lock(&self.channel);
        let _guard = channel.guard();
        self.max_private_data_locked(call).0
    }

    fn max_private_data_locked(&self, call: PrivateDataCall) -> (usize, &'static str) {
        match self.transport() {
            TransportType::Iwarp => (usize::from(u8::MAX), "iWARP"),
            _ => (max_private_data(self.port_space, call), "InfiniBand/RoCE"),
        }
    }

    fn check_private_data(&self, call: PrivateDataCall, len: usize) -> Result<(), CmError> {
        let (max, transport) = self.max_private_data_locked(call);
        if len > max {
            return Err(CmError::PrivateDataTooLong {
                call: call.name(),
                len,
                max,
                port_space: self.port_space,
                transport,
            });
        }
        Ok(())
    }

    /// Connects to the resolved destination (`rdma_connect`): a connection request on `Tcp`
    /// ids, a QP lookup (SIDR) on `Udp` ids. Private data over the transport's limit is an
    /// error before anything is sent. [`EventType::Established`](super::EventType::Established) (or, on an id without a QP,
    /// [`EventType::ConnectResponse`](super::EventType::ConnectResponse)) follows; failures arrive as
    /// [`EventType::Rejected`](super::EventType::Rejected), [`EventType::Unreachable`](super::EventType::Unreachable) or [`EventType::ConnectError`](super::EventType::ConnectError).
    #[doc(alias = "rdma_connect")]
    pub fn connect(&self, param: &ConnParam) -> Result<(), CmError> {
        let channel = lock(&self.channel);
        let _guard = channel.guard();
        self.check_private_data(PrivateDataCall::Connect, param.private_data.len())?;
        let mut raw_param = param.raw();
        // SAFETY: the id is alive; raw_param and the private data it points to live through
        // the call, which copies them.
        let ret = fresh(|| unsafe { ffi::rdma_connect(self.raw.as_ptr(), &mut raw_param) });
        self.check("rdma_connect", ret)
    }

    /// Accepts the connection request this id came from (`rdma_accept`). Private data over
    /// the transport's limit is an error before anything is sent. On an id without a QP, set
    /// [`ConnParam::qp_num`](super::ConnParam::qp_num) to the QP that serves the connection.
    #[doc(alias = "rdma_accept")]
    pub fn accept(&self, param: &ConnParam) -> Result<(), CmError> {
        let channel = lock(&self.channel);
        let _guard = channel.guard();
        self.check_private_data(PrivateDataCall::Accept, param.private_data.len())?;
        let mut raw_param = param.raw();
        // SAFETY: the id is alive; raw_param and its private data live through the call.
        let ret = fresh(|| unsafe { ffi::rdma_accept(self.raw.as_ptr(), &mut raw_param) });
        self.check("rdma_accept", ret)
    }

    /// Rejects the connection request this id came from (`rdma_reject`), with private data
    /// for the peer. Over the transport's limit is an error before anything is sent.
    #[doc(alias = "rdma_reject")]
    pub fn reject(&self, private_data: &[u8]) -> Result<(), CmError> {
        let channel = lock(&self.channel);
        let _guard = channel.guard();
        self.check_private_data(PrivateDataCall::Reject, private_data.len())?;
        let (data, len) = if private_data.is_empty() {
            (ptr::null(), 0)
        } else {
            // Checked above: every limit fits in a u8.
            (
                private_data.as_ptr().cast(),
                u8::try_from(private_data.len()).unwrap_or(u8::MAX),
            )
        };
        // SAFETY: the id is alive; data points to len bytes the call copies.
        let ret = fresh(|| unsafe { ffi::rdma_reject(self.raw.as_ptr(), data, len) });
        self.check("rdma_reject", ret)
    }

    /// Completes a connection on the active side of an id without a QP, after
    /// [`EventType::ConnectResponse`](super::EventType::ConnectResponse) (`rdma_establish`).
    #[doc(alias = "rdma_establish")]
    pub fn establish(&self) -> Result<(), CmError> {
        let channel = lock(&self.channel);
        let _guard = channel.guard();
        // SAFETY: the id is alive.
        let ret = fresh(|| unsafe { ffi::rdma_establish(self.raw.as_ptr()) });
        self.check("rdma_establish", ret)
    }

    /// Disconnects (`rdma_disconnect`); the id's QP goes to the error state, and both sides
    /// get [`EventType::Disconnected`](super::EventType::Disconnected).
    #[doc(alias = "rdma_disconnect")]
    pub fn disconnect(&self) -> Result<(), CmError> {
        let channel = lock(&self.channel);
        let _guard = channel.guard();
        // SAFETY: the id is alive.
        let ret = fresh(|| unsafe { ffi::rdma_disconnect(self.raw.as_ptr()) });
        self.check("rdma_disconnect", ret)
    }

    /// Tells librdmacm of a QP event it should act on (`rdma_notify`), in practice
    /// `IBV_EVENT_COMM_EST` when data arrives before [`EventType::Established`](super::EventType::Established). `EISCONN`
    /// (already established) is not an error.
    #[doc(alias = "rdma_notify")]
    pub fn notify(&self, event: ffi::ibv_event_type::Type) -> Result<(), CmError> {
        let channel = lock(&self.channel);
        let _guard = channel.guard();
        // SAFETY: the id is alive.
        let ret = fresh(|| unsafe { ffi::rdma_notify(self.raw.as_ptr(), event) });
        match from_ret(ret) {
            Err(e) if e.raw_os_error() == Some(libc::EISCONN) => Ok(()),
            r => r.map_err(|source| self.call_err("rdma_notify", source)),
        }
    }

    /// Joins a multicast group (`rdma_join_multicast`) on a bound or address-resolved `Udp`
    /// id; [`EventType::MulticastJoin`](super::EventType::MulticastJoin) follows, with the group's [`UdParam`](super::UdParam). When the id
    /// has a QP, librdmacm attaches it to the group as that event is retrieved. Groups still
    /// joined are left when the id is dropped.
    #[doc(alias = "rdma_join_multicast")]
    pub fn join_multicast(&self, group: SocketAddr) -> Result<(), CmError> {
        let channel = lock(&self.channel);
        let _guard = channel.guard();
        let mut sa = RawSockAddr::new(group);
        // SAFETY: the id is alive; sa is a valid sockaddr the call copies; no join context.
        let ret = fresh(|| unsafe {
            ffi::rdma_join_multicast(self.raw.as_ptr(), sa.as_mut_ptr(), ptr::null_mut())
        });
        from_ret(ret).map_err(|source| CmError::Call {
            call: "rdma_join_multicast",
            endpoints: Endpoints {
                local: self.endpoints_locked().local,
                remote: Some(group),
            },
            source,
        })?;
        lock(&self.groups).push(group);
        Ok(())
    }

    /// Leaves a multicast group joined with [`join_multicast`](Self::join_multicast)
    /// (`rdma_leave_multicast`), detaching the id's QP.
    #[doc(alias = "rdma_leave_multicast")]
    pub fn leave_multicast(&self, group: SocketAddr) -> Result<(), CmError> {
        let channel = lock(&self.channel);
        let _guard = channel.guard();
        let mut sa = RawSockAddr::new(group);
        // SAFETY: the id is alive; sa is a valid sockaddr.
        let ret =
            fresh(|| unsafe { ffi::rdma_leave_multicast(self.raw.as_ptr(), sa.as_mut_ptr()) });
        from_ret(ret).map_err(|source| CmError::Call {
            call: "rdma_leave_multicast",
            endpoints: Endpoints {
                local: self.endpoints_locked().local,
                remote: Some(group),
            },
            source,
        })?;
        lock(&self.groups).retain(|g| *g != group);
        Ok(())
    }

    /// The device context the id is bound to (`verbs`), once it is bound (after
    /// [`bind_addr`](Self::bind_addr) to a specific IP, address resolution, or for ids from
    /// connection requests). Allocate the PD and CQs for [`create_qp`](Self::create_qp) here.
    ///
    /// librdmacm opened this context and keeps it: the returned [`DeviceContext`] holds a
    /// reference on librdmacm's device list (`rdma_get_devices`) and never calls
    /// `ibv_close_device`. Ids on the same device share one wrapper while it is alive.
    #[doc(alias = "verbs")]
    #[doc(alias = "rdma_get_devices")]
    pub fn device_context(&self) -> Result<Arc<DeviceContext>, CmError> {
        let verbs = {
            let channel = lock(&self.channel);
            let _guard = channel.guard();
            // SAFETY: the id is alive and the lock held.
            unsafe { (*self.raw.as_ptr()).verbs }
        };
        let Some(verbs) = NonNull::new(verbs) else {
            return Err(CmError::NotBound {
                endpoints: self.endpoints(),
            });
        };
        // The id keeps its device referenced while it lives (and we borrow it), so the context
        // stays open until the wrapper's own reference is taken below.
        lent_context(verbs).map_err(|source| CmError::Call {
            call: "rdma_get_devices",
            endpoints: self.endpoints(),
            source,
        })
    }
}
