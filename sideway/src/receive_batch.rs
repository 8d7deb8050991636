//! Receive batches: one type, [`RecvBatch`], builds a chain of receive work requests
//! (`struct ibv_recv_wr`) for a queue pair's receive queue ([`PostRecvGuard`], from
//! `QueuePair::start_post_recv`) and for a shared receive queue ([`SrqPostRecvGuard`], from
//! `SharedReceiveQueue::start_post_recv`), and posts it with one call of the queue's verb.
//!
//! A leaf: it knows the storage a batch is written into and the order of the calls; the
//! queue it posts to ([`ReceiveQueue`], implemented by the two queue modules above it) says
//! where the storage is, which verb posts, and how its errors read. The batch is generic over
//! the queue, so each queue's posting compiles to its own straight-line code.
//!
//! [`PostRecvGuard`]: crate::queue_pair::PostRecvGuard
//! [`SrqPostRecvGuard`]: crate::shared_receive_queue::SrqPostRecvGuard

use std::fmt;
use std::io;
use std::os::raw::c_int;

use rdma_mummy_sys as ffi;

use crate::errno::from_post_ret;
use crate::scatter_gather::Sge;

/// A queue that takes receive work requests: `QueuePair` (its receive queue) or
/// `SharedReceiveQueue`. Sealed: this crate implements it for those two only; its hidden
/// items are how [`RecvBatch`] reaches the queue.
pub trait ReceiveQueue: sealed::Sealed {
    /// What posting a batch fails with: [`PostError`](crate::queue_pair::PostError) for a
    /// QP, [`SharedReceiveQueueError`](crate::shared_receive_queue::SharedReceiveQueueError)
    /// for an SRQ.
    type Error: std::error::Error;

    /// What a batch holds while it is built: the queue with its storage, borrowed
    /// exclusively (a QP by `&mut`, an SRQ by its batch lock).
    #[doc(hidden)]
    type Claim<'a>
    where
        Self: 'a;

    /// The storage the batch is written into.
    #[doc(hidden)]
    fn storage<'c>(claim: &'c mut Self::Claim<'_>) -> &'c mut RecvStorage;

    /// Posts the chain starting at `head` with the queue's verb; its return value, and
    /// `bad` set to the first request not posted on failure.
    ///
    /// # Safety
    ///
    /// `head` is a NULL-terminated chain of receives in the claim's storage.
    #[doc(hidden)]
    unsafe fn post(
        claim: &mut Self::Claim<'_>,
        head: *mut ffi::ibv_recv_wr,
        bad: &mut *mut ffi::ibv_recv_wr,
    ) -> c_int;

    /// The queue a claim holds. Errors are built from it, not from the claim, so that only
    /// the queue's address reaches those out-of-line calls and the batch itself stays in
    /// registers on the data path.
    #[doc(hidden)]
    fn queue<'c>(claim: &'c Self::Claim<'_>) -> &'c Self;

    /// The error for receive `index` (`wr_id`), refused while the batch was built.
    #[doc(hidden)]
    fn refused(&self, index: usize, wr_id: u64, why: RecvRefusal) -> Self::Error;

    /// The error for a post of `count` receives that failed with `source`; `failed` is the
    /// index and `wr_id` of the first one not posted, when the verb said.
    #[doc(hidden)]
    fn failed(&self, count: usize, failed: Option<(usize, u64)>, source: io::Error) -> Self::Error;

    /// The queue's name and number, for `Debug`: `("qp_num", n)` or `("srq", handle)`.
    #[doc(hidden)]
    fn id(&self) -> (&'static str, u32);
}

pub(crate) mod sealed {
    /// Keeps [`ReceiveQueue`](super::ReceiveQueue) to this crate's queues.
    pub trait Sealed {}
}

/// Why a receive did not fit its batch; the queue turns it into its own error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecvRefusal {
    /// The batch already holds `capacity` receives (the queue's `max_wr`).
    BatchFull {
        /// The batch capacity.
        capacity: usize,
    },
    /// More scatter/gather entries than the queue's `max_sge`.
    TooManySge {
        /// Entries given.
        given: usize,
        /// The queue's limit.
        max: usize,
    },
}

/// How many requests of `max_sge` entries fit in `wrs` requests and `sges` entries.
pub(crate) fn slots(wrs: usize, sges: usize, max_sge: usize) -> usize {
    match sges.checked_div(max_sge) {
        Some(fit) => wrs.min(fit),
        None => wrs,
    }
}

