//! The queue pair itself: creating it, its states, connecting two.

use std::fmt;
use std::io;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::os::raw::c_int;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_mummy_sys as ffi;

use crate::errno::{fresh, from_ret, non_null};
use crate::gid::Gid;
use crate::verbs::completion_queue::CompletionQueue;
use crate::verbs::device::{DeviceError, Mtu};
use crate::verbs::memory_region::AccessFlags;
use crate::verbs::parent_domain::ParentDomain;
use crate::verbs::protection_domain::ProtectionDomain;

use super::attr::{QpAttrMask, QpCapabilities, QpState, QpType, QueuePairAttribute};
use super::error::{ConnectError, ModifyQpError, QueryQpError, QueuePairError};
use super::state_table::diagnose;
use super::work_request::SendOpsFlags;
use crate::verbs::address_handle::AddressVector;

mod threading {
    pub trait Sealed {
        /// True for [`super::OneThread`].
        const ONE_THREAD: bool;
    }
}

/// Whether a [`QueuePair`] may be used from several threads: [`AnyThread`] (the default)
/// or [`OneThread`]. Sealed.
pub trait Threading: threading::Sealed + 'static {}

/// A queue pair that is `Send` and `Sync` (the default): posting takes `&mut`, so one
/// batch at a time per QP, whatever the provider's locking.
#[derive(Debug, Clone, Copy)]
pub enum AnyThread {}

/// A queue pair bound to a thread domain ([`ParentDomain::create_qp_builder`]): neither
/// `Send` nor `Sync`, and neither are its builder and posting guards. The QPs of one thread
/// domain share provider state (mlx5: the domain's doorbell register, written with no lock),
/// so per-QP `&mut` is not enough: they all stay on the thread that made them.
#[derive(Debug, Clone, Copy)]
pub struct OneThread {
    _not_send: PhantomData<*const ()>,
}

impl threading::Sealed for AnyThread {
    const ONE_THREAD: bool = false;
}
impl threading::Sealed for OneThread {
    const ONE_THREAD: bool = true;
}
impl Threading for AnyThread {}
impl Threading for OneThread {}

impl ProtectionDomain {
    /// A builder for a queue pair on this protection domain.
    pub fn create_qp_builder(self: &Arc<Self>) -> QueuePairBuilder {
        QueuePairBuilder::on(self)
    }
}

impl ParentDomain {
    /// A builder for a queue pair on this parent domain, bound to one thread
    /// ([`OneThread`]): the QP, its builder and its posting guards are neither `Send` nor
    /// `Sync`, so all the QPs of the parent domain's thread domain are posted from the
    /// thread that made them. Without a thread domain, [`ParentDomain::as_pd`]'s builder
    /// (or the PD's own builder) makes ordinary QPs.
    ///
    /// ```compile_fail,E0277
    /// # fn demo(parent: &sideway::parent_domain::ParentDomain, cq: &std::sync::Arc<sideway::completion_queue::CompletionQueue>)
    /// #     -> Result<(), Box<dyn std::error::Error>> {
    /// let qp = parent.create_qp_builder().send_cq(cq).recv_cq(cq).build_ex()?;
    /// std::thread::spawn(move || drop(qp)); // the QP cannot leave its thread
    /// # Ok(()) }
    /// ```
    ///
    /// ```compile_fail,E0277
    /// # fn demo(parent: &sideway::parent_domain::ParentDomain, cq: &std::sync::Arc<sideway::completion_queue::CompletionQueue>)
    /// #     -> Result<(), Box<dyn std::error::Error>> {
    /// let mut qp = parent.create_qp_builder().send_cq(cq).recv_cq(cq).build_ex()?;
    /// let qp_ref = &qp;
    /// std::thread::scope(|s| {
    ///     s.spawn(move || qp_ref.qp_num()); // nor be used from two threads
    /// });
    /// # Ok(()) }
    /// ```
    ///
    /// ```compile_fail,E0277
    /// # fn demo(parent: &sideway::parent_domain::ParentDomain, cq: &std::sync::Arc<sideway::completion_queue::CompletionQueue>)
    /// #     -> Result<(), Box<dyn std::error::Error>> {
    /// let mut qp = parent.create_qp_builder().send_cq(cq).recv_cq(cq).build_ex()?;
    /// let batch = qp.start_post_send();
    /// std::thread::scope(|s| {
    ///     s.spawn(move || batch.post()); // nor ring its doorbell on another thread
    /// });
    /// # Ok(()) }
    /// ```
    ///
    /// The same three with an ordinary QP compile:
    ///
    /// ```
    /// # fn demo(pd: &std::sync::Arc<sideway::protection_domain::ProtectionDomain>,
    /// #         cq: &std::sync::Arc<sideway::completion_queue::CompletionQueue>)
    /// #     -> Result<(), Box<dyn std::error::Error>> {
    /// let mut qp = pd.create_qp_builder().send_cq(cq).recv_cq(cq).build_ex()?;
    /// let qp_ref = &qp;
    /// std::thread::scope(|s| {
    ///     s.spawn(move || qp_ref.qp_num());
    /// });
    /// let batch = qp.start_post_send();
    /// std::thread::scope(|s| {
    ///     s.spawn(move || batch.post());
    /// });
    /// std::thread::spawn(move || drop(qp));
    /// # Ok(()) }
    /// ```
    pub fn create_qp_builder(&self) -> QueuePairBuilder<OneThread> {
        QueuePairBuilder::on(self.pd_inner())
    }
}

