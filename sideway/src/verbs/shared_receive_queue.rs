//! Shared receive queues (`struct ibv_srq`): one pool of receive buffers that many queue
//! pairs take from.
//!
//! [`ProtectionDomain::create_srq_builder`] makes one; QPs attach with
//! [`QueuePairBuilder::srq`](crate::queue_pair::QueuePairBuilder::srq) and each holds the
//! SRQ's `Arc`. Receives are posted with [`SharedReceiveQueue::start_post_recv`] (one chained
//! `ibv_post_srq_recv` per batch, built in storage allocated with the SRQ). Arming the limit
//! ([`SharedReceiveQueue::arm_limit`]) makes the device raise
//! [`AsyncEventKind::SrqLimitReached`](crate::async_event::AsyncEventKind::SrqLimitReached)
//! once fewer receives than the limit are left, naming this SRQ.
//!
//! An XRC SRQ ([`SharedReceiveQueueBuilder::xrcd`], `ibv_create_srq_ex` with `IBV_SRQT_XRC`)
//! belongs to an [`XrcDomain`] and has a completion queue of its own: XRC senders name it
//! by its number ([`SharedReceiveQueue::srq_num`]), and its receives complete on that CQ. It
//! holds the domain, the CQ and the PD, so it is destroyed before any of them.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::os::raw::c_int;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use rdma_mummy_sys as ffi;

use crate::errno::{fresh, from_ret, non_null};
use crate::receive_batch::{sealed, ReceiveQueue, RecvBatch, RecvChain, RecvRefusal, RecvStorage};
use crate::verbs::completion_queue::CompletionQueue;
use crate::verbs::protection_domain::ProtectionDomain;
use crate::verbs::queue_pair::work_request::{which_failed, InvalidWorkRequest};
use crate::verbs::xrc_domain::XrcDomain;

/// Why an SRQ operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SharedReceiveQueueError {
    /// `ibv_create_srq` failed.
    #[error("ibv_create_srq with max_wr {max_wr}, max_sge {max_sge}, srq_limit {srq_limit} failed on {device}: {source}{}",
        if source.raw_os_error() == Some(libc::EINVAL) { " (more than the device's max_srq_wr / max_srq_sge?)" } else { "" })]
    Create {
        /// The device's name.
        device: String,
        /// Receives asked for.
        max_wr: u32,
        /// Entries per receive asked for.
        max_sge: u32,
        /// The limit asked for.
        srq_limit: u32,
        /// The errno.
        source: io::Error,
    },
    /// The PD is a parent domain bound to a thread domain. There the provider takes no SRQ
    /// lock, while this SRQ is `Sync` and completion polling on another thread returns its
    /// receives: not offered (make the SRQ on the protection domain).
    #[error(
        "an SRQ on a parent domain bound to a thread domain is not offered on {device}: \
         make it on the protection domain"
    )]
    ThreadBoundPd {
        /// The device's name.
        device: String,
    },
    /// `ibv_create_srq_ex` of an XRC SRQ failed; `EOPNOTSUPP` when the device has no XRC.
    #[error("ibv_create_srq_ex of an XRC SRQ with max_wr {max_wr}, max_sge {max_sge} failed on {device}: {source}{}",
        if matches!(source.raw_os_error(), Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS)) {
            " (not supported by this device: its provider has no XRC)"
        } else { "" })]
    CreateXrc {
        /// The device's name.
        device: String,
        /// Receives asked for.
        max_wr: u32,
        /// Entries per receive asked for.
        max_sge: u32,
        /// The errno.
        source: io::Error,
    },
    /// An XRC SRQ needs the completion queue its receives complete on.
    #[error("an XRC SRQ needs a completion queue: call cq() on the builder")]
    MissingCq,
    /// `ibv_get_srq_num` failed (an SRQ that is not XRC has no number).
    #[error("ibv_get_srq_num of SRQ {srq:#x} failed: {source}")]
    SrqNum {
        /// The SRQ's handle.
        srq: u32,
        /// The errno.
        source: io::Error,
    },
    /// `ibv_modify_srq` failed.
    #[error("ibv_modify_srq of SRQ {srq:#x} ({what}) failed: {source}")]
    Modify {
        /// The SRQ's handle.
        srq: u32,
        /// What was changed.
        what: String,
        /// The errno.
        source: io::Error,
    },
    /// `ibv_query_srq` failed.
    #[error("ibv_query_srq of SRQ {srq:#x} failed: {source}")]
    Query {
        /// The SRQ's handle.
        srq: u32,
        /// The errno.
        source: io::Error,
    },
    /// `ibv_post_srq_recv` failed.
    #[error("ibv_post_srq_recv failed on SRQ {srq:#x} {}: {source}", which_failed(*index, *wr_id, *count))]
    Post {
        /// The SRQ's handle.
        srq: u32,
        /// Requests in the batch.
        count: usize,
        /// The index in the batch of the first request not posted (`bad_wr`), when the verb
        /// says; those before it were posted.
        index: Option<usize>,
        /// That request's `wr_id`.
        wr_id: Option<u64>,
        /// The errno.
        source: io::Error,
    },
    /// A receive was refused while the batch was built; nothing was posted.
    #[error("receive {index} (wr_id {wr_id}) of a batch on SRQ {srq:#x} is invalid, nothing was posted: {reason}")]
    Invalid {
        /// The SRQ's handle.
        srq: u32,
        /// The request's index.
        index: usize,
        /// Its `wr_id`.
        wr_id: u64,
        /// What is wrong.
        reason: InvalidWorkRequest,
    },
}

