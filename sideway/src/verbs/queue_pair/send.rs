//! Posting send work requests: the send guard, its work request builder and chain.
//!
//! A classic QP's batch is a chain of `ibv_send_wr` (or `ibv_recv_wr`) with their
//! scatter/gather arrays, written into arrays the QP allocated when it was created (sized by
//! `max_send_wr` × `max_send_sge`), so posting allocates nothing. An extended QP's batch is
//! built by the provider itself between `ibv_wr_start` and `ibv_wr_complete`.
//!
//! Memory safety: an [`Sge`] is built bounds-checked from a registered region (or through an
//! `unsafe` constructor), and only the device dereferences it, after checking its lkey and
//! bounds; a stale or foreign SGE completes with a protection error rather than touching
//! memory. Inline data is different: the CPU copies it while posting, so it is borrowed for
//! the guard's lifetime, and the `INLINE` flag is set from the kind of data, never trusted
//! from the caller's flags (inline from an SGE would let the CPU read memory no one keeps
//! alive).

use std::fmt;
use std::os::raw::{c_int, c_void};
use std::ptr::NonNull;

use rdma_mummy_sys as ffi;

use super::qp::{AnyThread, QueuePair, Threading};
use super::work_request::{
    batch_full, dest_mismatch, not_for_qp_type, zeroed_send_wr, Dest, InvalidWorkRequest, Op,
    PostError, SendFlags, UdAddr,
};
use crate::errno::from_post_ret;
use crate::receive_batch::chain_index;
use crate::scatter_gather::{SendData, Sge};
use crate::verbs::address_handle::AddressHandle;

impl<T: Threading> QueuePair<T> {
    /// Starts a batch of send work requests (`ibv_wr_start` .. `ibv_wr_complete` on extended
    /// QPs, one chained `ibv_post_send` on classic ones).
    ///
    /// Nothing reaches the device until [`PostSendGuard::post`], which rings one doorbell
    /// for the whole batch. Dropping the guard unposted discards the batch (`ibv_wr_abort`
    /// on extended QPs). Leaking it (`mem::forget`) leaves an extended batch open, which
    /// blocks this QP's next batch on some providers.
    #[doc(alias = "ibv_wr_start")]
    #[doc(alias = "ibv_post_send")]
    #[inline]
    pub fn start_post_send(&mut self) -> PostSendGuard<'_, T> {
        PostSendGuard::new(self)
    }
}

/// A batch of send work requests being built; from [`QueuePair::start_post_send`].
///
/// Add requests with [`wr`](Self::wr), then [`post`](Self::post) them with one doorbell.
/// A request the batch cannot take (too many SGEs, inline data too long, ...) is remembered
/// and reported by `post`, which then posts nothing. Dropping the guard without posting
/// discards the batch (`ibv_wr_abort` on extended QPs). Inline data is borrowed for `'a`.
///
/// ```no_run
/// # fn demo(qp: &mut sideway::queue_pair::QueuePair, buf: &sideway::memory_region::RegisteredBuffer,
/// #         rkey: u32, raddr: u64) -> Result<(), Box<dyn std::error::Error>> {
/// use sideway::queue_pair::SendFlags;
/// let mut batch = qp.start_post_send();
/// batch
///     .wr(1, SendFlags::empty())
///     .rdma_write(rkey, raddr, buf.sge(0..4096).unwrap())
///     .wr(2, SendFlags::SIGNALED)
///     .send(b"done")
///     .wr(3, SendFlags::SIGNALED)
///     .atomic_fetch_add(rkey, raddr, 1, buf.sge(0..8).unwrap());
/// batch.post()?;
/// # Ok(()) }
/// ```
#[doc(alias = "ibv_send_wr")]
#[doc(alias = "ibv_wr_abort")]
#[must_use = "work requests reach the device only through post(); dropping the guard discards them"]
pub struct PostSendGuard<'a, T: Threading = AnyThread> {
    qp: &'a mut QueuePair<T>,
    /// Requests added. On an extended QP, `ibv_wr_start` was called (and not yet completed
    /// or aborted) exactly when this is above 0: the first request that passes its checks
    /// starts the batch, and every request that passes them is added.
    count: usize,
    /// The count at which a request takes the slow path: the storage's capacity, or 0 once a
    /// request was refused (recorded in `invalid`, which only `post` reads, and only then).
    /// One comparison per request thus both bounds the storage and stops every request
    /// after a refused one.
    limit: usize,
    invalid: Option<(usize, u64, InvalidWorkRequest)>,
}