impl<T: Threading> QueuePairBuilder<T> {
    fn on(pd: &Arc<ProtectionDomain>) -> Self {
        QueuePairBuilder {
            pd: Arc::clone(pd),
            send_cq: None,
            recv_cq: None,
            cap: QpCapabilities {
                max_send_wr: 128,
                max_recv_wr: 128,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
            qp_type: QpType::Rc,
            send_ops_flags: SendOpsFlags::default(),
            send_ops_set: false,
            srq: None,
            threading: PhantomData,
        }
    }
}

/// Builds a [`QueuePair`]; from [`ProtectionDomain::create_qp_builder`]. Setters are named
/// after the fields of `struct ibv_qp_init_attr(_ex)`.
#[doc(alias = "ibv_qp_init_attr")]
#[doc(alias = "ibv_qp_init_attr_ex")]
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until build() or build_ex()"]
pub struct QueuePairBuilder<T: Threading = AnyThread> {
    pd: Arc<ProtectionDomain>,
    send_cq: Option<Arc<CompletionQueue>>,
    recv_cq: Option<Arc<CompletionQueue>>,
    cap: QpCapabilities,
    sq_sig_all: bool,
    qp_type: QpType,
    send_ops_flags: SendOpsFlags,
    /// Whether send_ops_flags() was called; otherwise the default depends on the QP type.
    send_ops_set: bool,
    srq: Option<Arc<crate::verbs::shared_receive_queue::SharedReceiveQueue>>,
    threading: PhantomData<T>,
}

impl<T: Threading> QueuePairBuilder<T> {
    /// Takes receives from a shared receive queue instead of the QP's own (`srq`). The QP
    /// then posts no receives of its own; post them to the SRQ.
    pub fn srq(
        &mut self,
        srq: &Arc<crate::verbs::shared_receive_queue::SharedReceiveQueue>,
    ) -> &mut Self {
        self.srq = Some(Arc::clone(srq));
        self
    }

    fn srq_raw(&self) -> *mut ffi::ibv_srq {
        self.srq
            .as_ref()
            .map_or(std::ptr::null_mut(), |s| s.as_raw())
    }

    /// The send operations an extended QP is created with: those set, else what the
    /// QP type can post (UD: sends; UC: sends and writes; others: the full default).
    fn effective_send_ops(&self) -> SendOpsFlags {
        if self.send_ops_set {
            return self.send_ops_flags;
        }
        match self.qp_type {
            QpType::Ud => SendOpsFlags::SEND | SendOpsFlags::SEND_WITH_IMM,
            QpType::Uc => {
                SendOpsFlags::SEND
                    | SendOpsFlags::SEND_WITH_IMM
                    | SendOpsFlags::RDMA_WRITE
                    | SendOpsFlags::RDMA_WRITE_WITH_IMM
            }
            _ => self.send_ops_flags,
        }
    }

    /// The CQ that send completions go to (`send_cq`; required).
    pub fn send_cq(&mut self, cq: &Arc<CompletionQueue>) -> &mut Self {
        self.send_cq = Some(Arc::clone(cq));
        self
    }

    /// The CQ that receive completions go to (`recv_cq`; required, may be the send CQ;
    /// optional for an XRC send QP, which has no receive queue).
    pub fn recv_cq(&mut self, cq: &Arc<CompletionQueue>) -> &mut Self {
        self.recv_cq = Some(Arc::clone(cq));
        self
    }

    /// Most outstanding send work requests (`cap.max_send_wr`; default 128). Also the most
    /// work requests one classic [`PostSendGuard`](crate::queue_pair::PostSendGuard) batch holds.
    pub fn max_send_wr(&mut self, n: u32) -> &mut Self {
        self.cap.max_send_wr = n;
        self
    }

    /// Most outstanding receive work requests (`cap.max_recv_wr`; default 128).
    pub fn max_recv_wr(&mut self, n: u32) -> &mut Self {
        self.cap.max_recv_wr = n;
        self
    }

    /// Most scatter/gather entries per send request (`cap.max_send_sge`; default 1).
    pub fn max_send_sge(&mut self, n: u32) -> &mut Self {
        self.cap.max_send_sge = n;
        self
    }

    /// Most scatter/gather entries per receive request (`cap.max_recv_sge`; default 1).
    pub fn max_recv_sge(&mut self, n: u32) -> &mut Self {
        self.cap.max_recv_sge = n;
        self
    }

    /// Most inline bytes per send request (`cap.max_inline_data`; default 0).
    pub fn max_inline_data(&mut self, n: u32) -> &mut Self {
        self.cap.max_inline_data = n;
        self
    }

    /// Signal every send request, whatever its flags (`sq_sig_all`; default false).
    pub fn sq_sig_all(&mut self, all: bool) -> &mut Self {
        self.sq_sig_all = all;
        self
    }

    /// The transport (`qp_type`; default RC). An XRC send QP ([`QpType::XrcSend`]) needs
    /// only a send CQ and names the remote XRC SRQ in each send
    /// ([`WorkRequestBuilder::xrc_remote_srqn`](crate::queue_pair::WorkRequestBuilder::xrc_remote_srqn));
    /// an XRC receive QP is made on its XRC domain
    /// ([`XrcDomain::create_recv_qp`](crate::xrc_domain::XrcDomain::create_recv_qp)).
    /// A raw C value goes through `QpType::from(raw)`; the QP's type is read back from the
    /// created QP, and sends on a type this crate does not know are refused.
    pub fn qp_type(&mut self, qp_type: QpType) -> &mut Self {
        self.qp_type = qp_type;
        self
    }

    /// The operations an extended QP may post (`send_ops_flags`; default: all that
    /// [`PostSendGuard`](crate::queue_pair::PostSendGuard) offers). Used by
    /// [`build_ex`](Self::build_ex) only.
    pub fn send_ops_flags(&mut self, flags: SendOpsFlags) -> &mut Self {
        self.send_ops_flags = flags;
        self.send_ops_set = true;
        self
    }

    /// The CQs, once the builder is checked: every way of making a QP passes here.
    fn cqs(&self) -> Result<(Arc<CompletionQueue>, Arc<CompletionQueue>), QueuePairError> {
        if self.pd.is_thread_bound() && !<T as threading::Sealed>::ONE_THREAD {
            return Err(QueuePairError::ThreadBoundPd {
                device: self.pd.context().name().to_owned(),
            });
        }
        if self.qp_type == QpType::XrcRecv {
            return Err(QueuePairError::XrcRecvOnPd);
        }
        let send = self
            .send_cq
            .clone()
            .ok_or(QueuePairError::MissingCq { which: "send" })?;
        let recv = match (&self.recv_cq, self.qp_type) {
            (Some(cq), _) => Arc::clone(cq),
            // An XRC send QP has no receive queue: its receive CQ is optional, and the QP
            // reports its send CQ in its place.
            (None, QpType::XrcSend) => Arc::clone(&send),
            (None, _) => return Err(QueuePairError::MissingCq { which: "recv" }),
        };
        Ok((send, recv))
    }