/// Live SRQs by address, so an async event can hand back the sideway object.
type SrqRegistry = Mutex<HashMap<usize, Weak<SharedReceiveQueue>>>;

fn registry() -> &'static SrqRegistry {
    static REGISTRY: OnceLock<SrqRegistry> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(HashMap::new()))
}

fn lock_registry() -> MutexGuard<'static, HashMap<usize, Weak<SharedReceiveQueue>>> {
    // A panic while holding the lock leaves the map consistent (single inserts/removes).
    registry().lock().unwrap_or_else(|e| e.into_inner())
}

/// The SRQ at `raw`, if it is a live sideway SRQ.
pub(crate) fn lookup(raw: *mut ffi::ibv_srq) -> Option<Arc<SharedReceiveQueue>> {
    lock_registry().get(&(raw as usize)).and_then(Weak::upgrade)
}

impl ProtectionDomain {
    /// A builder for a shared receive queue on this protection domain.
    pub fn create_srq_builder(self: &Arc<Self>) -> SharedReceiveQueueBuilder {
        SharedReceiveQueueBuilder {
            pd: Arc::clone(self),
            max_wr: 128,
            max_sge: 1,
            srq_limit: 0,
            xrcd: None,
            cq: None,
        }
    }
}

/// Builds a [`SharedReceiveQueue`]; from [`ProtectionDomain::create_srq_builder`]. Setters
/// are named after the fields of `struct ibv_srq_attr`.
#[doc(alias = "ibv_srq_init_attr")]
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until build()"]
pub struct SharedReceiveQueueBuilder {
    pd: Arc<ProtectionDomain>,
    max_wr: u32,
    max_sge: u32,
    srq_limit: u32,
    xrcd: Option<Arc<XrcDomain>>,
    cq: Option<Arc<CompletionQueue>>,
}

impl SharedReceiveQueueBuilder {
    /// Makes an XRC SRQ of `xrcd` (`srq_type` `IBV_SRQT_XRC`, `xrcd`): senders on other
    /// nodes reach it through an XRC receive QP of the same domain, naming it by
    /// [`SharedReceiveQueue::srq_num`]. Needs [`cq`](Self::cq). The SRQ holds the domain.
    pub fn xrcd(&mut self, xrcd: &Arc<XrcDomain>) -> &mut Self {
        self.xrcd = Some(Arc::clone(xrcd));
        self
    }

    /// The completion queue an XRC SRQ's receives complete on (`cq`; required with
    /// [`xrcd`](Self::xrcd), ignored without). The SRQ holds it.
    pub fn cq(&mut self, cq: &Arc<CompletionQueue>) -> &mut Self {
        self.cq = Some(Arc::clone(cq));
        self
    }

