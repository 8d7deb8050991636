//! Polling: what a poll of a classic or extended CQ works with, the provider functions read
//! once, and [`Poller`], the iterator over ready completions. Below the queue, which hands
//! these out (`CompletionQueue::poll`, `ClaimedCq::poll`); it knows nothing of the queue's
//! ownership.

use std::io;
use std::os::raw::{c_int, c_uint};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};

use bitflags::bitflags;
use rdma_mummy_sys as ffi;

use super::error::CompletionQueueError;
use crate::errno::from_post_ret;
use crate::work_completion::{WcFlags, WorkCompletion};

bitflags! {
    /// Which optional fields an extended CQ reports (`ibv_create_cq_wc_flags`).
    #[doc(alias = "ibv_create_cq_wc_flags")]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct WcFlagsEx: u64 {
        /// `IBV_WC_EX_WITH_BYTE_LEN`
        const BYTE_LEN = ffi::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_BYTE_LEN as u64;
        /// `IBV_WC_EX_WITH_IMM`: immediate data and invalidated rkeys.
        const IMM = ffi::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_IMM as u64;
        /// `IBV_WC_EX_WITH_QP_NUM`
        const QP_NUM = ffi::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_QP_NUM as u64;
        /// `IBV_WC_EX_WITH_SRC_QP`
        const SRC_QP = ffi::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_SRC_QP as u64;
        /// `IBV_WC_EX_WITH_SLID`
        const SLID = ffi::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_SLID as u64;
        /// `IBV_WC_EX_WITH_SL`
        const SL = ffi::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_SL as u64;
        /// `IBV_WC_EX_WITH_DLID_PATH_BITS`
        const DLID_PATH_BITS = ffi::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_DLID_PATH_BITS as u64;
        /// `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`: the device clock at completion.
        const COMPLETION_TIMESTAMP = ffi::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP as u64;
        /// `IBV_WC_EX_WITH_CVLAN`
        const CVLAN = ffi::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_CVLAN as u64;
        /// `IBV_WC_EX_WITH_FLOW_TAG`
        const FLOW_TAG = ffi::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_FLOW_TAG as u64;
        /// `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK`
        const COMPLETION_TIMESTAMP_WALLCLOCK = ffi::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK as u64;
        const _ = !0;
    }
}

impl WcFlagsEx {
    /// What the builder asks for unless told otherwise: every field a classic `ibv_wc` has
    /// (`IBV_WC_STANDARD_FLAGS`), so both kinds of CQ report the same.
    pub fn default_ex() -> Self {
        WcFlagsEx::BYTE_LEN
            | WcFlagsEx::IMM
            | WcFlagsEx::QP_NUM
            | WcFlagsEx::SRC_QP
            | WcFlagsEx::SLID
            | WcFlagsEx::SL
            | WcFlagsEx::DLID_PATH_BITS
    }
}

/// Releases the CQ's polling flag when a poll ends, however it ends.
/// `None` for a poll of a [`ClaimedCq`], which holds the flag itself.
pub(super) struct PollGuard<'a>(pub(super) Option<&'a AtomicBool>);

impl Drop for PollGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        if let Some(polling) = self.0 {
            polling.store(false, Ordering::Release);
        }
    }
}

/// What a poll works with: the CQ's pointers, copied out of the shared [`CompletionQueue`]
/// (where every provider call would make the compiler load them again: the CQ's atomics
/// make it mutable behind `&`) into the poll, where they stay in registers as they do in a
/// C loop.
#[derive(Clone, Copy)]
pub(super) enum PollTarget<'a> {
    Classic(ClassicCq),
    Extended(ExPoll<'a>),
}

