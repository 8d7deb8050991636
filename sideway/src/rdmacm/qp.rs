//! Queue pairs for an rdma_cm id, as ordinary [`QueuePair`]s: created on the id from a
//! [`QueuePairBuilder`] ([`CmId::create_qp`](super::CmId::create_qp)) or the program's own, moved
//! through their states with the id's attributes
//! ([`CmId::init_qp_attr`](super::CmId::init_qp_attr),
//! [`CmId::modify_qp`](super::CmId::modify_qp)), and connected by helpers that do what each kind
//! needs ([`CmId::connect_qp`](super::CmId::connect_qp),
//! [`CmId::accept_qp`](super::CmId::accept_qp)).
//!
//! A QP created on the id holds the id's `Arc`: the id cannot be destroyed under it, and
//! dropping the QP destroys it and clears the id's QP pointer under the channel's lock, so
//! librdmacm never acts on a destroyed QP.

use std::mem::MaybeUninit;
use std::os::raw::c_int;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use rdma_mummy_sys as ffi;

use super::channel::lock;
use super::conn_param::{ConnParam, PortSpace};
use super::device::device_name;
use super::error::CmError;
use super::event::Event;
use super::event_type::EventType;
use super::id::CmId;
use crate::errno::{fresh, from_ret};
use crate::verbs::queue_pair::{
    QpAttrMask, QpState, QpType, QueuePair, QueuePairAttribute, QueuePairBuilder,
};

/// The state [`CmId::init_qp_attr`](super::CmId::init_qp_attr) asks the attributes for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpTargetState {
    /// `IBV_QPS_INIT`
    Init,
    /// `IBV_QPS_RTR`
    Rtr,
    /// `IBV_QPS_RTS`
    Rts,
}

impl QpTargetState {
    fn raw(self) -> ffi::ibv_qp_state::Type {
        match self {
            QpTargetState::Init => ffi::ibv_qp_state::IBV_QPS_INIT,
            QpTargetState::Rtr => ffi::ibv_qp_state::IBV_QPS_RTR,
            QpTargetState::Rts => ffi::ibv_qp_state::IBV_QPS_RTS,
        }
    }
}

impl CmId {
    /// The attributes that move a QP to `state` for this id's connection
    /// (`rdma_init_qp_attr`), for QPs the program created itself: pass them to
    /// [`QueuePair::modify`], or use [`modify_qp`](Self::modify_qp), which does both.
    ///
    /// On the active side, the `Init` attributes asked before [`connect`](Self::connect)
    /// grant no remote read or atomic access: those come with the responder resources,
    /// agreed only by the peer's answer. Ask for `Init` again after
    /// [`EventType::ConnectResponse`](super::EventType::ConnectResponse) and apply it (Init to
    /// Init) before `Rtr` and `Rts`, as librdmacm does for the QPs it owns (and
    /// [`connect_qp`](Self::connect_qp) does); otherwise the peer's RDMA READs fail.
    #[doc(alias = "rdma_init_qp_attr")]
    pub fn init_qp_attr(&self, state: QpTargetState) -> Result<QueuePairAttribute, CmError> {
        let channel = lock(self.channel_slot());
        let _guard = channel.guard();
        // SAFETY: ibv_qp_attr is plain data; all zeros is valid.
        let mut attr: ffi::ibv_qp_attr = unsafe { MaybeUninit::zeroed().assume_init() };
        attr.qp_state = state.raw();
        let mut mask: c_int = 0;
        // SAFETY: the id is alive; attr (input qp_state, output the rest) and mask are valid
        // out-parameters.
        let ret = fresh(|| unsafe { ffi::rdma_init_qp_attr(self.as_raw(), &mut attr, &mut mask) });
        self.check("rdma_init_qp_attr", ret)?;
        Ok(QueuePairAttribute::from_raw(
            attr,
            QpAttrMask::from_bits_retain(mask as u32),
        ))
    }

    /// Moves `qp` to each of `states` in turn with this id's attributes
    /// ([`init_qp_attr`](Self::init_qp_attr), then `ibv_modify_qp`).
    pub fn modify_qp(&self, qp: &QueuePair, states: &[QpTargetState]) -> Result<(), CmError> {
        for &state in states {
            let attr = self.init_qp_attr(state)?;
            qp.modify(&attr).map_err(|source| CmError::ModifyQp {
                endpoints: self.endpoints(),
                source: Box::new(source),
            })?;
        }
        Ok(())
    }