    /// Most outstanding receives (`max_wr`; default 128). Also the most one batch holds.
    pub fn max_wr(&mut self, n: u32) -> &mut Self {
        self.max_wr = n;
        self
    }

    /// Most scatter/gather entries per receive (`max_sge`; default 1).
    pub fn max_sge(&mut self, n: u32) -> &mut Self {
        self.max_sge = n;
        self
    }

    /// The limit armed at creation (`srq_limit`; default 0, not armed). iWARP devices
    /// ignore it here; [`SharedReceiveQueue::arm_limit`] works everywhere.
    pub fn srq_limit(&mut self, n: u32) -> &mut Self {
        self.srq_limit = n;
        self
    }

    /// Creates the SRQ: `ibv_create_srq`, or for an XRC SRQ ([`xrcd`](Self::xrcd))
    /// `ibv_create_srq_ex` with `IBV_SRQ_INIT_ATTR_TYPE | _XRCD | _CQ | _PD`, which devices
    /// without XRC fail with `EOPNOTSUPP`.
    #[doc(alias = "ibv_create_srq")]
    #[doc(alias = "ibv_create_srq_ex")]
    pub fn build(&self) -> Result<Arc<SharedReceiveQueue>, SharedReceiveQueueError> {
        if self.pd.is_thread_bound() {
            return Err(SharedReceiveQueueError::ThreadBoundPd {
                device: self.pd.context().name().to_owned(),
            });
        }
        if let Some(xrcd) = &self.xrcd {
            return self.build_xrc(xrcd);
        }
        let mut init = ffi::ibv_srq_init_attr {
            srq_context: std::ptr::null_mut(),
            attr: ffi::ibv_srq_attr {
                max_wr: self.max_wr,
                max_sge: self.max_sge,
                srq_limit: self.srq_limit,
            },
        };
        // SAFETY: the PD is alive (the SRQ holds its Arc); init is fully initialised and the
        // verb writes the granted sizes back.
        let srq = fresh(|| unsafe { ffi::ibv_create_srq(self.pd.as_raw(), &mut init) });
        let raw = non_null(srq).map_err(|source| SharedReceiveQueueError::Create {
            device: self.pd.context().name().to_owned(),
            max_wr: self.max_wr,
            max_sge: self.max_sge,
            srq_limit: self.srq_limit,
            source,
        })?;
        Ok(self.wrap(raw, init.attr))
    }

    fn build_xrc(
        &self,
        xrcd: &Arc<XrcDomain>,
    ) -> Result<Arc<SharedReceiveQueue>, SharedReceiveQueueError> {
        let cq = self.cq.as_ref().ok_or(SharedReceiveQueueError::MissingCq)?;
        use ffi::ibv_srq_init_attr_mask as m;
        let mut init = ffi::ibv_srq_init_attr_ex {
            srq_context: std::ptr::null_mut(),
            attr: ffi::ibv_srq_attr {
                max_wr: self.max_wr,
                max_sge: self.max_sge,
                srq_limit: self.srq_limit,
            },
            comp_mask: m::IBV_SRQ_INIT_ATTR_TYPE
                | m::IBV_SRQ_INIT_ATTR_XRCD
                | m::IBV_SRQ_INIT_ATTR_CQ
                | m::IBV_SRQ_INIT_ATTR_PD,
            srq_type: ffi::ibv_srq_type::IBV_SRQT_XRC,
            pd: self.pd.as_raw(),
            xrcd: xrcd.as_raw(),
            cq: cq.as_raw(),
            tm_cap: ffi::ibv_tm_cap::default(),
        };
        let ctx = self.pd.context();
        // SAFETY: the context, PD, XRC domain and CQ are alive (the SRQ will hold their
        // Arcs); init is fully initialised, comp_mask names exactly the fields set, and the
        // verb writes the granted sizes back.
        let srq = fresh(|| unsafe { ffi::ibv_create_srq_ex(ctx.as_raw(), &mut init) });
        let raw = non_null(srq).map_err(|source| SharedReceiveQueueError::CreateXrc {
            device: ctx.name().to_owned(),
            max_wr: self.max_wr,
            max_sge: self.max_sge,
            source,
        })?;
        Ok(self.wrap(raw, init.attr))
    }

