//! Application memory handed to the NIC for one transfer: a buffer lent to the peer, or
//! the target of a lent region being fetched. The one place trespass registers memory it
//! does not own for good, so the one place (with the fetch's `set_len` in the driver) that
//! needs `unsafe` for it.
//!
//! The rule it keeps: the application gets its `Vec` back only after the registration is
//! gone (the device can no longer read or write it, and the key the peer was told opens
//! nothing), and never if the deregistration failed.
#![allow(unsafe_code)]

use std::sync::{Arc, Mutex};

use sideway::memory_region::{AccessFlags, MemoryRegion};
use sideway::protection_domain::ProtectionDomain;

use crate::error::Error;
use crate::wire::Lend;

/// Memory registered for one transfer alone: a buffer lent to the peer (remote read), or
/// the target of a fetch (local write). The registration owns the `Vec`; once it is
/// deregistered (dropped), its owner puts the `Vec` in `back`, so it returns to the
/// application only when the device can no longer reach it. A failed deregistration leaks
/// it on purpose (sideway's rule), and `back` stays empty.
pub(crate) struct Loan {
    pub(crate) mr: Arc<MemoryRegion>,
    back: Arc<Mutex<Option<Vec<u8>>>>,
    len: u32,
}

/// The owner a [`Loan`]'s registration keeps: hands the `Vec` back when dropped.
struct HandBack {
    vec: Option<Vec<u8>>,
    back: Arc<Mutex<Option<Vec<u8>>>>,
}

impl Drop for HandBack {
    fn drop(&mut self) {
        if let Some(v) = self.vec.take() {
            *self.back.lock().unwrap_or_else(|p| p.into_inner()) = Some(v);
        }
    }
}

impl Loan {
    /// Registers the first `len` bytes of `vec`'s allocation (`vec` has at least that
    /// capacity) with `access`. On failure the `Vec` comes back with the error.
    pub(crate) fn new(
        pd: &Arc<ProtectionDomain>,
        mut vec: Vec<u8>,
        len: u32,
        access: AccessFlags,
    ) -> Result<Loan, Box<(Error, Vec<u8>)>> {
        debug_assert!(vec.capacity() >= len as usize && len > 0);
        let ptr = vec.as_mut_ptr();
        let back = Arc::new(Mutex::new(None));
        let owner = HandBack {
            vec: Some(vec),
            back: Arc::clone(&back),
        };
        // SAFETY: `ptr..ptr + len` lies inside the allocation of the `Vec` that `owner`
        // holds (its capacity is at least `len`); moving a `Vec` does not move its heap
        // memory, and nothing touches it until `owner` is dropped, which the region does
        // only after it is deregistered (never, if that fails). No Rust reference covers the
        // bytes while the registration lives: the `Vec` is reached again only through
        // `back`, after the drop.
        let mr = unsafe { pd.reg_mr_owned(owner, ptr, len as usize, access) };
        match mr {
            Ok(mr) => Ok(Loan { mr, back, len }),
            Err(e) => {
                let vec = back
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take()
                    .unwrap_or_default();
                let what = if access.contains(AccessFlags::REMOTE_READ) {
                    "registering a buffer to lend"
                } else {
                    "registering the target of a lent region"
                };
                Err(Box::new((Error::verbs(what, e), vec)))
            }
        }
    }

    /// What the peer is told: where the region is and the key that reads it.
    pub(crate) fn descriptor(&self) -> Lend {
        Lend {
            addr: self.mr.addr(),
            rkey: self.mr.rkey(),
            len: self.len,
        }
    }

    /// Deregisters the memory and returns its `Vec` (length untouched); `None` when the
    /// deregistration failed and the memory was leaked on purpose.
    pub(crate) fn end(self) -> Option<Vec<u8>> {
        let Loan { mr, back, .. } = self;
        drop(mr);
        let v = back.lock().unwrap_or_else(|p| p.into_inner()).take();
        v
    }
}
