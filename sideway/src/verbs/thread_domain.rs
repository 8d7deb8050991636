//! Thread domains (`struct ibv_td`): a promise to the provider that the objects bound to the
//! domain are used by one thread at a time, so it may leave out its locks. A thread domain
//! holds its device context; the parent domains bound to it hold it
//! ([`crate::parent_domain`]).

use std::fmt;
use std::io;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_mummy_sys as ffi;

use crate::errno::{fresh, from_ret, non_null};
use crate::verbs::device::DeviceContext;

/// `ibv_alloc_td` or `ibv_alloc_parent_domain` failed; `EOPNOTSUPP` when the device has no
/// such objects (rxe, siw): see [`is_not_supported`](Self::is_not_supported).
#[derive(Debug, thiserror::Error)]
#[error("{call} failed on {device}: {source}{}", domain_hint(source))]
pub struct DomainError {
    /// `ibv_alloc_td` or `ibv_alloc_parent_domain`.
    pub call: &'static str,
    /// The device's name.
    pub device: String,
    /// The errno.
    #[source]
    pub source: io::Error,
}

fn domain_hint(source: &io::Error) -> &'static str {
    match source.raw_os_error() {
        Some(libc::EOPNOTSUPP) => {
            " (not supported by this device: its provider has no thread or parent domains; \
             mlx5 has them, rxe and siw do not)"
        }
        _ => "",
    }
}

impl DomainError {
    /// True when the device does not implement the verb (`EOPNOTSUPP`): its provider has no
    /// thread or parent domains. Create the objects on the protection domain instead.
    pub fn is_not_supported(&self) -> bool {
        self.source.raw_os_error() == Some(libc::EOPNOTSUPP)
    }
}

/// A thread domain (`ibv_alloc_td`): objects bound to it, through a
/// [`ParentDomain`](crate::parent_domain::ParentDomain), are used by one thread at a time,
/// and the provider takes no lock for them (mlx5 also gives the domain a doorbell register of
/// its own, which every QP bound to it shares). Deallocated (`ibv_dealloc_td`) when the last
/// `Arc` goes, after every parent domain bound to it.
///
/// # Threads
///
/// A `ThreadDomain` is neither `Send` nor `Sync`: it stays on the thread that allocated it,
/// and so do the parent domains bound to it. Allocate it on the thread that will post.
///
/// ```compile_fail,E0277
/// # fn demo(td: std::sync::Arc<sideway::thread_domain::ThreadDomain>) {
/// std::thread::spawn(move || drop(td)); // a thread domain cannot leave its thread
/// # }
/// ```
#[doc(alias = "ibv_td")]
#[doc(alias = "ibv_dealloc_td")]
pub struct ThreadDomain {
    raw: NonNull<ffi::ibv_td>,
    ctx: Arc<DeviceContext>,
    /// Neither `Send` nor `Sync`: see the type's "Threads".
    _one_thread: PhantomData<*const ()>,
}

impl DeviceContext {
    /// Allocates a thread domain (`ibv_alloc_td`). Devices without thread domains (rxe, siw)
    /// fail with `EOPNOTSUPP` ([`DomainError::is_not_supported`]).
    #[doc(alias = "ibv_alloc_td")]
    pub fn alloc_td(self: &Arc<Self>) -> Result<Arc<ThreadDomain>, DomainError> {
        let mut attr = ffi::ibv_td_init_attr { comp_mask: 0 };
        // SAFETY: the context is open for as long as self lives; attr is initialised and
        // only read by the verb.
        let td = fresh(|| unsafe { ffi::ibv_alloc_td(self.as_raw(), &mut attr) });
        let raw = non_null(td).map_err(|source| DomainError {
            call: "ibv_alloc_td",
            device: self.name().to_owned(),
            source,
        })?;
        // An Arc, not an Rc, although the value stays on this thread: the parent domain's PD
        // (shared with Send objects) holds a clone and may drop it on another thread.
        #[allow(clippy::arc_with_non_send_sync)]
        let made = Arc::new(ThreadDomain {
            raw,
            ctx: Arc::clone(self),
            _one_thread: PhantomData,
        });
        Ok(made)
    }
}

impl ThreadDomain {
    /// The device context this thread domain belongs to.
    pub fn context(&self) -> &Arc<DeviceContext> {
        &self.ctx
    }

    /// The raw `ibv_td`, valid while this thread domain is alive.
    pub fn as_raw(&self) -> *mut ffi::ibv_td {
        self.raw.as_ptr()
    }
}

impl Drop for ThreadDomain {
    fn drop(&mut self) {
        // ibv_dealloc_td is a verbs.h inline reaching the provider's own dealloc_td, so it is
        // called on a test double's context too (whose provider implements it).
        // SAFETY: raw came from ibv_alloc_td; every parent domain bound to it holds an Arc
        // of this domain, so none is left.
        let ret = fresh(|| unsafe { ffi::ibv_dealloc_td(self.raw.as_ptr()) });
        if let Err(e) = from_ret(ret) {
            crate::diagnostics::report_drop_failure("ibv_dealloc_td", "a thread domain", &e);
        }
    }
}

impl fmt::Debug for ThreadDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThreadDomain")
            .field("device", &self.ctx.name())
            .finish_non_exhaustive()
    }
}