    /// The receive CQ the create verb gets: NULL for an XRC send QP not given one.
    fn recv_cq_raw(&self, recv: &CompletionQueue) -> *mut ffi::ibv_cq {
        match (&self.recv_cq, self.qp_type) {
            (None, QpType::XrcSend) => std::ptr::null_mut(),
            _ => recv.as_raw(),
        }
    }

    /// The sizes asked for: an XRC send QP has no receive queue, so none there.
    fn asked_cap(&self) -> QpCapabilities {
        let mut cap = self.cap;
        if self.qp_type == QpType::XrcSend {
            cap.max_recv_wr = 0;
            cap.max_recv_sge = 0;
        }
        cap
    }

    fn create_err(&self, call: &'static str, source: io::Error) -> QueuePairError {
        QueuePairError::Create {
            call,
            device: self.pd.context().name().to_owned(),
            qp_type: self.qp_type,
            cap: self.asked_cap(),
            source,
        }
    }

    /// Creates a classic QP (`ibv_create_qp`), posted with chained `ibv_post_send`.
    #[doc(alias = "ibv_create_qp")]
    pub fn build(&self) -> Result<QueuePair<T>, QueuePairError> {
        let (send_cq, recv_cq) = self.cqs()?;
        let mut init = ffi::ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: send_cq.as_raw(),
            recv_cq: self.recv_cq_raw(&recv_cq),
            srq: self.srq_raw(),
            cap: self.asked_cap().into(),
            qp_type: self.qp_type.into(),
            sq_sig_all: c_int::from(self.sq_sig_all),
        };
        // SAFETY: the PD and CQs are alive (the QP will hold their Arcs); init is fully
        // initialised and the verb writes the granted sizes back into init.cap.
        let qp = fresh(|| unsafe { ffi::ibv_create_qp(self.pd.as_raw(), &mut init) });
        let raw = non_null(qp).map_err(|e| self.create_err("ibv_create_qp", e))?;
        // SAFETY: raw is the live QP just created.
        let qp_type = unsafe { created_type(raw) };
        Ok(self.wrap(raw, qp_type, None, init.cap.into(), send_cq, recv_cq))
    }

    /// Creates an extended QP (`ibv_create_qp_ex` with `IBV_QP_INIT_ATTR_PD |
    /// IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`, then `ibv_qp_to_qp_ex`), posted with
    /// `ibv_wr_start` .. `ibv_wr_complete`. Devices without it fail with `EOPNOTSUPP`;
    /// [`build`](Self::build) then works everywhere.
    #[doc(alias = "ibv_create_qp_ex")]
    #[doc(alias = "ibv_qp_to_qp_ex")]
    pub fn build_ex(&self) -> Result<QueuePair<T>, QueuePairError> {
        let (mut init, send_cq, recv_cq) = self.extended_init_attr()?;
        let ctx = self.pd.context();
        // SAFETY: the context, PD and CQs are alive; init is fully initialised, and comp_mask
        // names exactly the extended fields that are meaningful.
        let qp = fresh(|| unsafe { ffi::ibv_create_qp_ex(ctx.as_raw(), &mut init) });
        let raw = non_null(qp).map_err(|e| self.create_err("ibv_create_qp_ex", e))?;
        // SAFETY: raw is a live QP created with send_ops_flags, so it has an ibv_qp_ex.
        let ex = fresh(|| unsafe { ffi::ibv_qp_to_qp_ex(raw.as_ptr()) });
        let ex = match non_null(ex) {
            Ok(ex) => ex,
            Err(e) => {
                // SAFETY: raw is a live QP nothing else refers to; destroyed once.
                let _ = unsafe { ffi::ibv_destroy_qp(raw.as_ptr()) };
                return Err(self.create_err("ibv_qp_to_qp_ex", e));
            }
        };
        // SAFETY: raw is the live QP just created.
        let qp_type = unsafe { created_type(raw) };
        Ok(self.wrap(raw, qp_type, Some(ex), init.cap.into(), send_cq, recv_cq))
    }

    /// `struct ibv_qp_init_attr_ex` as [`build_ex`](Self::build_ex) passes it (comp_mask
    /// `IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`), and the CQs it names, which
    /// the QP must hold. Providers' direct verbs (`mlx5dv_create_qp`) take it too.
    pub(crate) fn extended_init_attr(
        &self,
    ) -> Result<
        (
            ffi::ibv_qp_init_attr_ex,
            Arc<CompletionQueue>,
            Arc<CompletionQueue>,
        ),
        QueuePairError,
    > {
        let (send_cq, recv_cq) = self.cqs()?;
        let init = ffi::ibv_qp_init_attr_ex {
            qp_context: std::ptr::null_mut(),
            send_cq: send_cq.as_raw(),
            recv_cq: self.recv_cq_raw(&recv_cq),
            srq: self.srq_raw(),
            cap: self.asked_cap().into(),
            qp_type: self.qp_type.into(),
            sq_sig_all: c_int::from(self.sq_sig_all),
            comp_mask: ffi::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD
                | ffi::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
            pd: self.pd.as_raw(),
            xrcd: std::ptr::null_mut(),
            create_flags: 0,
            max_tso_header: 0,
            rwq_ind_tbl: std::ptr::null_mut(),
            rx_hash_conf: ffi::ibv_rx_hash_conf {
                rx_hash_function: 0,
                rx_hash_key_len: 0,
                rx_hash_key: std::ptr::null_mut(),
                rx_hash_fields_mask: 0,
            },
            source_qpn: 0,
            send_ops_flags: self.effective_send_ops().bits(),
        };
        Ok((init, send_cq, recv_cq))
    }

