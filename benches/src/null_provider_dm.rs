//! Device memory for the null provider (`csrc/null_provider_dm.c`): its `alloc_dm`,
//! `free_dm` and `reg_dm_mr` ops and the `ibv_dm` copy functions, reached through verbs.h's
//! inlines, so sideway's [`DeviceMemory`](sideway::device_memory::DeviceMemory) and regions over it
//! can be tested without a device that has device memory.

use std::ptr::NonNull;

use sideway::sys::{ibv_context, ibv_dm, ibv_pd};

use crate::null_provider::NullProvider;

/// The most bytes one `alloc_dm` hands out (`NULL_DM_MAX`); more fails with `ENOMEM`.
pub const DM_MAX: usize = 64 * 1024;
/// The lkey of the first region over a device memory (`NULL_DM_LKEY_BASE`).
pub const DM_LKEY_BASE: u32 = 0xd000;

/// What the device-memory operations saw (`struct null_dm_counters`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DmCounters {
    /// `alloc_dm` calls.
    pub alloc_dm_calls: u64,
    /// `free_dm` calls.
    pub free_dm_calls: u64,
    /// `memcpy_to_dm` calls.
    pub copy_to_calls: u64,
    /// `memcpy_from_dm` calls.
    pub copy_from_calls: u64,
    /// `reg_dm_mr` calls.
    pub reg_dm_mr_calls: u64,
    /// Device memories allocated and not yet freed.
    pub live_dms: u64,
    /// Regions over device memory not yet freed.
    pub live_mrs: u64,
    /// `length` of the last `alloc_dm`.
    pub last_alloc_length: u64,
    /// `log_align_req` of the last `alloc_dm`.
    pub last_log_align_req: u32,
    /// `comp_mask` of the last `alloc_dm`.
    pub last_alloc_comp_mask: u32,
    /// `dm_offset` of the last copy.
    pub last_copy_offset: u64,
    /// `length` of the last copy.
    pub last_copy_length: u64,
    /// `dm_offset` of the last `reg_dm_mr`.
    pub last_reg_offset: u64,
    /// `length` of the last `reg_dm_mr`.
    pub last_reg_length: u64,
    /// `access` of the last `reg_dm_mr`.
    pub last_reg_access: u32,
    pad: u32,
    /// `pd` of the last `reg_dm_mr`.
    pub last_reg_pd: *mut ibv_pd,
    /// `dm` of the last `reg_dm_mr`.
    pub last_reg_dm: *mut ibv_dm,
}

#[repr(C)]
struct RawState {
    _private: [u8; 0],
}

extern "C" {
    fn null_dm_enable(ctx: *mut ibv_context) -> *mut RawState;
    fn null_dm_disable(st: *mut RawState);
    fn null_dm_counters(st: *const RawState) -> *const DmCounters;
    fn null_dm_fail_copies(st: *mut RawState, err: i32);
}

/// Device memory on a null provider, from [`NullDm::enable`] until dropped (which takes it
/// away again; device memory still allocated keeps working until freed).
pub struct NullDm<'a> {
    st: NonNull<RawState>,
    /// The provider, whose context's ops point into this state until it is dropped.
    _np: &'a NullProvider,
}

impl<'a> NullDm<'a> {
    /// Gives `np` device memory.
    ///
    /// # Panics
    ///
    /// When the C allocation fails (out of memory).
    pub fn enable(np: &'a NullProvider) -> Self {
        // SAFETY: the context is the provider's live one, an extended verbs_context.
        let st = unsafe { null_dm_enable(np.context_raw()) };
        NullDm {
            st: NonNull::new(st).expect("null_dm_enable: out of memory"),
            _np: np,
        }
    }

    /// What the operations saw so far.
    pub fn counters(&self) -> DmCounters {
        // SAFETY: st is live until self is dropped; the copy is taken at once.
        unsafe { *null_dm_counters(self.st.as_ptr()) }
    }

    /// Makes every later copy fail with `errno` (0: copies succeed again).
    pub fn fail_copies(&self, errno: i32) {
        // SAFETY: st is live until self is dropped.
        unsafe { null_dm_fail_copies(self.st.as_ptr(), errno) }
    }
}

impl Drop for NullDm<'_> {
    fn drop(&mut self) {
        // SAFETY: st came from null_dm_enable and is disabled once.
        unsafe { null_dm_disable(self.st.as_ptr()) }
    }
}