    /// Wraps an SRQ of a PD whose context came from
    /// [`DeviceContext::from_raw_parts`](crate::device::DeviceContext::from_raw_parts) (a test
    /// double's), as if it had granted exactly the builder's sizes: dropping it calls no
    /// destroy verb.
    ///
    /// # Safety
    ///
    /// The builder's PD belongs to a context from `DeviceContext::from_raw_parts`, whose
    /// contract (data path only) applies to the returned SRQ too; `raw` is an SRQ of that
    /// context, valid until the context's owner is dropped.
    #[doc(hidden)]
    pub unsafe fn wrap_raw(&self, raw: NonNull<ffi::ibv_srq>) -> Arc<SharedReceiveQueue> {
        self.wrap(
            raw,
            ffi::ibv_srq_attr {
                max_wr: self.max_wr,
                max_sge: self.max_sge,
                srq_limit: self.srq_limit,
            },
        )
    }

    fn wrap(
        &self,
        raw: NonNull<ffi::ibv_srq>,
        granted: ffi::ibv_srq_attr,
    ) -> Arc<SharedReceiveQueue> {
        let pick = |granted: u32, asked: u32| if granted == 0 { asked } else { granted };
        let max_sge = pick(granted.max_sge, self.max_sge);
        // Batches are sized by what was asked: more could not be outstanding.
        let batch = self.max_wr.min(pick(granted.max_wr, self.max_wr));
        let srq = Arc::new(SharedReceiveQueue {
            raw,
            storage: Mutex::new(RecvStorage::new(batch, max_sge)),
            max_wr: pick(granted.max_wr, self.max_wr),
            max_sge,
            xrc: self.xrcd.as_ref().and_then(|xrcd| {
                self.cq.as_ref().map(|cq| XrcParts {
                    cq: Arc::clone(cq),
                    xrcd: Arc::clone(xrcd),
                })
            }),
            pd: Arc::clone(&self.pd),
        });
        lock_registry().insert(raw.as_ptr() as usize, Arc::downgrade(&srq));
        srq
    }
}

/// A shared receive queue; destroyed (`ibv_destroy_srq`) on drop, after every QP using it
/// (they hold its `Arc`). Holds its protection domain.
#[doc(alias = "ibv_srq")]
#[doc(alias = "ibv_destroy_srq")]
pub struct SharedReceiveQueue {
    raw: NonNull<ffi::ibv_srq>,
    /// Where batches are built; the lock makes one batch at a time per SRQ.
    storage: Mutex<RecvStorage>,
    max_wr: u32,
    max_sge: u32,
    /// An XRC SRQ's domain and CQ; dropped after the SRQ is destroyed, before the PD.
    xrc: Option<XrcParts>,
    pd: Arc<ProtectionDomain>,
}

/// What an XRC SRQ holds besides its PD.
struct XrcParts {
    cq: Arc<CompletionQueue>,
    xrcd: Arc<XrcDomain>,
}

// SAFETY: libibverbs SRQs may be used from any thread (ibv_post_srq_recv is thread-safe);
// the batch storage is behind a Mutex.
unsafe impl Send for SharedReceiveQueue {}
// SAFETY: as above.
unsafe impl Sync for SharedReceiveQueue {}

impl SharedReceiveQueue {
    /// The raw `ibv_srq`, valid while this SRQ is alive.
    pub fn as_raw(&self) -> *mut ffi::ibv_srq {
        self.raw.as_ptr()
    }

    /// The kernel's handle of the SRQ, which names it in messages.
    pub fn handle(&self) -> u32 {
        // SAFETY: raw is live; handle is set at creation and never changes.
        unsafe { (*self.raw.as_ptr()).handle }
    }

    /// Receives the device granted.
    pub fn max_wr(&self) -> u32 {
        self.max_wr
    }

    /// Entries per receive the device granted.
    pub fn max_sge(&self) -> u32 {
        self.max_sge
    }

    /// The protection domain.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// The XRC domain of an XRC SRQ, `None` for a basic one.
    pub fn xrcd(&self) -> Option<&Arc<XrcDomain>> {
        self.xrc.as_ref().map(|x| &x.xrcd)
    }