impl<T: Threading> fmt::Debug for PostSendGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostSendGuard")
            .field("qp_num", &format_args!("{:#x}", self.qp.qp_num()))
            .field("count", &self.count)
            .field("invalid", &self.invalid)
            .finish()
    }
}

/// One send work request being described: pick its operation. From [`PostSendGuard::wr`].
#[doc(alias = "ibv_send_wr")]
#[must_use = "a work request is added only by one of its operation methods"]
pub struct WorkRequestBuilder<'g, 'a, T: Threading = AnyThread> {
    guard: &'g mut PostSendGuard<'a, T>,
    wr_id: u64,
    flags: SendFlags,
    dest: Dest,
}

impl<T: Threading> fmt::Debug for WorkRequestBuilder<'_, '_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkRequestBuilder")
            .field("wr_id", &self.wr_id)
            .field("flags", &self.flags)
            .finish()
    }
}

impl<'g, 'a, T: Threading> WorkRequestBuilder<'g, 'a, T> {
    #[inline(always)]
    fn add(self, op: Op, data: SendData<'a>) -> PostSendChain<'g, 'a, T> {
        self.guard.push(self.wr_id, self.flags, op, data, self.dest);
        PostSendChain { guard: self.guard }
    }

    /// Sends this request of a UD QP to `remote_qpn` with Q_Key `remote_qkey` through `ah`
    /// (`wr.ud` of `ibv_send_wr`; `ibv_wr_set_ud_addr` on extended QPs). Required on UD QPs,
    /// refused on others. The handle is borrowed until the batch is posted.
    #[doc(alias = "ibv_wr_set_ud_addr")]
    #[inline]
    pub fn ud_addr(mut self, ah: &'a AddressHandle, remote_qpn: u32, remote_qkey: u32) -> Self {
        self.dest = Dest::Ud(UdAddr {
            ah: ah.as_raw(),
            remote_qpn,
            remote_qkey,
        });
        self
    }

    /// Sends this request of an XRC send QP to the peer's XRC SRQ number `remote_srqn`
    /// (from its [`SharedReceiveQueue::srq_num`](crate::shared_receive_queue::SharedReceiveQueue::srq_num)):
    /// `qp_type.xrc.remote_srqn` of `ibv_send_wr`, `ibv_wr_set_xrc_srqn` on extended QPs.
    /// Required on XRC send QPs, refused on others.
    #[doc(alias = "ibv_wr_set_xrc_srqn")]
    #[doc(alias = "remote_srqn")]
    #[inline]
    pub fn xrc_remote_srqn(mut self, remote_srqn: u32) -> Self {
        self.dest = Dest::Xrc(remote_srqn);
        self
    }

    /// A SEND with invalidate (`IBV_WR_SEND_WITH_INV`, `ibv_wr_send_inv`): also invalidates
    /// the peer's memory window or region of `invalidate_rkey`, which the peer's receive
    /// completion reports.
    #[doc(alias = "ibv_wr_send_inv")]
    #[inline]
    pub fn send_with_invalidate(
        self,
        invalidate_rkey: u32,
        data: impl Into<SendData<'a>>,
    ) -> PostSendChain<'g, 'a, T> {
        self.add(Op::SendInv(invalidate_rkey), data.into())
    }

    /// A local invalidate (`IBV_WR_LOCAL_INV`, `ibv_wr_local_inv`) of this side's memory
    /// window (type 2) or region with `invalidate_rkey`.
    #[doc(alias = "ibv_wr_local_inv")]
    #[inline]
    pub fn local_invalidate(self, invalidate_rkey: u32) -> PostSendChain<'g, 'a, T> {
        self.add(Op::LocalInv(invalidate_rkey), SendData::Empty)
    }