    /// Wraps a QP of a context made by [`DeviceContext::from_raw_parts`]
    /// (a test double's) with this builder's settings, as if it had granted exactly the
    /// builder's capabilities: an extended QP when `ex` is given, a classic one otherwise.
    /// The QP is taken to be of the builder's type, whatever `raw->qp_type` says (a double
    /// may serve several types from one object), and posts are checked as for that type.
    /// Dropping it calls no destroy verb.
    ///
    /// # Safety
    ///
    /// The builder's PD belongs to a context from [`DeviceContext::from_raw_parts`], whose
    /// contract (data path only) applies to the returned QP too. `raw` is a QP of that
    /// context whose `context->ops.post_send` and `post_recv` are set, with room for the
    /// builder's capabilities; `ex`, when given, is the same object seen as `ibv_qp_ex`
    /// (what `ibv_qp_to_qp_ex(raw)` would return), whose `wr_*` entries are functions
    /// that do what verbs.h documents, or NULL (posting refuses an operation whose entry,
    /// or `wr_start`, `wr_complete` or `wr_abort`, is NULL, as for a real provider); they
    /// are read once, here, and must not change. Both stay valid until the context's owner
    /// is dropped.
    ///
    /// [`DeviceContext::from_raw_parts`]: crate::device::DeviceContext::from_raw_parts
    #[doc(hidden)]
    pub unsafe fn wrap_raw(
        &self,
        raw: NonNull<ffi::ibv_qp>,
        ex: Option<NonNull<ffi::ibv_qp_ex>>,
    ) -> Result<QueuePair<T>, QueuePairError> {
        let (send_cq, recv_cq) = self.cqs()?;
        Ok(self.wrap(raw, self.qp_type, ex, self.asked_cap(), send_cq, recv_cq))
    }

    /// The QP over `raw`, of type `qp_type`: what the C object is, which decides what every
    /// request posted on it must carry (a UD send's address, an XRC send's remote SRQ).
    fn wrap(
        &self,
        raw: NonNull<ffi::ibv_qp>,
        qp_type: QpType,
        ex: Option<NonNull<ffi::ibv_qp_ex>>,
        granted: QpCapabilities,
        send_cq: Arc<CompletionQueue>,
        recv_cq: Arc<CompletionQueue>,
    ) -> QueuePair<T> {
        // Providers report what they granted; some leave a field at 0, which means "as
        // asked".
        let pick = |granted: u32, asked: u32| if granted == 0 { asked } else { granted };
        let asked = self.asked_cap();
        let cap = QpCapabilities {
            max_send_wr: pick(granted.max_send_wr, asked.max_send_wr),
            max_recv_wr: pick(granted.max_recv_wr, asked.max_recv_wr),
            max_send_sge: pick(granted.max_send_sge, asked.max_send_sge),
            max_recv_sge: pick(granted.max_recv_sge, asked.max_recv_sge),
            max_inline_data: pick(granted.max_inline_data, asked.max_inline_data),
        };
        QueuePair {
            raw,
            // SAFETY: raw is the live QP being wrapped, of an open context.
            posts: unsafe { super::work_request::ProviderPosts::of(raw) },
            ex,
            qp_type,
            // Batches are sized by what was asked: a larger batch could not be outstanding.
            send: super::work_request::SendStorage::new(
                qp_type,
                asked.max_send_wr.min(cap.max_send_wr),
                cap.max_send_sge,
                cap.max_inline_data,
                // SAFETY: ex is the live extended QP being wrapped, just created (or a test
                // double's, whose entries wrap_raw's contract fixes); nothing else has it yet.
                ex.map(|ex| unsafe {
                    super::work_request::ExOps::of(ex, self.effective_send_ops())
                }),
            ),
            recv: crate::receive_batch::RecvStorage::new(
                asked.max_recv_wr.min(cap.max_recv_wr),
                cap.max_recv_sge,
            ),
            cap,
            send_cq,
            recv_cq,
            srq: self.srq.clone(),
            pd: Arc::clone(&self.pd),
            foreign: None,
            threading: PhantomData,
        }
    }
}

/// For the connection manager, which creates QPs through librdmacm (`rdma_create_qp`) from
/// a builder's settings and wraps them as ordinary [`QueuePair`]s.
impl QueuePairBuilder {
    /// The builder's protection domain.
    pub(crate) fn protection_domain(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// The QP type asked for.
    pub(crate) fn asked_qp_type(&self) -> QpType {
        self.qp_type
    }

    /// `struct ibv_qp_init_attr` with the builder's settings, and the CQs it names (which
    /// the QP must hold).
    pub(crate) fn classic_init_attr(
        &self,
    ) -> Result<
        (
            ffi::ibv_qp_init_attr,
            Arc<CompletionQueue>,
            Arc<CompletionQueue>,
        ),
        QueuePairError,
    > {
        let (send_cq, recv_cq) = self.cqs()?;
        let init = ffi::ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: send_cq.as_raw(),
            recv_cq: self.recv_cq_raw(&recv_cq),
            srq: self.srq_raw(),
            cap: self.asked_cap().into(),
            qp_type: self.qp_type.into(),
            sq_sig_all: c_int::from(self.sq_sig_all),
        };
        Ok((init, send_cq, recv_cq))
    }

    /// Wraps a classic QP created elsewhere from [`classic_init_attr`](Self::classic_init_attr),
    /// which `destroy` destroys when the QP is dropped.
    ///
    /// # Safety
    ///
    /// `raw` is a live QP made on this builder's PD with the attributes of
    /// `classic_init_attr` (`granted` holding the capacities written back), with these CQs;
    /// nothing but `destroy`, called once with `raw`, destroys it.
    pub(crate) unsafe fn wrap_foreign(
        &self,
        raw: NonNull<ffi::ibv_qp>,
        granted: ffi::ibv_qp_cap,
        send_cq: Arc<CompletionQueue>,
        recv_cq: Arc<CompletionQueue>,
        destroy: ForeignDestroy,
    ) -> QueuePair {
        // SAFETY: raw is a live QP (the caller's promise).
        let qp_type = unsafe { created_type(raw) };
        let mut qp = self.wrap(raw, qp_type, None, granted.into(), send_cq, recv_cq);
        qp.foreign = Some(destroy);
        qp
    }
}

