//! Binding a type 1 memory window through a queue pair (`ibv_bind_mw`). Here, not in the
//! window's module, so that windows sit below queue pairs: a type 2 bind is a work request
//! of the send guard, which names the window.

use std::ops::Range;
use std::sync::Arc;

use rdma_mummy_sys as ffi;

use super::qp::{QueuePair, Threading};
use super::work_request::SendFlags;
use crate::errno::{fresh, from_ret};
use crate::verbs::memory_region::{AccessFlags, MemoryRegion};
use crate::verbs::memory_window::{bind_access_missing, MemoryWindow, MemoryWindowError};

impl MemoryWindow {
    /// Binds a type 1 window to `range` (addresses) of `mr` with `access`
    /// (`ibv_bind_mw`), posting the bind on `qp` with `wr_id` and `flags` (a completion
    /// follows when signaled). An empty range unbinds it. Returns the window's new rkey,
    /// valid once the bind completes. From this call on, the window holds `mr` until it is
    /// dropped, whether or not the bind takes effect (see the [module](crate::memory_window)).
    ///
    /// # Errors
    ///
    /// [`MemoryWindowError::BindAccess`], before `ibv_bind_mw` is called, when `access`
    /// asks for what `mr` does not allow ([`bind_access_missing`]);
    /// [`MemoryWindowError::Bind`] when `ibv_bind_mw` fails.
    #[doc(alias = "ibv_bind_mw")]
    pub fn bind<T: Threading>(
        &self,
        qp: &mut QueuePair<T>,
        wr_id: u64,
        flags: SendFlags,
        mr: &Arc<MemoryRegion>,
        range: Range<u64>,
        access: AccessFlags,
    ) -> Result<u32, MemoryWindowError> {
        let len = range.end.saturating_sub(range.start);
        let missing = bind_access_missing(mr.access(), len, access);
        if !missing.is_empty() {
            return Err(MemoryWindowError::BindAccess {
                rkey: self.rkey(),
                lkey: mr.lkey(),
                access,
                region_access: mr.access(),
                missing,
            });
        }
        let mut bind = ffi::ibv_mw_bind {
            wr_id,
            send_flags: flags.bits(),
            bind_info: ffi::ibv_mw_bind_info {
                mr: mr.as_raw(),
                addr: range.start,
                length: len,
                mw_access_flags: access.bits(),
            },
        };
        let old = self.rkey();
        // Held before the device can act on the bind, and until the window is deallocated:
        // should this bind fail, the window may still be bound to a region held earlier.
        self.hold(mr);
        // SAFETY: qp is live and borrowed mutably (no batch is open on it); the window and
        // region are live; bind is fully initialised and read during the call.
        let ret = fresh(|| unsafe { ffi::ibv_bind_mw(qp.as_raw(), self.as_raw(), &mut bind) });
        from_ret(ret).map_err(|source| MemoryWindowError::Bind {
            rkey: old,
            lkey: mr.lkey(),
            len,
            qp_num: qp.qp_num(),
            source,
        })?;
        Ok(self.rkey())
    }
}

impl MemoryWindow {
    /// Unbinds a type 1 window: `ibv_bind_mw` to an empty range of `mr`, the region it
    /// was bound to, posted on `qp` like [`bind`](Self::bind); the old rkey stops working
    /// once it completes. Returns the window's new rkey. The window keeps holding `mr`, and
    /// every region it was bound to, until it is dropped.
    ///
    /// verbs.h also allows a NULL region for this, but rxe's provider (rdma-core 56)
    /// dereferences it, so the region is always passed.
    #[doc(alias = "ibv_bind_mw")]
    pub fn unbind<T: Threading>(
        &self,
        qp: &mut QueuePair<T>,
        wr_id: u64,
        flags: SendFlags,
        mr: &Arc<MemoryRegion>,
    ) -> Result<u32, MemoryWindowError> {
        let start = mr.addr();
        self.bind(qp, wr_id, flags, mr, start..start, AccessFlags::empty())
    }
}