    /// Binds a type 2 memory window (`IBV_WR_BIND_MW`, `ibv_wr_bind_mw`) to `range` of
    /// `mr` with `access`, under the new rkey `rkey` (from
    /// [`MemoryWindow::next_rkey`](crate::memory_window::MemoryWindow::next_rkey)). The
    /// window and region are borrowed until posting; the bind's completion says whether it
    /// took effect. From this call on, the window holds `mr` (an `Arc` clone) until the
    /// window is dropped, whether or not the bind is posted or takes effect, so the region
    /// outlives any binding (see [`crate::memory_window`]).
    ///
    /// The batch refuses the request ([`InvalidWorkRequest::BindAccess`], reported by
    /// `post`, which then posts nothing) when `access` asks for what `mr` does not allow:
    /// `mr` must be registered with `AccessFlags::MW_BIND`, and with `LOCAL_WRITE` for a
    /// window with remote write or remote atomic access.
    #[doc(alias = "ibv_wr_bind_mw")]
    #[inline]
    pub fn bind_mw(
        self,
        mw: &'a crate::verbs::memory_window::MemoryWindow,
        rkey: u32,
        mr: &'a std::sync::Arc<crate::verbs::memory_region::MemoryRegion>,
        range: std::ops::Range<u64>,
        access: crate::verbs::memory_region::AccessFlags,
    ) -> PostSendChain<'g, 'a, T> {
        let length = range.end.saturating_sub(range.start);
        let missing = crate::verbs::memory_window::bind_access_missing(mr.access(), length, access);
        if !missing.is_empty() {
            // Refused like any request the batch cannot take: the first refusal is the one
            // post reports.
            if self.guard.limit != 0 {
                let reason = InvalidWorkRequest::BindAccess {
                    access,
                    region_access: mr.access(),
                    missing,
                };
                self.guard.refuse(self.wr_id, reason);
            }
            return PostSendChain { guard: self.guard };
        }
        // Held before the request can reach the device, and until the window is deallocated:
        // should this bind never take effect, the window may be bound to a region held
        // earlier.
        mw.hold(mr);
        let info = ffi::ibv_mw_bind_info {
            mr: mr.as_raw(),
            addr: range.start,
            length,
            mw_access_flags: access.bits(),
        };
        self.add(
            Op::BindMw {
                mw: mw.as_raw(),
                rkey,
                info,
            },
            SendData::Empty,
        )
    }

    /// A SEND (`IBV_WR_SEND`, `ibv_wr_send`) of `data`, consuming a receive at the peer.
    #[doc(alias = "ibv_wr_send")]
    #[inline]
    pub fn send(self, data: impl Into<SendData<'a>>) -> PostSendChain<'g, 'a, T> {
        self.add(Op::Send, data.into())
    }

    /// A SEND with immediate data (`IBV_WR_SEND_WITH_IMM`, `ibv_wr_send_imm`); `imm` is
    /// in host order and arrives as
    /// [`WorkCompletion::imm_data`](crate::completion_queue::WorkCompletion::imm_data).
    #[doc(alias = "ibv_wr_send_imm")]
    #[inline]
    pub fn send_with_imm(
        self,
        imm: u32,
        data: impl Into<SendData<'a>>,
    ) -> PostSendChain<'g, 'a, T> {
        self.add(Op::SendImm(imm), data.into())
    }

    /// An RDMA WRITE (`IBV_WR_RDMA_WRITE`, `ibv_wr_rdma_write`) of `data` to the peer's
    /// `remote_addr` in the region of `rkey`.
    #[doc(alias = "ibv_wr_rdma_write")]
    #[inline]
    pub fn rdma_write(
        self,
        rkey: u32,
        remote_addr: u64,
        data: impl Into<SendData<'a>>,
    ) -> PostSendChain<'g, 'a, T> {
        self.add(
            Op::Write {
                rkey,
                addr: remote_addr,
            },
            data.into(),
        )
    }

    /// An RDMA WRITE with immediate data (`IBV_WR_RDMA_WRITE_WITH_IMM`,
    /// `ibv_wr_rdma_write_imm`): consumes a receive at the peer, which sees `imm`.
    #[doc(alias = "ibv_wr_rdma_write_imm")]
    #[inline]
    pub fn rdma_write_with_imm(
        self,
        rkey: u32,
        remote_addr: u64,
        imm: u32,
        data: impl Into<SendData<'a>>,
    ) -> PostSendChain<'g, 'a, T> {
        self.add(
            Op::WriteImm {
                rkey,
                addr: remote_addr,
                imm,
            },
            data.into(),
        )
    }

    /// An RDMA READ (`IBV_WR_RDMA_READ`, `ibv_wr_rdma_read`) of the peer's `remote_addr`
    /// into the local entries `data` (no inline data).
    #[doc(alias = "ibv_wr_rdma_read")]
    #[inline]
    pub fn rdma_read(
        self,
        rkey: u32,
        remote_addr: u64,
        data: impl Into<SendData<'a>>,
    ) -> PostSendChain<'g, 'a, T> {
        self.add(
            Op::Read {
                rkey,
                addr: remote_addr,
            },
            data.into(),
        )
    }