    /// The completion queue of an XRC SRQ, `None` for a basic one.
    pub fn cq(&self) -> Option<&Arc<CompletionQueue>> {
        self.xrc.as_ref().map(|x| &x.cq)
    }

    /// The SRQ number of an XRC SRQ (`ibv_get_srq_num`), which XRC senders name in each
    /// send (`remote_srqn`). A basic SRQ has none: the verb fails (`EOPNOTSUPP` or
    /// `EINVAL`, depending on the provider).
    #[doc(alias = "ibv_get_srq_num")]
    pub fn srq_num(&self) -> Result<u32, SharedReceiveQueueError> {
        let mut num = 0u32;
        // SAFETY: raw is live; num is a valid out-parameter.
        let ret = fresh(|| unsafe { ffi::ibv_get_srq_num(self.raw.as_ptr(), &mut num) });
        from_ret(ret).map_err(|source| SharedReceiveQueueError::SrqNum {
            srq: self.handle(),
            source,
        })?;
        Ok(num)
    }

    /// Arms the limit event (`ibv_modify_srq` with `IBV_SRQ_LIMIT`): once fewer than
    /// `limit` receives are left, the device raises one `SrqLimitReached` async event and
    /// disarms. Arm it again after refilling.
    #[doc(alias = "ibv_modify_srq")]
    pub fn arm_limit(&self, limit: u32) -> Result<(), SharedReceiveQueueError> {
        let mut attr = ffi::ibv_srq_attr {
            max_wr: 0,
            max_sge: 0,
            srq_limit: limit,
        };
        let mask = ffi::ibv_srq_attr_mask::IBV_SRQ_LIMIT as c_int;
        // SAFETY: raw is live; attr is valid and the verb reads only srq_limit.
        let ret = fresh(|| unsafe { ffi::ibv_modify_srq(self.raw.as_ptr(), &mut attr, mask) });
        from_ret(ret).map_err(|source| SharedReceiveQueueError::Modify {
            srq: self.handle(),
            what: format!("srq_limit {limit}"),
            source,
        })
    }

    /// Queries the current sizes and limit (`ibv_query_srq`): `(max_wr, max_sge,
    /// srq_limit)`, the limit being 0 once the event fired.
    #[doc(alias = "ibv_query_srq")]
    pub fn query(&self) -> Result<(u32, u32, u32), SharedReceiveQueueError> {
        let mut attr = ffi::ibv_srq_attr::default();
        // SAFETY: raw is live; attr is a valid out-parameter.
        let ret = fresh(|| unsafe { ffi::ibv_query_srq(self.raw.as_ptr(), &mut attr) });
        from_ret(ret).map_err(|source| SharedReceiveQueueError::Query {
            srq: self.handle(),
            source,
        })?;
        Ok((attr.max_wr, attr.max_sge, attr.srq_limit))
    }

    /// Starts a batch of receives, posted by one chained `ibv_post_srq_recv` on
    /// [`post`](RecvBatch::post). Holds the SRQ's batch lock until posted or dropped.
    #[doc(alias = "ibv_post_srq_recv")]
    pub fn start_post_recv(&self) -> SrqPostRecvGuard<'_> {
        RecvBatch::new((self, self.storage.lock().unwrap_or_else(|e| e.into_inner())))
    }
}

impl Drop for SharedReceiveQueue {
    fn drop(&mut self) {
        let key = self.raw.as_ptr() as usize;
        {
            let mut map = lock_registry();
            // Only our own entry: a new SRQ at the same address registers after this.
            if map.get(&key).is_some_and(|w| w.strong_count() == 0) {
                map.remove(&key);
            }
        }
        if !self.pd.context().owns_objects() {
            // A test double's SRQ: its owner frees it.
            return;
        }
        // SAFETY: raw came from ibv_create_srq and is destroyed once; every QP attached holds
        // this SRQ's Arc, so none is left.
        let ret = fresh(|| unsafe { ffi::ibv_destroy_srq(self.raw.as_ptr()) });
        if let Err(e) = from_ret(ret) {
            crate::diagnostics::report_drop_failure(
                "ibv_destroy_srq",
                "a shared receive queue",
                &e,
            );
        }
    }
}