/// Which request of a chain starting at `base` `bad` points at, if any.
pub(crate) fn chain_index<T>(base: *const T, bad: *const T, count: usize) -> Option<usize> {
    let size = std::mem::size_of::<T>();
    let off = (bad as usize).checked_sub(base as usize)?;
    (off % size == 0 && off / size < count).then_some(off / size)
}

/// Where receive batches are built, for a QP's receive queue and for an SRQ alike;
/// allocated once, with the queue, so posting receives allocates nothing.
///
/// `Vec`, not `Box<[_]>`: each receive's `next` and `sg_list` point into this storage, and
/// `Vec::as_mut_ptr` makes no reference to the whole buffer, so the pointers stored by
/// earlier receives stay valid while later ones are written (a `Box<[_]>`'s `as_mut_ptr`
/// reborrows the whole slice uniquely and invalidates them: Miri's stacked borrows reports
/// a read through them).
pub struct RecvStorage {
    wrs: Vec<ffi::ibv_recv_wr>,
    /// `max_sge` entries per request, request `i` at `i * max_sge`.
    sges: Vec<ffi::ibv_sge>,
    max_sge: usize,
    /// The receives one batch may hold: `wrs.len()`, and `capacity * max_sge <=
    /// sges.len()`.
    capacity: usize,
}

impl RecvStorage {
    pub(crate) fn new(max_wr: u32, max_sge: u32) -> Self {
        let max_wr = max_wr as usize;
        let max_sge = max_sge as usize;
        let wr = ffi::ibv_recv_wr {
            wr_id: 0,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
        };
        let wrs = vec![wr; max_wr];
        let sges = vec![ffi::ibv_sge::default(); max_wr.saturating_mul(max_sge)];
        RecvStorage {
            capacity: slots(wrs.len(), sges.len(), max_sge),
            wrs,
            sges,
            max_sge,
        }
    }

    /// The receives one batch may hold.
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Writes receive `i` of the batch (scattered over `sges`, copied), linked to the slot
    /// after it; refuses what the storage cannot hold.
    #[inline]
    fn push(&mut self, i: usize, wr_id: u64, sges: &[Sge]) -> Result<(), RecvRefusal> {
        if i >= self.capacity {
            return Err(RecvRefusal::BatchFull {
                capacity: self.capacity,
            });
        }
        if sges.len() > self.max_sge {
            return Err(RecvRefusal::TooManySge {
                given: sges.len(),
                max: self.max_sge,
            });
        }
        // SAFETY: i < capacity, so slot i and its max_sge entries at i * max_sge lie inside
        // wrs and sges (RecvStorage::capacity), and slot + 1 is at most one past the end.
        let (slot, next, entries) = unsafe {
            let slot = self.wrs.as_mut_ptr().add(i);
            (
                slot,
                slot.add(1),
                self.sges.as_mut_ptr().add(i * self.max_sge),
            )
        };
        for (j, src) in sges.iter().enumerate() {
            // SAFETY: j < sges.len() <= max_sge: inside this receive's entries (above).
            unsafe { entries.add(j).write(*src.as_raw()) };
        }
        let wr = ffi::ibv_recv_wr {
            wr_id,
            // finish() ends the chain at the last receive.
            next,
            sg_list: if sges.is_empty() {
                std::ptr::null_mut()
            } else {
                entries
            },
            // sges.len() <= max_sge, which came from a u32.
            num_sge: sges.len() as c_int,
        };
        // SAFETY: slot is in bounds (above) and nothing else borrows the storage.
        unsafe { slot.write(wr) };
        Ok(())
    }

    /// Ends the chain of the first `count` receives and returns its head, for the post verb.
    ///
    /// # Safety
    ///
    /// `push` wrote receives `0..count` since this storage was last reused, and `count > 0`.
    #[inline]
    unsafe fn finish(&mut self, count: usize) -> *mut ffi::ibv_recv_wr {
        let head = self.wrs.as_mut_ptr();
        // SAFETY: by the caller, 0 < count and receive count - 1 was pushed, so it lies
        // inside wrs (push checked its index against capacity <= wrs.len()).
        unsafe { (*head.add(count - 1)).next = std::ptr::null_mut() };
        head
    }

    /// Which of the first `count` receives `bad` (the post verb's out-parameter) points at,
    /// and its `wr_id`.
    fn locate(&self, bad: *const ffi::ibv_recv_wr, count: usize) -> Option<(usize, u64)> {
        let index = chain_index(self.wrs.as_ptr(), bad, count)?;
        Some((index, self.wrs[index].wr_id))
    }
}