impl<'a> PollTarget<'a> {
    /// A poller, started (`ibv_start_poll`) for an extended CQ; a classic one polls into
    /// `slot` (see [`poll_one`]).
    ///
    /// # Safety
    ///
    /// For an extended CQ the caller holds the polling flag until the poller is dropped:
    /// `guard` holds it, or the caller's claim outlives the poller.
    #[inline(always)]
    pub(super) unsafe fn poller(
        self,
        guard: PollGuard<'a>,
        slot: Option<&'a mut WorkCompletion>,
    ) -> Result<Poller<'a>, CompletionQueueError> {
        let (kind, ex_state) = match self {
            PollTarget::Classic(cq) => (PollKind::Classic(cq, slot), ExState::Ended),
            PollTarget::Extended(ex) => {
                // SAFETY: the caller holds the claim, and no sequence of this CQ is open: a
                // sequence lives only inside a poller or a batch poll, which hold the claim.
                let state = match unsafe { ex.start() } {
                    0 => ExState::Positioned,
                    libc::ENOENT => ExState::Ended,
                    ret => return Err(poll_error("ibv_start_poll", ret)),
                };
                (PollKind::Extended(ex), state)
            }
        };
        Ok(Poller {
            kind,
            ex_state,
            _guard: guard,
        })
    }

    /// [`CompletionQueue::poll_into`] once the CQ is claimed.
    ///
    /// # Safety
    ///
    /// For an extended CQ the caller holds the polling flag for the call.
    #[inline(always)]
    pub(super) unsafe fn poll_into(
        self,
        out: &mut [WorkCompletion],
    ) -> Result<usize, CompletionQueueError> {
        if out.is_empty() {
            return Ok(0);
        }
        match self {
            PollTarget::Classic(cq) => poll_classic_into(cq, out),
            // SAFETY: the caller holds the claim.
            PollTarget::Extended(ex) => unsafe { ex.poll_into(out) },
        }
    }
}

/// The provider's `poll_cq` (`ibv_context_ops.poll_cq`).
pub(super) type PollCqFn = unsafe extern "C" fn(*mut ffi::ibv_cq, c_int, *mut ffi::ibv_wc) -> c_int;

/// A classic CQ and its provider's `poll_cq`, read once when the CQ was created.
///
/// verbs.h's `ibv_poll_cq` loads `cq->context->ops.poll_cq` on every call (two dependent
/// loads), and rdma-mummy-sys's also tests it for NULL. A provider fills its context's ops
/// when the context opens and never changes them, so the pointer read at creation is the
/// one every call would load; a provider without one gets [`poll_cq_unsupported`], which
/// fails each poll as the missing verb would.
#[derive(Clone, Copy)]
pub(super) struct ClassicCq {
    pub(super) raw: NonNull<ffi::ibv_cq>,
    pub(super) poll_cq: PollCqFn,
}

/// Reads the provider's `poll_cq` for `cq`.
///
/// # Safety
///
/// `cq` is a live CQ of an open context.
pub(super) unsafe fn provider_poll_cq(cq: NonNull<ffi::ibv_cq>) -> PollCqFn {
    // SAFETY: the caller's promise: cq and its context are live.
    unsafe { (*(*cq.as_ptr()).context).ops.poll_cq }.unwrap_or(poll_cq_unsupported)
}

/// `poll_cq` of a provider that has none: every poll fails with `EOPNOTSUPP`.
unsafe extern "C" fn poll_cq_unsupported(
    _cq: *mut ffi::ibv_cq,
    _num_entries: c_int,
    _wc: *mut ffi::ibv_wc,
) -> c_int {
    -libc::EOPNOTSUPP
}

/// Classic polling straight into the caller's slice, as a C program polls into its `ibv_wc`
/// array: no scratch array, no copy. (Copying an `ibv_wc` the provider has just written field
/// by field costs more than the poll: the copy's wide loads cannot be forwarded from those
/// narrow stores.)
#[inline(always)]
pub(super) fn poll_classic_into(
    cq: ClassicCq,
    out: &mut [WorkCompletion],
) -> Result<usize, CompletionQueueError> {
    if let Ok(len) = c_int::try_from(out.len()) {
        // SAFETY: WorkCompletion is repr(transparent) over ibv_wc, so out is an array of
        // len initialised ibv_wc, which the verb may overwrite.
        return unsafe { poll_cq(cq, out.as_mut_ptr().cast(), len) };
    }
    // More entries than one call can take: c_int::MAX at a time.
    let mut n = 0;
    for chunk in out.chunks_mut(c_int::MAX as usize) {
        // SAFETY: as above, for the chunk (its length fits a c_int).
        let got = unsafe { poll_cq(cq, chunk.as_mut_ptr().cast(), chunk.len() as c_int) }?;
        n += got;
        if got < chunk.len() {
            break;
        }
    }
    Ok(n)
}