impl fmt::Debug for SharedReceiveQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedReceiveQueue")
            .field("handle", &self.handle())
            .field("max_wr", &self.max_wr)
            .field("max_sge", &self.max_sge)
            .finish_non_exhaustive()
    }
}

/// A batch of receives for an SRQ; from [`SharedReceiveQueue::start_post_recv`]. The same
/// type as a queue pair's batch ([`RecvBatch`]), posted with `ibv_post_srq_recv`.
pub type SrqPostRecvGuard<'a> = RecvBatch<'a, SharedReceiveQueue>;

/// An SRQ receive batch after a receive was added to it; see [`RecvChain`].
pub type SrqPostRecvChain<'g, 'a> = RecvChain<'g, 'a, SharedReceiveQueue>;

impl sealed::Sealed for SharedReceiveQueue {}

impl ReceiveQueue for SharedReceiveQueue {
    type Error = SharedReceiveQueueError;
    /// The SRQ and its storage, locked: one batch at a time per SRQ.
    type Claim<'a> = (&'a SharedReceiveQueue, MutexGuard<'a, RecvStorage>);

    #[inline(always)]
    fn storage<'c>(claim: &'c mut Self::Claim<'_>) -> &'c mut RecvStorage {
        &mut claim.1
    }

    #[inline(always)]
    unsafe fn post(
        claim: &mut Self::Claim<'_>,
        head: *mut ffi::ibv_recv_wr,
        bad: &mut *mut ffi::ibv_recv_wr,
    ) -> c_int {
        // SAFETY: the SRQ is live (borrowed by the batch); head is a NULL-terminated chain in
        // its storage, which the batch holds locked, by the caller.
        unsafe { ffi::ibv_post_srq_recv(claim.0.raw.as_ptr(), head, bad) }
    }

    #[inline(always)]
    fn queue<'c>(claim: &'c Self::Claim<'_>) -> &'c SharedReceiveQueue {
        claim.0
    }

    // Built inline, as a constant-tagged Err, so the compiler sees that posting ends here and
    // the QP does not escape into a call the loop around a post could come back from.
    #[inline]
    fn refused(&self, index: usize, wr_id: u64, why: RecvRefusal) -> SharedReceiveQueueError {
        SharedReceiveQueueError::Invalid {
            srq: self.handle(),
            index,
            wr_id,
            reason: InvalidWorkRequest::from_refusal(why, "srq"),
        }
    }

    #[inline]
    fn failed(
        &self,
        count: usize,
        failed: Option<(usize, u64)>,
        source: io::Error,
    ) -> SharedReceiveQueueError {
        SharedReceiveQueueError::Post {
            srq: self.handle(),
            count,
            index: failed.map(|(i, _)| i),
            wr_id: failed.map(|(_, id)| id),
            source,
        }
    }

    fn id(&self) -> (&'static str, u32) {
        ("srq", self.handle())
    }
}

#[cfg(test)]
mod tests {
    use std::mem::MaybeUninit;

    use super::*;
    use crate::verbs::device::DeviceContext;

    /// A provider whose `post_srq_recv` posts the first receive of a chain and fails the
    /// second with ENOMEM, as a full SRQ does.
    unsafe extern "C" fn post_one_then_fail(
        _srq: *mut ffi::ibv_srq,
        wr: *mut ffi::ibv_recv_wr,
        bad: *mut *mut ffi::ibv_recv_wr,
    ) -> c_int {
        // SAFETY: the batch hands a chain of at least two receives (the test posts three).
        unsafe { *bad = (*wr).next };
        libc::ENOMEM
    }

    /// Plain C structs standing in for a provider's context, PD and SRQ.
    struct Fake {
        ctx: ffi::ibv_context,
        pd: ffi::ibv_pd,
        srq: ffi::ibv_srq,
    }

    /// Owns the [`Fake`] through a raw pointer, so that moving the owner leaves the pointers
    /// the wrappers hold valid (moving a `Box` would reassert its unique access and
    /// invalidate them, as Miri reports); frees it on drop, after the wrappers (declared
    /// after it).
    struct FakeOwner(NonNull<Fake>);