/// A batch of receive work requests being built, for a queue pair
/// ([`PostRecvGuard`](crate::queue_pair::PostRecvGuard), from `QueuePair::start_post_recv`)
/// or a shared receive queue
/// ([`SrqPostRecvGuard`](crate::shared_receive_queue::SrqPostRecvGuard), from
/// `SharedReceiveQueue::start_post_recv`). [`post`](Self::post) posts them with one
/// `ibv_post_recv` (or `ibv_post_srq_recv`); dropping the batch discards them. A receive the
/// batch cannot take is remembered and reported by `post`, which then posts nothing.
#[doc(alias = "ibv_recv_wr")]
#[must_use = "receives reach the device only through post(); dropping the guard discards them"]
pub struct RecvBatch<'a, Q: ReceiveQueue + 'a> {
    claim: Q::Claim<'a>,
    count: usize,
    invalid: Option<(usize, u64, RecvRefusal)>,
}

impl<Q: ReceiveQueue> fmt::Debug for RecvBatch<'_, Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (queue, id) = Q::queue(&self.claim).id();
        f.debug_struct("RecvBatch")
            .field(queue, &format_args!("{id:#x}"))
            .field("count", &self.count)
            .field("invalid", &self.invalid)
            .finish()
    }
}

impl<'a, Q: ReceiveQueue> RecvBatch<'a, Q> {
    /// An empty batch on the claimed queue.
    #[inline]
    pub(crate) fn new(claim: Q::Claim<'a>) -> Self {
        RecvBatch {
            claim,
            count: 0,
            invalid: None,
        }
    }

    /// Adds a receive work request (`struct ibv_recv_wr`) for up to the entries' total
    /// length, scattered over `sges` in order (empty for a receive that only takes immediate
    /// data). The entries are copied: the slice need not outlive the call.
    ///
    /// Returns the batch as a [`RecvChain`], to add the next receive or post in the same
    /// expression: `qp.start_post_recv().recv(1, &[sge]).post()?`.
    #[doc(alias = "ibv_recv_wr")]
    #[inline]
    pub fn recv(&mut self, wr_id: u64, sges: &[Sge]) -> RecvChain<'_, 'a, Q> {
        if self.invalid.is_none() {
            match Q::storage(&mut self.claim).push(self.count, wr_id, sges) {
                Ok(()) => self.count += 1,
                Err(why) => self.invalid = Some((self.count, wr_id, why)),
            }
        }
        RecvChain { batch: self }
    }

    /// How many receives the batch holds.
    pub fn len(&self) -> usize {
        self.count
    }

    /// True when the batch holds none.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Posts the batch with one `ibv_post_recv` (`ibv_post_srq_recv` for an SRQ). An empty
    /// batch posts nothing and succeeds. On failure the error names the first receive not
    /// posted and its `wr_id`, when the verb says; those before it were posted.
    #[doc(alias = "ibv_post_recv")]
    #[doc(alias = "ibv_post_srq_recv")]
    #[inline]
    pub fn post(mut self) -> Result<(), Q::Error> {
        self.post_batch()
    }

    /// What [`post`](Self::post) and [`RecvChain::post`] do: posts the batch and leaves it
    /// empty, whatever the outcome.
    #[inline(always)]
    fn post_batch(&mut self) -> Result<(), Q::Error> {
        if let Some((index, wr_id, why)) = self.invalid.take() {
            self.count = 0;
            return Err(Q::queue(&self.claim).refused(index, wr_id, why));
        }
        let count = self.count;
        if count == 0 {
            return Ok(());
        }
        self.count = 0;
        // SAFETY: recv() pushed receives 0..count (count > 0) into the claim's storage,
        // which this batch has held since it was empty.
        let head = unsafe { Q::storage(&mut self.claim).finish(count) };
        let mut bad: *mut ffi::ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: head is the NULL-terminated chain of count receives just finished, whose
        // sg_lists point into the storage (alive with the queue); the device checks every
        // SGE's lkey and bounds.
        let ret = unsafe { Q::post(&mut self.claim, head, &mut bad) };
        // The queue's number is read only for an error, after the call.
        from_post_ret(ret).map_err(|source| {
            let failed = Q::storage(&mut self.claim).locate(bad, count);
            Q::queue(&self.claim).failed(count, failed, source)
        })
    }
}