/// `ibv_poll_cq` of up to `len` entries into `wc`: how many it wrote (never more than `len`,
/// whatever the provider says).
///
/// # Safety
///
/// `cq` is a live CQ, and `wc` points to `len` initialised `ibv_wc`, exclusively the
/// caller's.
#[inline(always)]
pub(super) unsafe fn poll_cq(
    cq: ClassicCq,
    wc: *mut ffi::ibv_wc,
    len: c_int,
) -> Result<usize, CompletionQueueError> {
    // SAFETY: the CQ is live and wc has room for len entries (the caller's promise).
    let got = unsafe { (cq.poll_cq)(cq.raw.as_ptr(), len, wc) };
    if got < 0 {
        return Err(poll_error("ibv_poll_cq", got));
    }
    Ok(got.min(len) as usize)
}

pub(super) type ReadU32 = unsafe extern "C" fn(*mut ffi::ibv_cq_ex) -> u32;
pub(super) type ReadU8 = unsafe extern "C" fn(*mut ffi::ibv_cq_ex) -> u8;
pub(super) type ReadImm = unsafe extern "C" fn(*mut ffi::ibv_cq_ex) -> ffi::__be32;

/// The provider functions that polling an extended CQ calls, copied out of its `ibv_cq_ex`
/// and checked once, when the CQ is created.
///
/// verbs.h's inlines call these pointers untested; rdma-mummy-sys's test each for NULL on
/// every call. Checked here once, a provider that leaves one out fails the creation
/// ([`CompletionQueueError::MissingFunction`]) instead of a poll, and the per-completion
/// path calls them with no test. Copying is exact because providers set these pointers when
/// they create the CQ and never change them.
pub(super) struct ExFns {
    pub(super) start_poll:
        unsafe extern "C" fn(*mut ffi::ibv_cq_ex, *mut ffi::ibv_poll_cq_attr) -> c_int,
    pub(super) next_poll: unsafe extern "C" fn(*mut ffi::ibv_cq_ex) -> c_int,
    pub(super) end_poll: unsafe extern "C" fn(*mut ffi::ibv_cq_ex),
    pub(super) read_opcode: unsafe extern "C" fn(*mut ffi::ibv_cq_ex) -> ffi::ibv_wc_opcode::Type,
    pub(super) read_vendor_err: ReadU32,
    pub(super) read_wc_flags: unsafe extern "C" fn(*mut ffi::ibv_cq_ex) -> c_uint,
    /// Which optional fields a completion reads, decided at creation.
    pub(super) fields: ExFields,
    pub(super) read_completion_ts: Option<unsafe extern "C" fn(*mut ffi::ibv_cq_ex) -> u64>,
}

/// The optional fields of an `ibv_wc` that a completion of an extended CQ reads.
pub(super) enum ExFields {
    /// Every field of a classic `ibv_wc` (the default WC flags,
    /// [`WcFlagsEx::default_ex`]): each completion calls all of them, with no test.
    Standard(StandardReaders),
    /// Another set: each completion tests each reader (present when its flag was asked).
    Asked(AskedReaders),
}

/// The readers of the fields [`WcFlagsEx::default_ex`] asks for.
pub(super) struct StandardReaders {
    pub(super) byte_len: ReadU32,
    pub(super) imm_data: ReadImm,
    pub(super) qp_num: ReadU32,
    pub(super) src_qp: ReadU32,
    pub(super) slid: ReadU32,
    pub(super) sl: ReadU8,
    pub(super) dlid_path_bits: ReadU8,
}

/// The readers of the fields the WC flags asked for; `None` for the others, whatever the
/// provider set.
pub(super) struct AskedReaders {
    pub(super) byte_len: Option<ReadU32>,
    pub(super) imm_data: Option<ReadImm>,
    pub(super) qp_num: Option<ReadU32>,
    pub(super) src_qp: Option<ReadU32>,
    pub(super) slid: Option<ReadU32>,
    pub(super) sl: Option<ReadU8>,
    pub(super) dlid_path_bits: Option<ReadU8>,
}