/// For providers' direct verbs (`sideway::dv`), which create QPs with their own create verb
/// (`mlx5dv_create_qp`) from [`QueuePairBuilder::extended_init_attr`] and wrap them as
/// ordinary [`QueuePair`]s, destroyed with `ibv_destroy_qp`.
impl QueuePairBuilder {
    /// Wraps a QP this builder's context made through a provider's create verb, with this
    /// builder's settings (its QP type, send_ops_flags); `ex` is its extended handle, if any.
    ///
    /// # Safety
    ///
    /// `raw` is a live QP made on this builder's PD with these CQs (`granted` holding the
    /// capacities written back), destroyed by nothing but `ibv_destroy_qp` when the wrapper
    /// is dropped; `ex`, when given, is `ibv_qp_to_qp_ex(raw)` of a QP created with this
    /// builder's send_ops_flags.
    #[allow(dead_code)] // used by the provider modules, each behind its cargo feature
    pub(crate) unsafe fn wrap_created(
        &self,
        raw: NonNull<ffi::ibv_qp>,
        ex: Option<NonNull<ffi::ibv_qp_ex>>,
        granted: ffi::ibv_qp_cap,
        send_cq: Arc<CompletionQueue>,
        recv_cq: Arc<CompletionQueue>,
    ) -> QueuePair {
        // SAFETY: raw is a live QP (the caller's promise).
        let qp_type = unsafe { created_type(raw) };
        self.wrap(raw, qp_type, ex, granted.into(), send_cq, recv_cq)
    }

    /// Whether the builder names a shared receive queue.
    #[allow(dead_code)] // as above
    pub(crate) fn has_srq(&self) -> bool {
        self.srq.is_some()
    }
}

/// The type of a QP the C library made, as it recorded it (`ibv_qp::qp_type`): the type the
/// provider posts by, read back rather than trusted from the builder.
///
/// # Safety
///
/// `raw` is a live QP.
unsafe fn created_type(raw: NonNull<ffi::ibv_qp>) -> QpType {
    // SAFETY: the caller's promise: raw is live; libibverbs sets qp_type at creation and
    // never changes it.
    QpType::from(unsafe { (*raw.as_ptr()).qp_type })
}

/// A queue pair, classic or extended. Holds its protection domain and completion queues;
/// destroyed (`ibv_destroy_qp`) on drop.
#[doc(alias = "ibv_qp")]
#[doc(alias = "ibv_destroy_qp")]
#[doc(alias = "ibv_qp_ex")]
pub struct QueuePair<T: Threading = AnyThread> {
    pub(super) raw: NonNull<ffi::ibv_qp>,
    /// The provider's `post_send` and `post_recv`, read once when the QP was wrapped
    /// ([`super::work_request::ProviderPosts`]).
    pub(super) posts: super::work_request::ProviderPosts,
    pub(super) ex: Option<NonNull<ffi::ibv_qp_ex>>,
    pub(super) qp_type: QpType,
    pub(super) cap: QpCapabilities,
    pub(super) srq: Option<Arc<crate::verbs::shared_receive_queue::SharedReceiveQueue>>,
    pub(super) send: super::work_request::SendStorage,
    pub(super) recv: crate::receive_batch::RecvStorage,
    pub(super) send_cq: Arc<CompletionQueue>,
    pub(super) recv_cq: Arc<CompletionQueue>,
    pub(super) pd: Arc<ProtectionDomain>,
    /// Set for a QP another library created (rdma_cm's `rdma_create_qp`): destroys it in
    /// place of `ibv_destroy_qp`, and keeps alive what the QP's validity depends on (the id).
    pub(super) foreign: Option<ForeignDestroy>,
    /// [`AnyThread`] or [`OneThread`]: whether the QP is `Send` and `Sync`.
    pub(super) threading: PhantomData<T>,
}

/// Destroys a QP that [`QueuePairBuilder::wrap_foreign`] wrapped; called once, from `Drop`.
pub(crate) type ForeignDestroy = Box<dyn FnOnce(NonNull<ffi::ibv_qp>) + Send + Sync>;

// SAFETY: libibverbs QPs may be used from any thread. The storage the guards build batches
// in is reached only through `&mut self`, so moving the QP to another thread moves it whole.
unsafe impl Send for QueuePair<AnyThread> {}
// SAFETY: `&self` methods only call ibv_modify_qp/ibv_query_qp (thread-safe in libibverbs)
// and read immutable fields; posting needs `&mut self`.
unsafe impl Sync for QueuePair<AnyThread> {}

impl<T: Threading> Drop for QueuePair<T> {
    fn drop(&mut self) {
        if let Some(destroy) = self.foreign.take() {
            // No guard can be alive (they borrow the QP mutably); the CQs and PD outlive
            // this call (fields).
            destroy(self.raw);
            return;
        }
        if !self.pd.context().owns_objects() {
            // A test double's QP (QueuePairBuilder::wrap_raw): its owner frees it.
            return;
        }
        // SAFETY: raw came from a create verb and is destroyed exactly once; no guard can be
        // alive (they borrow the QP mutably). The CQs and PD outlive this call (fields).
        let ret = fresh(|| unsafe { ffi::ibv_destroy_qp(self.raw.as_ptr()) });
        if let Err(e) = from_ret(ret) {
            crate::diagnostics::report_drop_failure("ibv_destroy_qp", "a queue pair", &e);
        }
    }
}

impl<T: Threading> fmt::Debug for QueuePair<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueuePair")
            .field("qp_num", &format_args!("{:#x}", self.qp_num()))
            .field("qp_type", &self.qp_type)
            .field("extended", &self.ex.is_some())
            .field("cap", &self.cap)
            .finish_non_exhaustive()
    }
}

impl<T: Threading> QueuePair<T> {
    /// The QP number (`qp_num`), which the peer needs to reach this QP.
    #[inline]
    pub fn qp_num(&self) -> u32 {
        // SAFETY: raw is a live QP; qp_num is set at creation and never changes.
        unsafe { (*self.raw.as_ptr()).qp_num }
    }

    /// The transport type.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// True for a QP made by [`QueuePairBuilder::build_ex`].
    pub fn is_extended(&self) -> bool {
        self.ex.is_some()
    }

    /// The work queue sizes the device granted.
    pub fn cap(&self) -> QpCapabilities {
        self.cap
    }

    /// The raw `ibv_qp`, valid while this QP is alive.
    pub fn as_raw(&self) -> *mut ffi::ibv_qp {
        self.raw.as_ptr()
    }