    /// Creates a QP for this id (`rdma_create_qp`) with `builder`'s settings (its PD, CQs,
    /// capacities, `sq_sig_all`, SRQ): a classic QP, RC on `Tcp` ids and UD on `Udp` ids
    /// (set [`QpType::Ud`] on the builder for those). The PD and CQs must come from the
    /// id's [`device_context`](Self::device_context).
    ///
    /// The QP is an ordinary [`QueuePair`], posted with the same guards. librdmacm moves it
    /// through its states as the connection proceeds (to Init here; RTR and RTS in
    /// [`connect`](Self::connect) or [`accept`](Self::accept) and their events; Error on
    /// [`disconnect`](Self::disconnect)), so the program never modifies it. It holds the
    /// id's `Arc`; dropping it leaves the multicast groups the id joined, destroys it, and
    /// leaves the id without a QP, ready for another.
    ///
    /// ```no_run
    /// # fn demo(id: &std::sync::Arc<sideway::rdmacm::CmId>) -> Result<(), Box<dyn std::error::Error>> {
    /// let ctx = id.device_context()?;
    /// let pd = ctx.alloc_pd()?;
    /// let cq = ctx.create_cq_builder().cqe(64).build()?;
    /// let mut qp = id.create_qp(pd.create_qp_builder().send_cq(&cq).recv_cq(&cq).max_send_wr(16))?;
    /// let buf = pd.reg_buffer(64, sideway::memory_region::AccessFlags::LOCAL_WRITE)?;
    /// qp.start_post_recv().recv(1, &[buf.sge(0..64).unwrap()]).post()?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "rdma_create_qp")]
    #[doc(alias = "ibv_qp_init_attr")]
    pub fn create_qp(self: &Arc<Self>, builder: &QueuePairBuilder) -> Result<QueuePair, CmError> {
        let expected = match self.port_space() {
            PortSpace::Tcp => QpType::Rc,
            PortSpace::Udp => QpType::Ud,
        };
        if builder.asked_qp_type() != expected {
            return Err(CmError::QpTypeMismatch {
                port_space: self.port_space(),
                asked: builder.asked_qp_type(),
                expected,
            });
        }
        let (mut init, send_cq, recv_cq) =
            builder
                .classic_init_attr()
                .map_err(|source| CmError::CreateQp {
                    endpoints: self.endpoints(),
                    source: Box::new(source),
                })?;
        let pd = builder.protection_domain();
        let channel = lock(self.channel_slot());
        let _guard = channel.guard();
        let raw = self.as_raw();
        // SAFETY: the id is alive and the lock held; plain fields.
        let (verbs, existing) = unsafe { ((*raw).verbs, (*raw).qp) };
        if verbs.is_null() {
            return Err(CmError::NotBound {
                endpoints: self.endpoints_locked(),
            });
        }
        if !existing.is_null() {
            return Err(CmError::QpExists {
                endpoints: self.endpoints_locked(),
                // SAFETY: a QP the id points to is alive (its QueuePair clears the pointer
                // before destroying it); qp_num never changes.
                qp_num: unsafe { (*existing).qp_num },
            });
        }
        for ctx in [pd.context(), send_cq.context(), recv_cq.context()] {
            if ctx.as_raw() != verbs {
                return Err(CmError::ForeignContext {
                    call: "rdma_create_qp",
                    id_device: device_name(verbs),
                    other_device: ctx.name().to_owned(),
                });
            }
        }
        // SAFETY: the id is alive, bound to the device of the PD and CQs (checked above),
        // and has no QP; init is valid for the call, which writes back the granted
        // capacities.
        let ret = fresh(|| unsafe { ffi::rdma_create_qp(raw, pd.as_raw(), &mut init) });
        self.check("rdma_create_qp", ret)?;
        // SAFETY: the call succeeded, so it set the id's QP.
        let Some(qp) = NonNull::new(unsafe { (*raw).qp }) else {
            return Err(self.call_err(
                "rdma_create_qp",
                std::io::Error::from_raw_os_error(libc::EFAULT),
            ));
        };
        let id = Arc::clone(self);
        let destroy = Box::new(move |qp: NonNull<ffi::ibv_qp>| id.destroy_qp(qp));
        // SAFETY: qp was just made by rdma_create_qp on the builder's PD with init (and its
        // CQs); only `destroy` destroys it.
        Ok(unsafe { builder.wrap_foreign(qp, init.cap, send_cq, recv_cq, destroy) })
    }

    /// Destroys the id's QP, `qp`, from its `QueuePair`'s drop: what `rdma_destroy_qp`
    /// does for a QP whose CQs the caller gave (`ibv_destroy_qp`, then the id's QP pointer
    /// cleared), with the failure reported.
    fn destroy_qp(&self, qp: NonNull<ffi::ibv_qp>) {
        let channel = lock(self.channel_slot());
        let _guard = channel.guard();
        // A QP attached to multicast groups cannot be destroyed: leave them first.
        self.leave_groups_locked();
        // SAFETY: qp is the id's live QP, destroyed once, here; no guard on it is alive.
        let ret = fresh(|| unsafe { ffi::ibv_destroy_qp(qp.as_ptr()) });
        match from_ret(ret) {
            Ok(()) => {
                let raw = self.as_raw();
                // SAFETY: the id is alive and the lock held; librdmacm reads this field to
                // find the id's QP, which is gone.
                unsafe {
                    if (*raw).qp == qp.as_ptr() {
                        (*raw).qp = std::ptr::null_mut();
                    }
                }
            }
            Err(e) => {
                crate::diagnostics::report_drop_failure("ibv_destroy_qp", "an rdma_cm id's QP", &e)
            }
        }
    }