impl ExFns {
    /// The functions of `ex` that polling it with `flags` calls, or the name of the first
    /// one that is NULL.
    ///
    /// # Safety
    ///
    /// `ex` points to a live `ibv_cq_ex` whose function pointers are provider functions or
    /// NULL, and which no other thread is changing.
    pub(super) unsafe fn of(
        ex: NonNull<ffi::ibv_cq_ex>,
        flags: WcFlagsEx,
    ) -> Result<Self, &'static str> {
        fn required<F>(f: Option<F>, name: &'static str) -> Result<F, &'static str> {
            f.ok_or(name)
        }
        /// A reader its WC flag asked for must be there; the others are never called.
        fn asked<F>(
            asked: bool,
            f: Option<F>,
            name: &'static str,
        ) -> Result<Option<F>, &'static str> {
            match asked {
                true => required(f, name).map(Some),
                false => Ok(None),
            }
        }
        // SAFETY: the caller promises a live CQ that nobody changes meanwhile.
        let cq = unsafe { ex.as_ref() };
        let has = |flag| flags.contains(flag);
        let readers = AskedReaders {
            byte_len: asked(has(WcFlagsEx::BYTE_LEN), cq.read_byte_len, "read_byte_len")?,
            imm_data: asked(has(WcFlagsEx::IMM), cq.read_imm_data, "read_imm_data")?,
            qp_num: asked(has(WcFlagsEx::QP_NUM), cq.read_qp_num, "read_qp_num")?,
            src_qp: asked(has(WcFlagsEx::SRC_QP), cq.read_src_qp, "read_src_qp")?,
            slid: asked(has(WcFlagsEx::SLID), cq.read_slid, "read_slid")?,
            sl: asked(has(WcFlagsEx::SL), cq.read_sl, "read_sl")?,
            dlid_path_bits: asked(
                has(WcFlagsEx::DLID_PATH_BITS),
                cq.read_dlid_path_bits,
                "read_dlid_path_bits",
            )?,
        };
        let fields = match readers {
            AskedReaders {
                byte_len: Some(byte_len),
                imm_data: Some(imm_data),
                qp_num: Some(qp_num),
                src_qp: Some(src_qp),
                slid: Some(slid),
                sl: Some(sl),
                dlid_path_bits: Some(dlid_path_bits),
            } => ExFields::Standard(StandardReaders {
                byte_len,
                imm_data,
                qp_num,
                src_qp,
                slid,
                sl,
                dlid_path_bits,
            }),
            readers => ExFields::Asked(readers),
        };
        Ok(ExFns {
            start_poll: required(cq.start_poll, "start_poll")?,
            next_poll: required(cq.next_poll, "next_poll")?,
            end_poll: required(cq.end_poll, "end_poll")?,
            read_opcode: required(cq.read_opcode, "read_opcode")?,
            read_vendor_err: required(cq.read_vendor_err, "read_vendor_err")?,
            read_wc_flags: required(cq.read_wc_flags, "read_wc_flags")?,
            fields,
            read_completion_ts: asked(
                has(WcFlagsEx::COMPLETION_TIMESTAMP),
                cq.read_completion_ts,
                "read_completion_ts",
            )?,
        })
    }
}

/// The extended side of a CQ: its `ibv_cq_ex` and the provider functions polling calls.
pub(super) struct ExCq {
    pub(super) raw: NonNull<ffi::ibv_cq_ex>,
    pub(super) fns: ExFns,
}

impl ExCq {
    /// The view a poll works with.
    #[inline(always)]
    pub(super) fn poll(&self) -> ExPoll<'_> {
        ExPoll {
            raw: self.raw,
            fns: &self.fns,
        }
    }
}

/// The error of a poll verb that returned `ret` (neither 0 nor, for the extended ones,
/// `ENOENT`). Out of line: the data path only tests for it.
#[cold]
#[inline(never)]
pub(super) fn poll_error(call: &'static str, ret: c_int) -> CompletionQueueError {
    CompletionQueueError::Poll {
        call,
        source: from_post_ret(ret)
            .err()
            .unwrap_or_else(|| io::Error::from_raw_os_error(libc::EIO)),
    }
}

/// An extended CQ as one poll uses it (see [`PollTarget`]): its `ibv_cq_ex` and provider
/// functions.
///
/// Every method runs a step of the `ibv_start_poll`..`ibv_end_poll` sequence, which must
/// not interleave with another on the same CQ: callers hold the CQ's polling flag. `start`
/// and `next` return the verb's own result: 0 when positioned on an entry, `ENOENT` when
/// there is none, else an error number (for [`poll_error`]).
#[derive(Clone, Copy)]
pub(super) struct ExPoll<'a> {
    pub(super) raw: NonNull<ffi::ibv_cq_ex>,
    pub(super) fns: &'a ExFns,
}