    impl Drop for FakeOwner {
        fn drop(&mut self) {
            // SAFETY: the pointer came from Box::leak in fake_srq and is freed only here.
            drop(unsafe { Box::from_raw(self.0.as_ptr()) });
        }
    }

    fn fake_srq(max_wr: u32) -> (FakeOwner, SharedReceiveQueue) {
        // SAFETY: all three are C structs of pointers and integers, for which zero is valid.
        let zeroed: Box<Fake> = Box::new(unsafe { MaybeUninit::zeroed().assume_init() });
        let fake = NonNull::from(Box::leak(zeroed));
        let owner = FakeOwner(fake);
        let fake = fake.as_ptr();
        // SAFETY: fake is a live, unshared allocation (just made); every pointer below is
        // derived from it, raw, so none invalidates another.
        let (ctx_raw, pd_raw, srq_raw) = unsafe {
            (*fake).ctx.ops.post_srq_recv = Some(post_one_then_fail);
            (*fake).srq.context = std::ptr::addr_of_mut!((*fake).ctx);
            (*fake).srq.handle = 0x5;
            (
                NonNull::new_unchecked(std::ptr::addr_of_mut!((*fake).ctx)),
                NonNull::new_unchecked(std::ptr::addr_of_mut!((*fake).pd)),
                NonNull::new_unchecked(std::ptr::addr_of_mut!((*fake).srq)),
            )
        };
        // SAFETY: the fake outlives the wrappers (the test drops them first); only the data
        // path (ibv_post_srq_recv through ops) and plain fields are used.
        let ctx = unsafe { DeviceContext::from_raw_parts(ctx_raw, "fake", Box::new(())) };
        // SAFETY: as above; the PD belongs to that context.
        let pd = unsafe { ProtectionDomain::from_raw_parts(pd_raw, &ctx) };
        let srq = SharedReceiveQueue {
            raw: srq_raw,
            storage: Mutex::new(RecvStorage::new(max_wr, 1)),
            max_wr,
            max_sge: 1,
            xrc: None,
            pd,
        };
        (owner, srq)
    }

    fn sge() -> crate::scatter_gather::Sge {
        // SAFETY: the fake provider never touches the memory.
        unsafe { crate::scatter_gather::Sge::from_raw_parts(0x1000, 64, 7) }
    }

    #[test]
    fn a_failed_srq_post_names_the_receive_and_its_wr_id() {
        let (_fake, srq) = fake_srq(4);
        let err = srq
            .start_post_recv()
            .recv(10, &[sge()])
            .recv(11, &[sge()])
            .recv(12, &[sge()])
            .post()
            .unwrap_err();
        match &err {
            SharedReceiveQueueError::Post {
                srq: 0x5,
                count: 3,
                index: Some(1),
                wr_id: Some(11),
                source,
            } => assert_eq!(source.raw_os_error(), Some(libc::ENOMEM)),
            other => panic!("not the second receive's failure: {other:?}"),
        }
        let text = err.to_string();
        assert!(
            text.contains("at work request 1 (wr_id 11) of 3; the 1 before it were posted"),
            "{text}"
        );
    }

    #[test]
    fn a_receive_the_srq_batch_cannot_take_is_named_and_nothing_is_posted() {
        let (_fake, srq) = fake_srq(2);
        let mut batch = srq.start_post_recv();
        batch.recv(1, &[sge()]).recv(2, &[sge()]).recv(3, &[sge()]);
        match batch.post().unwrap_err() {
            SharedReceiveQueueError::Invalid {
                srq: 0x5,
                index: 2,
                wr_id: 3,
                reason:
                    InvalidWorkRequest::BatchFull {
                        capacity: 2,
                        queue: "srq",
                    },
            } => {}
            other => panic!("not the third receive's refusal: {other:?}"),
        }
        let err = srq
            .start_post_recv()
            .recv(4, &[sge(), sge()])
            .post()
            .unwrap_err();
        assert!(
            matches!(
                err,
                SharedReceiveQueueError::Invalid {
                    index: 0,
                    wr_id: 4,
                    reason: InvalidWorkRequest::TooManySge {
                        given: 2,
                        max: 1,
                        queue: "srq"
                    },
                    ..
                }
            ),
            "{err:?}"
        );
    }
}