/// A receive batch after a receive was added to it: add the next one or post them all.
/// Returned by [`RecvBatch::recv`]; discarding it keeps the batch in the guard.
///
/// ```no_run
/// # fn demo(qp: &mut sideway::queue_pair::QueuePair, buf: &sideway::memory_region::RegisteredBuffer)
/// #     -> Result<(), sideway::queue_pair::PostError> {
/// // One expression: a guard, two receives, one ibv_post_recv.
/// qp.start_post_recv()
///     .recv(1, &[buf.sge(0..2048).unwrap()])
///     .recv(2, &[buf.sge(2048..4096).unwrap()])
///     .post()?;
/// // Or statement by statement.
/// let mut guard = qp.start_post_recv();
/// guard.recv(3, &[buf.sge(0..4096).unwrap()]);
/// guard.post()?;
/// # Ok(()) }
/// ```
///
/// The same for a shared receive queue:
///
/// ```no_run
/// # fn demo(srq: &sideway::shared_receive_queue::SharedReceiveQueue, buf: &sideway::memory_region::RegisteredBuffer)
/// #     -> Result<(), sideway::shared_receive_queue::SharedReceiveQueueError> {
/// srq.start_post_recv()
///     .recv(1, &[buf.sge(0..2048).unwrap()])
///     .recv(2, &[buf.sge(2048..4096).unwrap()])
///     .post()?;
/// # Ok(()) }
/// ```
pub struct RecvChain<'g, 'a, Q: ReceiveQueue> {
    batch: &'g mut RecvBatch<'a, Q>,
}

impl<Q: ReceiveQueue> fmt::Debug for RecvChain<'_, '_, Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.batch, f)
    }
}

impl<'g, 'a, Q: ReceiveQueue> RecvChain<'g, 'a, Q> {
    /// Adds the next receive, as [`RecvBatch::recv`].
    #[inline]
    pub fn recv(self, wr_id: u64, sges: &[Sge]) -> Self {
        self.batch.recv(wr_id, sges);
        self
    }

    /// Posts the batch with one call, as [`RecvBatch::post`], and leaves the guard empty.
    #[doc(alias = "ibv_post_recv")]
    #[doc(alias = "ibv_post_srq_recv")]
    #[inline]
    pub fn post(self) -> Result<(), Q::Error> {
        self.batch.post_batch()
    }

    /// How many receives the batch holds.
    pub fn len(&self) -> usize {
        self.batch.len()
    }

    /// True when the batch holds none.
    pub fn is_empty(&self) -> bool {
        self.batch.is_empty()
    }

    /// The guard, to go on with it by name.
    pub fn into_guard(self) -> &'g mut RecvBatch<'a, Q> {
        self.batch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_index_finds_the_bad_request() {
        let arr = [0u64; 4];
        let base = arr.as_ptr();
        assert_eq!(chain_index(base, &arr[2], 4), Some(2));
        assert_eq!(chain_index(base, &arr[3], 3), None);
        assert_eq!(chain_index(base, std::ptr::null(), 4), None);
    }

    fn sge(addr: u64) -> Sge {
        // SAFETY: never posted; the tests only read the storage back.
        unsafe { Sge::from_raw_parts(addr, 64, 7) }
    }

    #[test]
    fn the_storage_links_its_receives_and_refuses_what_does_not_fit() {
        let big = RecvStorage::new(8, 2);
        assert_eq!(big.capacity(), 8);
        assert!(big.capacity <= big.wrs.len() && big.capacity * big.max_sge <= big.sges.len());
        let mut st = RecvStorage::new(2, 2);
        assert_eq!(st.capacity(), 2);
        st.push(0, 10, &[sge(0x1000), sge(0x2000)]).unwrap();
        st.push(1, 11, &[]).unwrap();
        assert_eq!(
            st.push(2, 12, &[sge(0x3000)]),
            Err(RecvRefusal::BatchFull { capacity: 2 })
        );
        assert_eq!(
            st.push(1, 12, &[sge(1), sge(2), sge(3)]),
            Err(RecvRefusal::TooManySge { given: 3, max: 2 })
        );
        // SAFETY: receives 0 and 1 were pushed.
        let head = unsafe { st.finish(2) };
        // SAFETY: head points into st.wrs, two linked receives.
        let (first, second) = unsafe { (&*head, &*(*head).next) };
        assert_eq!((first.wr_id, first.num_sge), (10, 2));
        assert_eq!((second.wr_id, second.num_sge), (11, 0));
        assert!(second.next.is_null() && second.sg_list.is_null());
        // SAFETY: first.sg_list points at its two copied entries.
        let entries = unsafe { std::slice::from_raw_parts(first.sg_list, 2) };
        assert_eq!((entries[0].addr, entries[1].addr), (0x1000, 0x2000));
        assert_eq!(st.locate(second, 2), Some((1, 11)));
        assert_eq!(st.locate(std::ptr::null(), 2), None);
    }
}