impl ExPoll<'_> {
    /// `ibv_start_poll`. On `ENOENT` or an error the sequence is over (no `ibv_end_poll`).
    ///
    /// # Safety
    ///
    /// The caller holds the CQ's polling flag, and no sequence of this CQ is open.
    #[inline(always)]
    pub(super) unsafe fn start(self) -> c_int {
        let mut attr = ffi::ibv_poll_cq_attr { comp_mask: 0 };
        // SAFETY: start_poll is the provider's (checked at creation), raw is live, and the
        // caller polls it exclusively; attr is valid with comp_mask 0.
        unsafe { (self.fns.start_poll)(self.raw.as_ptr(), &mut attr) }
    }

    /// `ibv_next_poll`. Whatever it returns, the sequence still needs `ibv_end_poll`.
    ///
    /// # Safety
    ///
    /// The caller holds the CQ's polling flag, inside a sequence `start` opened.
    #[inline(always)]
    pub(super) unsafe fn next(self) -> c_int {
        // SAFETY: next_poll is the provider's (checked at creation), called inside the
        // sequence the caller holds.
        unsafe { (self.fns.next_poll)(self.raw.as_ptr()) }
    }

    /// `ibv_end_poll`.
    ///
    /// # Safety
    ///
    /// The caller holds the CQ's polling flag, inside a sequence `start` opened, and ends it
    /// once.
    #[inline(always)]
    pub(super) unsafe fn end(self) {
        // SAFETY: end_poll is the provider's (checked at creation), ending the caller's
        // sequence.
        unsafe { (self.fns.end_poll)(self.raw.as_ptr()) }
    }

    /// Reads the current entry: `wr_id`, `status`, and the fields the CQ was created with
    /// (zero for the others).
    ///
    /// # Safety
    ///
    /// As for [`read_into`](Self::read_into).
    #[inline(always)]
    pub(super) unsafe fn read(self) -> WorkCompletion {
        let mut wc = WorkCompletion::default();
        // SAFETY: the caller's promise.
        unsafe { self.read_into(&mut wc.raw) };
        wc
    }

    /// Writes the current entry into `wc`, each field as soon as it is read, as a C
    /// program fills its `ibv_wc`: `wr_id`, `status`, the fields the CQ was created with,
    /// and zero in the fields an extended CQ does not report (`pkey_index`) or was not
    /// asked for. (Building the value first and storing it whole made the compiler keep
    /// every reader's result on the stack across the later calls: two instructions more
    /// per field.) The immediate-data union is written when the completion's flags say it
    /// holds something (`WITH_IMM`, `WITH_INV`) and otherwise keeps what `wc` held, as
    /// `ibv_poll_cq` leaves it: [`WorkCompletion::imm_data`] and
    /// [`WorkCompletion::invalidated_rkey`] read it only under those flags.
    ///
    /// # Safety
    ///
    /// The caller holds the CQ's polling flag, positioned on an entry (`start` or `next`
    /// returned 0 and the sequence has not ended).
    #[inline(always)]
    pub(super) unsafe fn read_into(self, wc: &mut ffi::ibv_wc) {
        // SAFETY: the caller's promise, for each call.
        unsafe {
            match &self.fns.fields {
                ExFields::Standard(r) => self.read_standard(r, wc),
                ExFields::Asked(r) => self.read_asked(r, wc),
            }
        }
    }

    /// The fields every completion has: `wr_id`, `status`, opcode, vendor error and WC
    /// flags, which it returns.
    ///
    /// # Safety
    ///
    /// As for [`read_into`](Self::read_into).
    #[inline(always)]
    pub(super) unsafe fn read_head(self, wc: &mut ffi::ibv_wc) -> WcFlags {
        let cq = self.raw.as_ptr();
        let f = self.fns;
        // SAFETY: cq is live and positioned on an entry (the caller's promise), so its wr_id
        // and status are the entry's and its readers, the provider's own (checked at
        // creation), may be called.
        unsafe {
            wc.wr_id = (*cq).wr_id;
            wc.status = (*cq).status;
            wc.opcode = (f.read_opcode)(cq);
            wc.vendor_err = (f.read_vendor_err)(cq);
            wc.wc_flags = (f.read_wc_flags)(cq);
        }
        WcFlags::from_bits_retain(wc.wc_flags)
    }

    /// [`read_into`](Self::read_into) for a CQ that reports every field of a classic
    /// `ibv_wc` ([`ExFields::Standard`]): each reader is called with no test.
    ///
    /// # Safety
    ///
    /// As for [`read_into`](Self::read_into), and `r` is this CQ's.
    #[inline(always)]
    pub(super) unsafe fn read_standard(self, r: &StandardReaders, wc: &mut ffi::ibv_wc) {
        let cq = self.raw.as_ptr();
        // SAFETY: as in read_head; every reader of r is the provider's, checked at creation
        // (the WC flags asked for all of them).
        unsafe {
            // The immediate data first, while the flags that say whether it is there are
            // still in a register (a reader only reads the current entry: the order of the
            // reads does not matter).
            // verbs.h reads the invalidated rkey with the immediate data's reader.
            if self
                .read_head(wc)
                .intersects(WcFlags::WITH_INV | WcFlags::WITH_IMM)
            {
                wc.__bindgen_anon_1.imm_data = (r.imm_data)(cq);
            }
            wc.byte_len = (r.byte_len)(cq);
            wc.qp_num = (r.qp_num)(cq);
            wc.src_qp = (r.src_qp)(cq);
            // The classic struct's slid is 16 bits; LIDs are.
            wc.slid = (r.slid)(cq) as u16;
            wc.pkey_index = 0;
            wc.sl = (r.sl)(cq);
            wc.dlid_path_bits = (r.dlid_path_bits)(cq);
        }
    }

    /// [`read_into`](Self::read_into) for another set of WC flags ([`ExFields::Asked`]):
    /// one test per optional field, zero for those not asked for.
    ///
    /// # Safety
    ///
    /// As for [`read_into`](Self::read_into), and `r` is this CQ's.
    #[inline(always)]
    pub(super) unsafe fn read_asked(self, r: &AskedReaders, wc: &mut ffi::ibv_wc) {
        let cq = self.raw.as_ptr();
        // SAFETY: as in read_head; a reader of r is there only when its WC flag was asked
        // for, and is then the provider's, checked at creation.
        unsafe {
            let with = self.read_head(wc);
            wc.byte_len = r.byte_len.map_or(0, |read| read(cq));
            // verbs.h reads the invalidated rkey with the immediate data's reader.
            match r.imm_data {
                Some(read) if with.intersects(WcFlags::WITH_INV | WcFlags::WITH_IMM) => {
                    wc.__bindgen_anon_1.imm_data = read(cq);
                }
                // Flagged but not asked for: zero, as the CQ reports it.
                None => wc.__bindgen_anon_1.imm_data = 0,
                Some(_) => {}
            }
            wc.qp_num = r.qp_num.map_or(0, |read| read(cq));
            wc.src_qp = r.src_qp.map_or(0, |read| read(cq));
            wc.slid = r.slid.map_or(0, |read| read(cq) as u16);
            wc.pkey_index = 0;
            wc.sl = r.sl.map_or(0, |read| read(cq));
            wc.dlid_path_bits = r.dlid_path_bits.map_or(0, |read| read(cq));
        }
    }

    /// `ibv_wc_read_completion_ts` of the current entry, when the CQ reports it.
    ///
    /// # Safety
    ///
    /// As for [`read`](Self::read).
    #[inline]
    pub(super) unsafe fn completion_ts(self) -> Option<u64> {
        let read = self.fns.read_completion_ts?;
        // SAFETY: positioned on an entry (the caller's promise); the reader is the
        // provider's, there because COMPLETION_TIMESTAMP was asked for.
        Some(unsafe { read(self.raw.as_ptr()) })
    }

    /// Reads up to `out.len()` ready entries into `out` in one sequence; how many.
    ///
    /// # Safety
    ///
    /// The caller holds the CQ's polling flag, and no sequence of this CQ is open.
    #[inline(always)]
    pub(super) unsafe fn poll_into(
        self,
        out: &mut [WorkCompletion],
    ) -> Result<usize, CompletionQueueError> {
        // Which readers a completion calls is chosen once per poll, not per completion:
        // one loop for each kind.
        // SAFETY: the caller's promise; each loop reads entries with this CQ's readers.
        unsafe {
            match &self.fns.fields {
                ExFields::Standard(r) => self.poll_into_with(out, |wc| self.read_standard(r, wc)),
                ExFields::Asked(r) => self.poll_into_with(out, |wc| self.read_asked(r, wc)),
            }
        }
    }

    /// [`poll_into`](Self::poll_into), reading each entry with `read`.
    ///
    /// # Safety
    ///
    /// As for [`poll_into`](Self::poll_into); `read` may be called when the CQ is
    /// positioned on an entry, and reads it as [`read_into`](Self::read_into) does.
    #[inline(always)]
    pub(super) unsafe fn poll_into_with(
        self,
        out: &mut [WorkCompletion],
        read: impl Fn(&mut ffi::ibv_wc),
    ) -> Result<usize, CompletionQueueError> {
        if out.is_empty() {
            return Ok(0);
        }
        // SAFETY: the caller holds the claim with no sequence open.
        match unsafe { self.start() } {
            0 => {}
            libc::ENOENT => return Ok(0),
            ret => return Err(poll_error("ibv_start_poll", ret)),
        }
        // The entries left to fill, as an iterator: one pointer moving to a fixed end, where
        // an index would need a register (or a stack slot) of its own.
        let len = out.len();
        let mut slots = out.iter_mut();
        let ret = loop {
            // Not empty: out is not, and the loop ends when the last entry is filled.
            let Some(slot) = slots.next() else { break 0 };
            // start or next just positioned the CQ on an entry.
            read(&mut slot.raw);
            if slots.len() == 0 {
                // Every entry filled: the count is known without the iterator's.
                // SAFETY: the sequence start opened, ended once.
                unsafe { self.end() };
                return Ok(len);
            }
            // SAFETY: inside the sequence start opened.
            match unsafe { self.next() } {
                0 => {}
                ret => break ret,
            }
        };
        let n = len - slots.len();
        // SAFETY: the sequence start opened, ended once.
        unsafe { self.end() };
        match ret {
            0 | libc::ENOENT => Ok(n),
            ret => Err(poll_error("ibv_next_poll", ret)),
        }
    }
}