    /// An atomic compare-and-swap (`IBV_WR_ATOMIC_CMP_AND_SWP`, `ibv_wr_atomic_cmp_swp`) of
    /// the 8 bytes at the peer's `remote_addr` (8-byte aligned): if they equal `compare`
    /// they become `swap`. The old value lands in `local` (8 bytes).
    #[doc(alias = "ibv_wr_atomic_cmp_swp")]
    #[inline]
    pub fn atomic_cmp_swp(
        self,
        rkey: u32,
        remote_addr: u64,
        compare: u64,
        swap: u64,
        local: Sge,
    ) -> PostSendChain<'g, 'a, T> {
        self.add(
            Op::CmpSwp {
                rkey,
                addr: remote_addr,
                compare,
                swap,
            },
            SendData::Sge(local),
        )
    }

    /// An atomic fetch-and-add (`IBV_WR_ATOMIC_FETCH_AND_ADD`, `ibv_wr_atomic_fetch_add`)
    /// of `add` to the 8 bytes at the peer's `remote_addr` (8-byte aligned). The old value
    /// lands in `local` (8 bytes).
    #[doc(alias = "ibv_wr_atomic_fetch_add")]
    #[inline]
    pub fn atomic_fetch_add(
        self,
        rkey: u32,
        remote_addr: u64,
        add: u64,
        local: Sge,
    ) -> PostSendChain<'g, 'a, T> {
        self.add(
            Op::FetchAdd {
                rkey,
                addr: remote_addr,
                add,
            },
            SendData::Sge(local),
        )
    }
}

/// The batch after a request was added to it: add the next one with [`wr`](Self::wr), or
/// [`post`](Self::post) them all. Returned by each operation method of
/// [`WorkRequestBuilder`], so that a batch can be built and posted in one expression; it
/// is the guard under another name, and discarding it keeps the batch in the guard.
///
/// ```no_run
/// # fn demo(qp: &mut sideway::queue_pair::QueuePair, buf: &sideway::memory_region::RegisteredBuffer,
/// #         rkey: u32, raddr: u64) -> Result<(), sideway::queue_pair::PostError> {
/// use sideway::queue_pair::SendFlags;
/// // One expression: a guard, two requests, one doorbell.
/// qp.start_post_send()
///     .wr(1, SendFlags::empty())
///     .rdma_write(rkey, raddr, buf.sge(0..64).unwrap())
///     .wr(2, SendFlags::SIGNALED)
///     .send(b"done")
///     .post()?;
/// // Statement by statement, the guard posts itself.
/// let mut guard = qp.start_post_send();
/// for i in 0..4u64 {
///     guard.wr(10 + i, SendFlags::SIGNALED).send(b"ping");
/// }
/// guard.post()?;
/// # Ok(()) }
/// ```
///
/// Posting through a chain leaves the guard empty: a named guard can go on to a next batch.
/// The chain borrows its guard, so it cannot outlive a guard made in the same expression:
///
/// ```compile_fail,E0716
/// # fn demo(qp: &mut sideway::queue_pair::QueuePair) {
/// let chain = qp.start_post_send().wr(1, sideway::queue_pair::SendFlags::SIGNALED).send(b"x");
/// let _ = chain.post(); // the guard was dropped at the end of the line above
/// # }
/// ```
pub struct PostSendChain<'g, 'a, T: Threading = AnyThread> {
    guard: &'g mut PostSendGuard<'a, T>,
}

impl<T: Threading> fmt::Debug for PostSendChain<'_, '_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.guard, f)
    }
}

impl<'g, 'a, T: Threading> PostSendChain<'g, 'a, T> {
    /// Starts the next work request, as [`PostSendGuard::wr`].
    #[inline]
    pub fn wr(self, wr_id: u64, flags: SendFlags) -> WorkRequestBuilder<'g, 'a, T> {
        self.guard.wr(wr_id, flags)
    }

    /// Posts the batch with one doorbell, as [`PostSendGuard::post`], and leaves the guard
    /// empty.
    #[doc(alias = "ibv_post_send")]
    #[doc(alias = "ibv_wr_complete")]
    #[inline(always)]
    pub fn post(self) -> Result<(), PostError> {
        self.guard.post_batch()
    }