    /// The raw `ibv_qp_ex` of an extended QP, `None` for a classic one.
    pub fn as_raw_ex(&self) -> Option<*mut ffi::ibv_qp_ex> {
        self.ex.map(NonNull::as_ptr)
    }

    /// The protection domain.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// The send completion queue.
    pub fn send_cq(&self) -> &Arc<CompletionQueue> {
        &self.send_cq
    }

    /// The receive completion queue (an XRC send QP made without one: its send CQ).
    pub fn recv_cq(&self) -> &Arc<CompletionQueue> {
        &self.recv_cq
    }

    /// The shared receive queue this QP takes receives from, if any.
    pub fn srq(&self) -> Option<&Arc<crate::verbs::shared_receive_queue::SharedReceiveQueue>> {
        self.srq.as_ref()
    }

    /// Modifies the QP's attributes and state (`ibv_modify_qp`) with the fields `attr` set.
    ///
    /// When the device rejects the mask (`EINVAL`), the error says which attributes the
    /// transition requires but lack, and which are not allowed, per the IB spec's table.
    #[doc(alias = "ibv_modify_qp")]
    pub fn modify(&self, attr: &QueuePairAttribute) -> Result<(), ModifyQpError> {
        // SAFETY: raw is this live QP, of type qp_type.
        unsafe { modify_qp(self.raw, self.qp_type, attr) }
    }

    /// Queries the attributes in `mask` (`ibv_query_qp`). The result's mask is `mask`.
    #[doc(alias = "ibv_query_qp")]
    pub fn query(&self, mask: QpAttrMask) -> Result<QueuePairAttribute, QueryQpError> {
        // SAFETY: raw is this live QP.
        unsafe { query_qp(self.raw, mask) }
    }

    /// The current state, from the device (`ibv_query_qp` with `IBV_QP_STATE`).
    #[doc(alias = "ibv_query_qp")]
    pub fn state(&self) -> Result<QpState, QueryQpError> {
        Ok(self.query(QpAttrMask::STATE)?.qp_state())
    }

    /// Queries (`ibv_query_port`, `ibv_query_gid_ex`) what the peer needs to connect to this
    /// QP: the port's LID, this QP's number, the first PSN it will send (`opts.sq_psn`), and
    /// the GID at `opts.gid_index`.
    #[doc(alias = "ibv_query_port")]
    #[doc(alias = "ibv_query_gid_ex")]
    pub fn local_endpoint(&self, opts: &ConnectOptions) -> Result<Endpoint, DeviceError> {
        let ctx = self.pd.context();
        let lid = ctx.query_port(opts.port_num)?.lid();
        let gid = ctx.query_gid(opts.port_num, opts.gid_index)?.gid;
        Ok(Endpoint {
            lid,
            qp_num: self.qp_num(),
            psn: opts.sq_psn,
            gid,
        })
    }

    /// Connects the QP to `remote` with three `ibv_modify_qp` calls: Reset to Init to RTR to
    /// RTS (RC and UC). A UD QP needs no peer: `remote` is ignored and the QP is made ready
    /// with `opts.qkey`.
    ///
    /// The path is global (a GRH, needed on RoCE) when `remote.gid` is not zero.
    #[doc(alias = "ibv_modify_qp")]
    pub fn connect(&self, opts: &ConnectOptions, remote: &Endpoint) -> Result<(), ConnectError> {
        let step_err = |step, source| ConnectError::Step {
            qp_num: self.qp_num(),
            remote_qp_num: remote.qp_num,
            step,
            source,
        };
        let ud = match self.qp_type {
            QpType::Rc | QpType::Uc => false,
            QpType::Ud => true,
            qp_type => {
                return Err(ConnectError::UnsupportedType {
                    qp_num: self.qp_num(),
                    qp_type,
                })
            }
        };
        let rc = self.qp_type == QpType::Rc;

        let mut init = QueuePairAttribute::new();
        init.set_qp_state(QpState::Init)
            .set_pkey_index(opts.pkey_index)
            .set_port_num(opts.port_num);
        if ud {
            init.set_qkey(opts.qkey);
        } else {
            init.set_qp_access_flags(opts.access);
        }
        self.modify(&init)
            .map_err(|e| step_err("1/3 (Reset to Init)", e))?;

        let mut rtr = QueuePairAttribute::new();
        rtr.set_qp_state(QpState::Rtr);
        if !ud {
            let mut av = AddressVector::new();
            av.set_dlid(remote.lid)
                .set_sl(opts.sl)
                .set_port_num(opts.port_num);
            if !remote.gid.is_zero() {
                av.set_is_global(true)
                    .set_dgid(remote.gid)
                    .set_sgid_index(opts.gid_index)
                    .set_hop_limit(opts.hop_limit)
                    .set_traffic_class(opts.traffic_class);
            }
            rtr.set_ah_attr(av)
                .set_path_mtu(opts.path_mtu)
                .set_dest_qp_num(remote.qp_num)
                .set_rq_psn(remote.psn);
            if rc {
                rtr.set_max_dest_rd_atomic(opts.max_dest_rd_atomic)
                    .set_min_rnr_timer(opts.min_rnr_timer);
            }
        }
        self.modify(&rtr)
            .map_err(|e| step_err("2/3 (Init to RTR)", e))?;

        let mut rts = QueuePairAttribute::new();
        rts.set_qp_state(QpState::Rts).set_sq_psn(opts.sq_psn);
        if rc {
            rts.set_timeout(opts.timeout)
                .set_retry_cnt(opts.retry_cnt)
                .set_rnr_retry(opts.rnr_retry)
                .set_max_rd_atomic(opts.max_rd_atomic);
        }
        self.modify(&rts)
            .map_err(|e| step_err("3/3 (RTR to RTS)", e))
    }
}