/// `ibv_poll_cq` of one entry: the completion, `Ok(None)` when there is none, or the verb
/// and what it returned.
///
/// The entry polled into must be initialised: providers need not write every field (a
/// send's has no source QP), and Rust must not read bytes nobody wrote. A [`ClaimedCq`]
/// lends its `slot`, zeroed once per claim (what an earlier completion left in a field the
/// provider skips is as meaningless as the stack bytes a C program leaves there, and as
/// harmless); without one, a zeroed local per poll, three stores more than C.
#[inline(always)]
pub(super) fn poll_one(
    cq: ClassicCq,
    slot: Option<&mut WorkCompletion>,
) -> Result<Option<WorkCompletion>, (&'static str, c_int)> {
    let mut local;
    let wc = match slot {
        Some(slot) => slot,
        None => {
            local = WorkCompletion::default();
            &mut local
        }
    };
    // SAFETY: cq is live (the caller borrows its CompletionQueue); wc is one initialised
    // ibv_wc of ours.
    let ret = unsafe { (cq.poll_cq)(cq.raw.as_ptr(), 1, &mut wc.raw) };
    // A completion first, as C's `while (ibv_poll_cq(cq, 1, &wc) == 1)`: one test on the
    // path of every completion; empty and failed polls are told apart after it.
    if ret > 0 {
        // Never more than asked, whatever the provider says.
        Ok(Some(*wc))
    } else if ret == 0 {
        Ok(None)
    } else {
        Err(("ibv_poll_cq", ret))
    }
}