    /// How many requests the batch holds.
    pub fn len(&self) -> usize {
        self.guard.len()
    }

    /// True when the batch holds none.
    pub fn is_empty(&self) -> bool {
        self.guard.is_empty()
    }

    /// The guard, to go on with it by name.
    pub fn into_guard(self) -> &'g mut PostSendGuard<'a, T> {
        self.guard
    }
}

impl<'a, T: Threading> PostSendGuard<'a, T> {
    #[inline]
    pub(super) fn new(qp: &'a mut QueuePair<T>) -> Self {
        let limit = qp.send.capacity;
        PostSendGuard {
            qp,
            count: 0,
            limit,
            invalid: None,
        }
    }

    /// Starts the next work request: its `wr_id` (reported by its completion) and flags.
    /// Pick the operation on the returned builder.
    #[inline]
    pub fn wr(&mut self, wr_id: u64, flags: SendFlags) -> WorkRequestBuilder<'_, 'a, T> {
        WorkRequestBuilder {
            guard: self,
            wr_id,
            flags,
            dest: Dest::None,
        }
    }

    /// How many requests the batch holds.
    pub fn len(&self) -> usize {
        self.count
    }

    /// True when the batch holds none.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    #[inline(always)]
    fn check(&self, op: Op, data: &SendData<'a>, dest: Dest) -> Result<(), InvalidWorkRequest> {
        let qp = &*self.qp;
        if !qp.send.allowed.contains(op.send_ops_flag()) {
            return Err(not_for_qp_type(op, qp.qp_type));
        }
        // UD requests carry an address, XRC sends a remote SRQ, others neither: one compare.
        if dest.kind() != qp.send.dest_kind {
            return Err(dest_mismatch(qp.qp_type, dest.kind()));
        }
        let entries = data.entries();
        let max_sge = qp.send.max_sge;
        if entries > max_sge {
            return Err(InvalidWorkRequest::TooManySge {
                given: entries,
                max: max_sge,
                queue: "send",
            });
        }
        if data.is_inline() {
            if !op.allows_inline() {
                return Err(InvalidWorkRequest::InlineNotAllowed { op: op.name() });
            }
            let len = data.inline_len();
            if len > qp.cap.max_inline_data as usize {
                return Err(InvalidWorkRequest::InlineTooLong {
                    len,
                    max: qp.cap.max_inline_data,
                });
            }
        }
        if qp.ex.is_some() && !qp.send.ex.ready.allows(op, data, dest.ready_bit()) {
            return Err(InvalidWorkRequest::NotEnabled { op: op.name() });
        }
        Ok(())
    }

    #[inline(always)]
    fn push(&mut self, wr_id: u64, flags: SendFlags, op: Op, data: SendData<'a>, dest: Dest) {
        if self.count >= self.limit {
            // The storage is full, unless a request was refused already (limit 0).
            if self.limit != 0 {
                self.refuse(wr_id, batch_full(self.qp.send.capacity, "send"));
            }
            return;
        }
        if let Err(reason) = self.check(op, &data, dest) {
            self.refuse(wr_id, reason);
            return;
        }
        let mut flags = flags - SendFlags::INLINE;
        if data.is_inline() {
            flags |= SendFlags::INLINE;
        }
        match self.qp.ex {
            Some(ex) => self.push_ex(ex, wr_id, flags, op, data, dest),
            None => self.push_classic(wr_id, flags, op, data, dest),
        }
        self.count += 1;
    }

    /// Remembers the first refused request for `post`, and stops taking requests. Inlined,
    /// as the rest of the request path: a call taking the guard (or a field of it) by
    /// reference kept the whole guard in memory, and every batch loop with it
    /// (docs/benchmarks.md, "The posting guard").
    #[inline(always)]
    fn refuse(&mut self, wr_id: u64, reason: InvalidWorkRequest) {
        self.invalid = Some((self.count, wr_id, reason));
        self.limit = 0;
    }