/// `ibv_modify_qp` of any QP, with the error [`QueuePair::modify`] documents.
///
/// # Safety
///
/// `raw` is a live QP of type `qp_type`.
pub(super) unsafe fn modify_qp(
    raw: NonNull<ffi::ibv_qp>,
    qp_type: QpType,
    attr: &QueuePairAttribute,
) -> Result<(), ModifyQpError> {
    let mut c_attr = *attr.as_raw();
    let mask = attr.mask();
    let mask_c = c_int::from_ne_bytes(mask.bits().to_ne_bytes());
    // SAFETY: raw is a live QP (the caller's promise); c_attr is a fully initialised
    // ibv_qp_attr the verb reads.
    let ret = fresh(|| unsafe { ffi::ibv_modify_qp(raw.as_ptr(), &mut c_attr, mask_c) });
    // SAFETY: as above.
    from_ret(ret).map_err(|source| unsafe { modify_error(raw, qp_type, attr, source) })
}

/// Builds the error of a failed modify; the slow path only.
///
/// # Safety
///
/// As [`modify_qp`].
#[cold]
unsafe fn modify_error(
    raw: NonNull<ffi::ibv_qp>,
    qp_type: QpType,
    attr: &QueuePairAttribute,
    source: io::Error,
) -> ModifyQpError {
    let mask = attr.mask();
    let from = if mask.contains(QpAttrMask::CUR_STATE) {
        attr.cur_qp_state()
    } else {
        // SAFETY: raw is a live QP (the caller's promise).
        match unsafe { query_qp(raw, QpAttrMask::STATE) } {
            Ok(a) => a.qp_state(),
            // SAFETY: raw is a live QP; libibverbs keeps `state` as of the last modify.
            Err(_) => QpState::from(unsafe { (*raw.as_ptr()).state }),
        }
    };
    let to = if mask.contains(QpAttrMask::STATE) {
        attr.qp_state()
    } else {
        from
    };
    let diagnosis =
        (source.raw_os_error() == Some(libc::EINVAL)).then(|| diagnose(qp_type, from, to, mask));
    ModifyQpError {
        // SAFETY: raw is a live QP; qp_num is set at creation and never changes.
        qp_num: unsafe { (*raw.as_ptr()).qp_num },
        qp_type,
        from,
        to,
        mask,
        diagnosis,
        source,
    }
}

/// `ibv_query_qp` of any QP, as [`QueuePair::query`].
///
/// # Safety
///
/// `raw` is a live QP.
pub(super) unsafe fn query_qp(
    raw: NonNull<ffi::ibv_qp>,
    mask: QpAttrMask,
) -> Result<QueuePairAttribute, QueryQpError> {
    let mut attr = *QueuePairAttribute::new().as_raw();
    let mut init = MaybeUninit::<ffi::ibv_qp_init_attr>::zeroed();
    let mask_c = c_int::from_ne_bytes(mask.bits().to_ne_bytes());
    // SAFETY: raw is a live QP (the caller's promise); attr and init are valid
    // out-parameters (init zeroed, a valid bit pattern for this plain C struct).
    let ret =
        fresh(|| unsafe { ffi::ibv_query_qp(raw.as_ptr(), &mut attr, mask_c, init.as_mut_ptr()) });
    from_ret(ret).map_err(|source| QueryQpError {
        // SAFETY: raw is a live QP; qp_num is set at creation and never changes.
        qp_num: unsafe { (*raw.as_ptr()).qp_num },
        mask,
        source,
    })?;
    Ok(QueuePairAttribute::from_raw(attr, mask))
}

/// What one side of a connection tells the other: the fields of rdma-core's pingpong
/// exchange (`LID:QPN:PSN:GID`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Endpoint {
    /// The port's LID (0 on RoCE; send the real one, InfiniBand needs it).
    pub lid: u16,
    /// The QP number.
    pub qp_num: u32,
    /// The first packet sequence number this side sends (24 bits).
    pub psn: u32,
    /// The port's GID; zero for a LID-routed InfiniBand path.
    pub gid: Gid,
}

/// Local settings for [`QueuePair::connect`], with sound defaults; setters are named after
/// the `ibv_qp_attr` fields they fill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "options do nothing until passed to connect()"]
pub struct ConnectOptions {
    port_num: u8,
    gid_index: u8,
    path_mtu: Mtu,
    sq_psn: u32,
    pkey_index: u16,
    qkey: u32,
    access: AccessFlags,
    timeout: u8,
    retry_cnt: u8,
    rnr_retry: u8,
    min_rnr_timer: u8,
    max_rd_atomic: u8,
    max_dest_rd_atomic: u8,
    sl: u8,
    hop_limit: u8,
    traffic_class: u8,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            port_num: 1,
            gid_index: 0,
            path_mtu: Mtu::Mtu1024,
            sq_psn: 0,
            pkey_index: 0,
            qkey: 0x1111_1111,
            access: AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 6,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            sl: 0,
            hop_limit: 1,
            traffic_class: 0,
        }
    }
}

impl ConnectOptions {
    /// The defaults: port 1, GID index 0, MTU 1024, PSN 0, timeout 14 (about 67 ms),
    /// retry_cnt 7, rnr_retry 6 (not 7, which retries forever), min_rnr_timer 12 (0.64 ms),
    /// one outstanding RDMA READ/atomic each way, access LOCAL_WRITE | REMOTE_WRITE |
    /// REMOTE_READ | REMOTE_ATOMIC, hop limit 1, Q_Key 0x11111111 (UD).
    pub fn new() -> Self {
        Self::default()
    }

    /// The local port (`port_num`; default 1).
    pub fn port_num(&mut self, port: u8) -> &mut Self {
        self.port_num = port;
        self
    }

    /// The local GID index the path is sent from (`ah_attr.grh.sgid_index`; default 0).
    pub fn gid_index(&mut self, index: u8) -> &mut Self {
        self.gid_index = index;
        self
    }

    /// The path MTU (`path_mtu`; default 1024). Use the smaller of both ports' active MTU.
    pub fn path_mtu(&mut self, mtu: Mtu) -> &mut Self {
        self.path_mtu = mtu;
        self
    }

    /// This side's first PSN (`sq_psn`; default 0); tell the peer the same value.
    pub fn sq_psn(&mut self, psn: u32) -> &mut Self {
        self.sq_psn = psn & 0xff_ffff;
        self
    }

    /// The P_Key index (`pkey_index`; default 0).
    pub fn pkey_index(&mut self, index: u16) -> &mut Self {
        self.pkey_index = index;
        self
    }

