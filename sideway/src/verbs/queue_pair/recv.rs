//! The receive side of a queue pair: its receive batches are the crate's one receive batch
//! type ([`RecvBatch`]), posted with the provider's `post_recv`.

use std::io;
use std::os::raw::c_int;

use rdma_mummy_sys as ffi;

use super::qp::{AnyThread, QueuePair, Threading};
use super::work_request::{InvalidWorkRequest, PostError};
use crate::receive_batch::{sealed, ReceiveQueue, RecvBatch, RecvChain, RecvRefusal, RecvStorage};

/// A batch of receive work requests for a queue pair; from [`QueuePair::start_post_recv`].
/// [`post`](RecvBatch::post) posts them with one `ibv_post_recv`; dropping the guard
/// discards them. The same type as an SRQ's batch ([`RecvBatch`]).
pub type PostRecvGuard<'a, T = AnyThread> = RecvBatch<'a, QueuePair<T>>;

/// A queue pair's receive batch after a receive was added to it; see [`RecvChain`].
pub type PostRecvChain<'g, 'a, T = AnyThread> = RecvChain<'g, 'a, QueuePair<T>>;

impl<T: Threading> QueuePair<T> {
    /// Starts a batch of receive work requests, posted by one chained `ibv_post_recv` on
    /// [`post`](RecvBatch::post).
    #[doc(alias = "ibv_post_recv")]
    #[inline]
    pub fn start_post_recv(&mut self) -> PostRecvGuard<'_, T> {
        RecvBatch::new(self)
    }
}

impl<T: Threading> sealed::Sealed for QueuePair<T> {}

impl<T: Threading> ReceiveQueue for QueuePair<T> {
    type Error = PostError;
    type Claim<'a> = &'a mut QueuePair<T>;

    #[inline(always)]
    fn storage<'c>(claim: &'c mut &mut QueuePair<T>) -> &'c mut RecvStorage {
        &mut claim.recv
    }

    #[inline(always)]
    unsafe fn post(
        claim: &mut &mut QueuePair<T>,
        head: *mut ffi::ibv_recv_wr,
        bad: &mut *mut ffi::ibv_recv_wr,
    ) -> c_int {
        // SAFETY: the QP is live (borrowed mutably by the batch); head is a NULL-terminated
        // chain in its storage, by the caller; post_recv is the QP's provider's own.
        unsafe { (claim.posts.post_recv)(claim.raw.as_ptr(), head, bad) }
    }

    #[inline(always)]
    fn queue<'c>(claim: &'c &mut QueuePair<T>) -> &'c QueuePair<T> {
        claim
    }

    // Built inline, as a constant-tagged Err, so the compiler sees that posting ends here and
    // the QP does not escape into a call the loop around a post could come back from.
    #[inline]
    fn refused(&self, index: usize, wr_id: u64, why: RecvRefusal) -> PostError {
        PostError::Invalid {
            qp_num: self.qp_num(),
            index,
            wr_id,
            reason: InvalidWorkRequest::from_refusal(why, "recv"),
        }
    }

    #[inline]
    fn failed(&self, count: usize, failed: Option<(usize, u64)>, source: io::Error) -> PostError {
        PostError::Post {
            call: "ibv_post_recv",
            qp_num: self.qp_num(),
            count,
            index: failed.map(|(i, _)| i),
            wr_id: failed.map(|(_, id)| id),
            source,
        }
    }

    fn id(&self) -> (&'static str, u32) {
        ("qp_num", self.qp_num())
    }
}