    #[inline(always)]
    fn push_classic(
        &mut self,
        wr_id: u64,
        flags: SendFlags,
        op: Op,
        data: SendData<'a>,
        dest: Dest,
    ) {
        let i = self.count;
        let st = &mut self.qp.send;
        let m = st.max_sge;
        // SAFETY: push() saw i < limit <= capacity, so slot i and its max_sge entries at
        // i * max_sge lie inside wrs and sges (SendStorage::capacity), and slot + 1 is at
        // most one past the end of wrs.
        let (slot, next, entries) = unsafe {
            let slot = st.wrs.as_mut_ptr().add(i);
            (slot, slot.add(1), st.sges.as_mut_ptr().add(i * m))
        };
        let inline = |b: &[u8]| ffi::ibv_sge {
            addr: b.as_ptr() as u64,
            // check() bounded inline lengths by max_inline_data, a u32.
            length: b.len() as u32,
            lkey: 0,
        };
        // check() bounded the entries by max_sge, so entry j < max_sge of this request lies
        // inside `sges`.
        let n = match data {
            SendData::Empty => 0,
            SendData::Sge(s) => {
                // SAFETY: entry 0 of at most max_sge, as above (max_sge >= 1 since check()
                // let one entry through).
                unsafe { entries.write(*s.as_raw()) };
                1
            }
            SendData::SgeList(list) => {
                for (j, src) in list.iter().enumerate() {
                    // SAFETY: j < list.len() <= max_sge, as above.
                    unsafe { entries.add(j).write(*src.as_raw()) };
                }
                list.len()
            }
            SendData::Inline(b) => {
                // SAFETY: entry 0 of at most max_sge, as for Sge.
                unsafe { entries.write(inline(b)) };
                1
            }
            SendData::InlineBuffer(b) => {
                let entry = ffi::ibv_sge {
                    addr: b.ptr.as_ptr() as u64,
                    // check() bounded inline lengths by max_inline_data, a u32.
                    length: b.len as u32,
                    lkey: 0,
                };
                // SAFETY: entry 0 of at most max_sge, as for Sge.
                unsafe { entries.write(entry) };
                1
            }
            SendData::InlineList(list) => {
                for (j, src) in list.iter().enumerate() {
                    // SAFETY: j < list.len() <= max_sge, as above.
                    unsafe { entries.add(j).write(inline(src)) };
                }
                list.len()
            }
        };
        let mut wr = zeroed_send_wr();
        wr.wr_id = wr_id;
        // Each request links to the slot after it; post() ends the chain at the last one.
        wr.next = next;
        wr.sg_list = if n == 0 {
            std::ptr::null_mut()
        } else {
            entries
        };
        // n <= max_sge, which came from a u32.
        wr.num_sge = n as c_int;
        wr.opcode = op.opcode();
        wr.send_flags = flags.bits();
        match op {
            Op::Send | Op::Read { .. } | Op::Write { .. } => {}
            Op::SendImm(imm) | Op::WriteImm { imm, .. } => {
                wr.__bindgen_anon_1.imm_data = imm.to_be();
            }
            Op::SendInv(rkey) | Op::LocalInv(rkey) => {
                wr.__bindgen_anon_1.invalidate_rkey = rkey;
            }
            _ => {}
        }
        match op {
            Op::Write { rkey, addr }
            | Op::WriteImm { rkey, addr, .. }
            | Op::Read { rkey, addr } => {
                wr.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                    remote_addr: addr,
                    rkey,
                };
            }
            Op::CmpSwp {
                rkey,
                addr,
                compare,
                swap,
            } => {
                wr.wr.atomic = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                    remote_addr: addr,
                    compare_add: compare,
                    swap,
                    rkey,
                };
            }
            Op::FetchAdd { rkey, addr, add } => {
                wr.wr.atomic = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                    remote_addr: addr,
                    compare_add: add,
                    swap: 0,
                    rkey,
                };
            }
            Op::BindMw { mw, rkey, info } => {
                wr.__bindgen_anon_2.bind_mw = ffi::ibv_send_wr__bindgen_ty_4__bindgen_ty_1 {
                    mw,
                    rkey,
                    bind_info: info,
                };
            }
            Op::Send | Op::SendImm(_) | Op::SendInv(_) | Op::LocalInv(_) => {}
        }
        match dest {
            Dest::None => {}
            Dest::Ud(ud) => {
                // check() allowed only SEND and SEND with immediate here, which use no other
                // member of this union.
                wr.wr.ud = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
                    ah: ud.ah,
                    remote_qpn: ud.remote_qpn,
                    remote_qkey: ud.remote_qkey,
                };
            }
            Dest::Xrc(remote_srqn) => {
                // check() allowed this on XRC send QPs only; the union has no other member.
                wr.qp_type.xrc = ffi::ibv_send_wr__bindgen_ty_3__bindgen_ty_1 { remote_srqn };
            }
        }
        // SAFETY: slot is in bounds (above) and nothing else borrows the storage.
        unsafe { slot.write(wr) };
    }

    #[inline(always)]
    fn push_ex(
        &mut self,
        ex: NonNull<ffi::ibv_qp_ex>,
        wr_id: u64,
        flags: SendFlags,
        op: Op,
        data: SendData<'a>,
        dest: Dest,
    ) {
        let ex = ex.as_ptr();
        let f = &self.qp.send.ex;
        // The safety argument of every block below: ex is the live extended QP of this
        // guard's QP, which the guard borrows mutably, so no other batch is open on it; the
        // calls follow the batch order (start, then per request: wr_id/wr_flags, one opcode
        // call, its data setter); check() verified, against `f.ready`, that the operation is
        // in send_ops_flags and that the provider filled its entry, the data setter's and
        // the batch entries, so each function called is the provider's own, read from `ex`
        // when the QP was wrapped (ExOps: what verbs.h's inline would load now). Inline
        // data is borrowed for 'a, beyond this call.
        if self.count == 0 {
            // SAFETY: as above; opens the batch once, for its first request.
            unsafe { (f.start)(ex) };
        }
        // SAFETY: as above; plain field writes the next opcode call reads.
        unsafe {
            (*ex).wr_id = wr_id;
            (*ex).wr_flags = flags.bits();
        }
        // SAFETY: as above.
        unsafe {
            match op {
                Op::Send => (f.send)(ex),
                Op::SendImm(imm) => (f.send_imm)(ex, imm.to_be()),
                Op::Write { rkey, addr } => (f.rdma_write)(ex, rkey, addr),
                Op::WriteImm { rkey, addr, imm } => (f.rdma_write_imm)(ex, rkey, addr, imm.to_be()),
                Op::Read { rkey, addr } => (f.rdma_read)(ex, rkey, addr),
                Op::CmpSwp {
                    rkey,
                    addr,
                    compare,
                    swap,
                } => (f.atomic_cmp_swp)(ex, rkey, addr, compare, swap),
                Op::FetchAdd { rkey, addr, add } => (f.atomic_fetch_add)(ex, rkey, addr, add),
                Op::SendInv(rkey) => (f.send_inv)(ex, rkey),
                Op::LocalInv(rkey) => (f.local_inv)(ex, rkey),
                // The provider copies the bind info while the call runs.
                Op::BindMw { mw, rkey, info } => (f.bind_mw)(ex, mw, rkey, &info),
            }
        }
        match dest {
            Dest::None => {}
            // SAFETY: as above; the destination follows the opcode call, and the address
            // handle is borrowed for 'a.
            Dest::Ud(ud) => unsafe { (f.set_ud_addr)(ex, ud.ah, ud.remote_qpn, ud.remote_qkey) },
            // SAFETY: as above; the destination follows the opcode call.
            Dest::Xrc(remote_srqn) => unsafe { (f.set_xrc_srqn)(ex, remote_srqn) },
        }
        match data {
            SendData::Empty => {}
            // SAFETY: as above; the SGE is passed by value.
            SendData::Sge(s) => unsafe { (f.set_sge)(ex, s.lkey(), s.addr(), s.length()) },
            // SAFETY: as above; Sge is repr(transparent) over ibv_sge, and the list is
            // borrowed for 'a.
            SendData::SgeList(list) => unsafe {
                (f.set_sge_list)(ex, list.len(), list.as_ptr().cast())
            },
            // SAFETY: as above; the provider only reads the bytes (the C prototype lacks
            // const).
            SendData::Inline(b) => unsafe {
                (f.set_inline_data)(ex, b.as_ptr() as *mut c_void, b.len())
            },
            // SAFETY: as above; the bytes lie in a buffer borrowed for 'a, and the provider
            // copies them through the pointer, forming no reference.
            SendData::InlineBuffer(b) => unsafe {
                (f.set_inline_data)(ex, b.ptr.as_ptr().cast(), b.len)
            },
            SendData::InlineList(list) => {
                let set_inline_data = f.set_inline_data;
                let scratch = &mut self.qp.send.inline;
                let mut len = 0;
                for part in list {
                    // check() bounded the total by max_inline_data, the scratch's length.
                    scratch[len..len + part.len()].copy_from_slice(part);
                    len += part.len();
                }
                // SAFETY: as above; scratch[..len] is initialised and lives with the QP.
                unsafe { set_inline_data(ex, scratch.as_mut_ptr().cast(), len) }
            }
        }
    }

    /// Posts the batch with one doorbell: `ibv_wr_complete` on an extended QP, one chained
    /// `ibv_post_send` on a classic one. An empty batch posts nothing and succeeds.
    #[doc(alias = "ibv_post_send")]
    #[doc(alias = "ibv_wr_complete")]
    #[inline(always)]
    pub fn post(mut self) -> Result<(), PostError> {
        self.post_batch()
    }

    /// What [`post`](Self::post) and [`PostSendChain::post`] do: posts the batch and leaves
    /// the guard empty, whatever the outcome, so a guard that goes on living (under a chain)
    /// starts a new batch and its drop has nothing to abort.
    #[inline(always)]
    fn post_batch(&mut self) -> Result<(), PostError> {
        if self.limit == 0 {
            if let Some((index, wr_id, reason)) = self.invalid.take() {
                // Nothing is posted: abort what an extended QP already holds, and empty
                // the guard so that it can start again. Inline, as the request path: a
                // call taking the guard by reference would keep it in memory.
                if let (true, Some(ex)) = (self.count > 0, self.qp.ex) {
                    // SAFETY: ex is live and inside the batch this guard started
                    // (count > 0), never completed; a request passed check(), so the
                    // provider filled wr_abort (ExReady), and `abort` is its entry.
                    unsafe { (self.qp.send.ex.abort)(ex.as_ptr()) };
                }
                self.count = 0;
                self.limit = self.qp.send.capacity;
                return Err(PostError::Invalid {
                    qp_num: self.qp.qp_num(),
                    index,
                    wr_id,
                    reason,
                });
            }
        }
        let count = self.count;
        if count == 0 {
            return Ok(());
        }
        // The QP number is read only for an error, after the call: it never changes, and
        // reading it first would put one more load in front of every post.
        let post_err =
            |qp: &QueuePair<T>, call, index: Option<usize>, wr_id, source| PostError::Post {
                call,
                qp_num: qp.qp_num(),
                count,
                index,
                wr_id,
                source,
            };
        if let Some(ex) = self.qp.ex {
            // The batch ends here, whatever complete says: Drop must not abort it.
            self.count = 0;
            // SAFETY: ex is live and inside the batch this guard started (count > 0);
            // complete ends it. A request passed check(), so the provider filled
            // wr_complete (ExReady), and `complete` is its entry.
            let ret = unsafe { (self.qp.send.ex.complete)(ex.as_ptr()) };
            return from_post_ret(ret)
                .map_err(|e| post_err(self.qp, "ibv_wr_complete", None, None, e));
        }
        // The chain is handed over below, whatever the verb says: the next request starts
        // a new one.
        self.count = 0;
        let qp = self.qp.raw.as_ptr();
        let wrs = self.qp.send.wrs.as_mut_ptr();
        // SAFETY: push_classic wrote wrs[..count] (count <= capacity <= wrs.len()), each
        // linking to the slot after it; the last one's link ends the chain.
        unsafe { (*wrs.add(count - 1)).next = std::ptr::null_mut() };
        let mut bad: *mut ffi::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: qp is live; wrs[..count] is a NULL-terminated chain whose sg_lists point
        // into `sges` (alive with the QP) at entries naming registered memory or inline bytes
        // borrowed for 'a; bad is a valid out-pointer.
        let ret = unsafe { (self.qp.posts.post_send)(qp, wrs, &mut bad) };
        from_post_ret(ret).map_err(|e| {
            let st = &self.qp.send;
            let index = chain_index(st.wrs.as_ptr(), bad, count);
            let wr_id = index.map(|i| st.wrs[i].wr_id);
            post_err(self.qp, "ibv_post_send", index, wr_id, e)
        })
    }
}

impl<T: Threading> Drop for PostSendGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        if let (true, Some(ex)) = (self.count > 0, self.qp.ex) {
            // SAFETY: ex is live and inside the batch this guard started (count > 0) and
            // never completed (post() resets count); a request passed check(), so the
            // provider filled wr_abort (ExReady), and `abort` is its entry.
            unsafe { (self.qp.send.ex.abort)(ex.as_ptr()) };
        }
        // A classic batch lives only in the QP's storage: nothing to undo.
    }
}