    /// The Q_Key of a UD QP (`qkey`; default 0x11111111).
    pub fn qkey(&mut self, qkey: u32) -> &mut Self {
        self.qkey = qkey;
        self
    }

    /// What the peer may do to this side (`qp_access_flags`; default all remote access).
    pub fn qp_access_flags(&mut self, access: AccessFlags) -> &mut Self {
        self.access = access;
        self
    }

    /// The ack timeout code (`timeout`; default 14).
    pub fn timeout(&mut self, timeout: u8) -> &mut Self {
        self.timeout = timeout;
        self
    }

    /// Transport retries (`retry_cnt`; default 7).
    pub fn retry_cnt(&mut self, n: u8) -> &mut Self {
        self.retry_cnt = n;
        self
    }

    /// RNR retries (`rnr_retry`; default 6). 7 means forever: a peer that never posts a
    /// receive then hangs the QP instead of failing it (and can soft-lock SoftRoCE).
    pub fn rnr_retry(&mut self, n: u8) -> &mut Self {
        self.rnr_retry = n;
        self
    }

    /// The RNR NAK timer code this side asks senders to wait (`min_rnr_timer`; default 12).
    pub fn min_rnr_timer(&mut self, code: u8) -> &mut Self {
        self.min_rnr_timer = code;
        self
    }

    /// Outstanding RDMA READs/atomics as initiator (`max_rd_atomic`; default 1).
    pub fn max_rd_atomic(&mut self, n: u8) -> &mut Self {
        self.max_rd_atomic = n;
        self
    }

    /// Incoming RDMA READs/atomics handled at once (`max_dest_rd_atomic`; default 1).
    pub fn max_dest_rd_atomic(&mut self, n: u8) -> &mut Self {
        self.max_dest_rd_atomic = n;
        self
    }

    /// The service level (`ah_attr.sl`; default 0).
    pub fn sl(&mut self, sl: u8) -> &mut Self {
        self.sl = sl;
        self
    }

    /// The hop limit of a global path (`ah_attr.grh.hop_limit`; default 1).
    pub fn hop_limit(&mut self, hop_limit: u8) -> &mut Self {
        self.hop_limit = hop_limit;
        self
    }

    /// The traffic class of a global path (`ah_attr.grh.traffic_class`; default 0).
    pub fn traffic_class(&mut self, traffic_class: u8) -> &mut Self {
        self.traffic_class = traffic_class;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::super::state_table::MaskDiagnosis;
    use super::*;

    /// The QP's type is what the C object records, in its one spelling: a UD QP is `Ud`
    /// whatever the builder held, so its sends are checked for an address.
    #[test]
    fn a_created_qp_has_the_type_the_library_recorded() {
        // SAFETY: ibv_qp is a C struct of integers, raw pointers and a mutex and condition
        // variable of plain bytes, for all of which all-zero bits are valid.
        let mut raw: ffi::ibv_qp = unsafe { std::mem::MaybeUninit::zeroed().assume_init() };
        for (c_type, want) in [
            (ffi::ibv_qp_type::IBV_QPT_UD, QpType::Ud),
            (ffi::ibv_qp_type::IBV_QPT_RC, QpType::Rc),
            (ffi::ibv_qp_type::IBV_QPT_XRC_SEND, QpType::XrcSend),
        ] {
            raw.qp_type = c_type;
            // SAFETY: raw is a live (if idle) ibv_qp, read once.
            assert_eq!(unsafe { created_type(NonNull::from(&mut raw)) }, want);
        }
        raw.qp_type = 77;
        // SAFETY: as above.
        let unknown = unsafe { created_type(NonNull::from(&mut raw)) };
        assert!(matches!(unknown, QpType::Unknown(v) if v.get() == 77));
    }

    fn einval() -> io::Error {
        io::Error::from_raw_os_error(libc::EINVAL)
    }

    #[test]
    fn modify_error_names_missing_and_forbidden_attributes() {
        let mask = QpAttrMask::STATE
            | QpAttrMask::AV
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN
            | QpAttrMask::PORT;
        let e = ModifyQpError {
            qp_num: 0x1a,
            qp_type: QpType::Rc,
            from: QpState::Init,
            to: QpState::Rtr,
            mask,
            diagnosis: Some(diagnose(QpType::Rc, QpState::Init, QpState::Rtr, mask)),
            source: einval(),
        };
        assert_eq!(
            e.to_string(),
            "failed to modify QP 0x1a from Init to RTR: missing attributes MinRnrTimer, \
             MaxDestRdAtomic; Port is not allowed here (EINVAL)"
        );
    }

    #[test]
    fn modify_error_for_impossible_transitions_and_other_errnos() {
        let e = ModifyQpError {
            qp_num: 0x2,
            qp_type: QpType::Rc,
            from: QpState::Reset,
            to: QpState::Rts,
            mask: QpAttrMask::STATE,
            diagnosis: Some(MaskDiagnosis::NoSuchTransition),
            source: einval(),
        };
        assert_eq!(
            e.to_string(),
            "failed to modify QP 0x2 from Reset to RTS: an RC QP has no transition from \
             Reset to RTS (EINVAL)"
        );
        let e = ModifyQpError {
            diagnosis: None,
            source: io::Error::from_raw_os_error(libc::ENOMEM),
            ..e
        };
        let text = e.to_string();
        assert!(
            text.starts_with("failed to modify QP 0x2 from Reset to RTS: "),
            "{text}"
        );
        assert!(text.contains("os error 12"), "{text}");
    }

    #[test]
    fn connect_defaults_are_safe() {
        let o = ConnectOptions::new();
        assert!(o.rnr_retry < 7, "rnr_retry 7 retries forever");
        assert_eq!((o.timeout, o.retry_cnt, o.min_rnr_timer), (14, 7, 12));
        assert_eq!((o.max_rd_atomic, o.max_dest_rd_atomic), (1, 1));
        assert!(o
            .access
            .contains(AccessFlags::REMOTE_ATOMIC | AccessFlags::LOCAL_WRITE));
        let mut o = o;
        o.sq_psn(0x1ff_ffff);
        assert_eq!(o.sq_psn, 0xff_ffff, "PSNs are 24 bits");
    }
}