    /// The number of the QP created on the id ([`create_qp`](Self::create_qp)), if any.
    pub fn qp_num(&self) -> Option<u32> {
        let channel = lock(self.channel_slot());
        let _guard = channel.guard();
        // SAFETY: the id is alive and the lock held.
        let qp = unsafe { (*self.as_raw()).qp };
        // SAFETY: a QP the id points to is alive while the lock is held (its QueuePair
        // clears the pointer under the lock before destroying it); qp_num never changes.
        (!qp.is_null()).then(|| unsafe { (*qp).qp_num })
    }

    /// The raw QP created on the id (NULL when none). Valid while the [`QueuePair`] that
    /// [`create_qp`](Self::create_qp) returned is alive.
    pub fn qp_as_raw(&self) -> *mut ffi::ibv_qp {
        let channel = lock(self.channel_slot());
        let _guard = channel.guard();
        // SAFETY: the id is alive and the lock held.
        unsafe { (*self.as_raw()).qp }
    }

    fn owns(&self, qp: &QueuePair) -> bool {
        self.qp_as_raw() == qp.as_raw()
    }

    /// Moves a QP of the program's own that is still in Reset to Init.
    fn init_if_reset(&self, qp: &QueuePair) -> Result<(), CmError> {
        let state = qp.state().map_err(|source| CmError::QueryQp {
            endpoints: self.endpoints(),
            source: Box::new(source),
        })?;
        if state == QpState::Reset {
            self.modify_qp(qp, &[QpTargetState::Init])?;
        }
        Ok(())
    }

    /// Connects `qp` to the resolved destination and waits, at most `timeout` on this id's
    /// channel, until it can send; returns the event that carried the server's answer (its
    /// private data).
    ///
    /// - For the QP created on this id ([`create_qp`](Self::create_qp)): `rdma_connect`,
    ///   then [`EventType::Established`](super::EventType::Established) (librdmacm moves the QP to
    ///   RTR and RTS).
    /// - For a QP of the program's own (RC): Init if it is still in Reset,
    ///   `rdma_connect` naming it,
    ///   [`EventType::ConnectResponse`](super::EventType::ConnectResponse), then Init again (the
    ///   responder resources are known only now), RTR and RTS with the id's attributes, and
    ///   `rdma_establish`. An [`EventType::Established`](super::EventType::Established) may still
    ///   arrive on the channel afterwards; it says nothing new.
    ///
    /// The wait reads the channel's next events: give the id a channel of its own (or no
    /// other id with events pending). Post receives before calling (the server may send as
    /// soon as it has accepted); a QP of the program's own takes them once it is in Init
    /// ([`modify_qp`](Self::modify_qp) with [`QpTargetState::Init`]).
    pub fn connect_qp(
        &self,
        qp: &QueuePair,
        param: &ConnParam,
        timeout: Option<Duration>,
    ) -> Result<Event, CmError> {
        if self.owns(qp) {
            self.connect(param)?;
            return self.wait_for(EventType::Established, timeout);
        }
        self.init_if_reset(qp)?;
        let mut param = param.clone();
        param.qp_num(qp.qp_num());
        self.connect(&param)?;
        let answer = self.wait_for(EventType::ConnectResponse, timeout)?;
        self.modify_qp(
            qp,
            &[QpTargetState::Init, QpTargetState::Rtr, QpTargetState::Rts],
        )?;
        self.establish()?;
        Ok(answer)
    }

    /// Accepts the connection request this id came from with `qp` and waits, at most
    /// `timeout` on this id's channel, for
    /// [`EventType::Established`](super::EventType::Established), which it returns.
    ///
    /// - For the QP created on this id: `rdma_accept` (librdmacm moves the QP to RTR and
    ///   RTS).
    /// - For a QP of the program's own: Init if it is still in Reset, RTR and RTS with the
    ///   id's attributes, then `rdma_accept` naming it.
    ///
    /// The wait reads the channel's next events: [`migrate`](Self::migrate) the id to a
    /// channel of its own first when the listener's channel keeps taking requests. Post
    /// receives before calling (the client may send as soon as it is connected); a QP of the
    /// program's own takes them once it is in Init ([`modify_qp`](Self::modify_qp)).
    pub fn accept_qp(
        &self,
        qp: &QueuePair,
        param: &ConnParam,
        timeout: Option<Duration>,
    ) -> Result<Event, CmError> {
        if self.owns(qp) {
            self.accept(param)?;
        } else {
            self.init_if_reset(qp)?;
            self.modify_qp(qp, &[QpTargetState::Rtr, QpTargetState::Rts])?;
            let mut param = param.clone();
            param.qp_num(qp.qp_num());
            self.accept(&param)?;
        }
        self.wait_for(EventType::Established, timeout)
    }
}