/// What a [`Poller`] polls: fixed for the poller's life, so that in a loop over a poller
/// the compiler tests a value it holds in a register, not the state the loop changes.
pub(super) enum PollKind<'a> {
    /// A classic CQ: every completion is one `ibv_poll_cq`, into the claim's entry (a
    /// local one when `None`).
    Classic(ClassicCq, Option<&'a mut WorkCompletion>),
    /// An extended CQ: one `ibv_start_poll`..`ibv_end_poll` sequence.
    Extended(ExPoll<'a>),
}

/// Where an extended CQ's [`Poller`] is in its sequence.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum ExState {
    /// `ibv_start_poll` positioned the CQ on an entry not handed out yet.
    Positioned,
    /// Positioned on the entry handed out last; the next one needs `ibv_next_poll`.
    Current,
    /// No sequence is open: the CQ was empty, ran empty, or failed (and always, for a
    /// classic CQ).
    Ended,
}

/// An iterator over the completions ready on a CQ; from
/// [`CompletionQueue::poll`](crate::completion_queue::CompletionQueue::poll) or
/// [`ClaimedCq::poll`](crate::completion_queue::ClaimedCq::poll).
///
/// Ends (`None`) when no completion is ready; poll again later for more. An error from the
/// device ends the iteration too: use [`Poller::next_completion`] to see it.
///
/// On an extended CQ the poller is one `ibv_start_poll`..`ibv_end_poll` sequence, positioned
/// on the completion it handed out last; [`completion_timestamp`](Self::completion_timestamp)
/// reads that completion's timestamp.
#[must_use = "a Poller does nothing unless iterated"]
#[doc(alias = "ibv_end_poll")]
pub struct Poller<'a> {
    kind: PollKind<'a>,
    ex_state: ExState,
    _guard: PollGuard<'a>,
}

impl Poller<'_> {
    /// The next ready completion, `Ok(None)` when there is none, or the poll verb's error.
    #[doc(alias = "ibv_next_poll")]
    #[inline(always)]
    pub fn next_completion(&mut self) -> Result<Option<WorkCompletion>, CompletionQueueError> {
        self.advance().map_err(|(call, ret)| poll_error(call, ret))
    }

    /// The next ready completion, `Ok(None)` when there is none, or the verb that failed
    /// and what it returned. The error stays two plain values until someone asks for it:
    /// an `io::Error` on the way through makes the compiler spill the iterator's state.
    #[inline(always)]
    pub(super) fn advance(&mut self) -> Result<Option<WorkCompletion>, (&'static str, c_int)> {
        let ex = match self.kind {
            PollKind::Classic(cq, ref mut slot) => return poll_one(cq, slot.as_deref_mut()),
            PollKind::Extended(ex) => ex,
        };
        match self.ex_state {
            ExState::Positioned => {
                self.ex_state = ExState::Current;
                // SAFETY: the poller holds the claim; ibv_start_poll positioned the CQ.
                Ok(Some(unsafe { ex.read() }))
            }
            // SAFETY: the poller holds the claim, inside its sequence.
            ExState::Current => match unsafe { ex.next() } {
                // SAFETY: ibv_next_poll positioned the CQ on the next entry.
                0 => Ok(Some(unsafe { ex.read() })),
                ret => {
                    self.end();
                    match ret {
                        libc::ENOENT => Ok(None),
                        ret => Err(("ibv_next_poll", ret)),
                    }
                }
            },
            ExState::Ended => Ok(None),
        }
    }

    /// The completion timestamp (`ibv_wc_read_completion_ts`: the device clock when the
    /// completion was written) of the completion [`next`](Iterator::next) or
    /// [`next_completion`](Self::next_completion) returned last, read while the poll is
    /// still positioned on it.
    ///
    /// `None` for classic CQs, for extended CQs created without
    /// [`WcFlagsEx::COMPLETION_TIMESTAMP`], and when no completion is current: before the
    /// first one, and once the poller has run out. A `for` loop holds the poller; to read
    /// timestamps, iterate with `while let Some(wc) = poller.next()`.
    #[doc(alias = "ibv_wc_read_completion_ts")]
    #[inline]
    pub fn completion_timestamp(&self) -> Option<u64> {
        match (&self.kind, self.ex_state) {
            // SAFETY: the poller holds the claim, positioned on the entry handed out last.
            (PollKind::Extended(ex), ExState::Current) => unsafe { ex.completion_ts() },
            _ => None,
        }
    }

    /// Ends the poll sequence, if one is open.
    #[inline(always)]
    pub(super) fn end(&mut self) {
        if let PollKind::Extended(ex) = self.kind {
            if self.ex_state != ExState::Ended {
                // SAFETY: the sequence ibv_start_poll opened is ended once: the state
                // leaves it.
                unsafe { ex.end() };
                self.ex_state = ExState::Ended;
            }
        }
    }
}

impl Iterator for Poller<'_> {
    type Item = WorkCompletion;

    #[inline(always)]
    fn next(&mut self) -> Option<WorkCompletion> {
        self.advance().ok().flatten()
    }
}

impl Drop for Poller<'_> {
    #[inline]
    fn drop(&mut self) {
        self.end();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_provider_without_poll_cq_fails_every_poll() {
        let mut wc = WorkCompletion::default();
        // SAFETY: the stub touches nothing.
        let ret = unsafe { poll_cq_unsupported(std::ptr::null_mut(), 1, &mut wc.raw) };
        assert_eq!(ret, -libc::EOPNOTSUPP);
        let err = poll_error("ibv_poll_cq", ret).to_string();
        assert!(err.contains("ibv_poll_cq"), "{err}");
    }
}
