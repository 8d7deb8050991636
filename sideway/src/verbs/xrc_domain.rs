//! XRC domains (`struct ibv_xrcd`): the object that ties together the XRC shared receive
//! queues and XRC receive QPs of one node (eXtended Reliable Connected transport), so that a
//! sender reaches any SRQ of the domain through one connection and names the SRQ in each
//! send. A domain opened on a file (`fd`) is shared with every process that opens the same
//! file; without one it is this process's alone.
//!
//! An XRC domain holds its device context. The XRC SRQs made on it
//! ([`SharedReceiveQueueBuilder::xrcd`](crate::shared_receive_queue::SharedReceiveQueueBuilder::xrcd))
//! and its receive QPs ([`XrcDomain::create_recv_qp`], [`XrcRecvQueuePair`](crate::queue_pair::XrcRecvQueuePair))
//! hold the domain, so it is closed (`ibv_close_xrcd`) after all of them.

use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::raw::c_int;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_mummy_sys as ffi;

use crate::errno::{fresh, from_ret, non_null};
use crate::verbs::device::DeviceContext;

/// `ibv_open_xrcd` failed; `EOPNOTSUPP` when the device has no XRC (rxe, siw): see
/// [`is_not_supported`](Self::is_not_supported).
#[derive(Debug, thiserror::Error)]
#[error("ibv_open_xrcd (fd {}, oflags {oflags:#o}) failed on {device}: {source}{}",
    fd.map_or_else(|| "none".to_owned(), |fd| fd.to_string()), xrcd_hint(source))]
pub struct XrcDomainError {
    /// The device's name.
    pub device: String,
    /// The file descriptor the domain was opened on, if any.
    pub fd: Option<c_int>,
    /// The open flags passed (`O_CREAT`, `O_EXCL`).
    pub oflags: c_int,
    /// The errno.
    #[source]
    pub source: io::Error,
}

fn xrcd_hint(source: &io::Error) -> &'static str {
    match source.raw_os_error() {
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => {
            " (not supported by this device: its provider has no XRC; mlx4 and mlx5 have it, \
             rxe and siw do not)"
        }
        Some(libc::ENOENT) => {
            " (no XRC domain is bound to this file yet: pass O_CREAT to create one)"
        }
        Some(libc::EEXIST) => " (O_EXCL, but a domain is already bound to this file)",
        _ => "",
    }
}

impl XrcDomainError {
    /// True when the device does not implement XRC (`EOPNOTSUPP`, or `ENOSYS` from older
    /// kernels): no XRC domain, SRQ or QP can be made on it.
    pub fn is_not_supported(&self) -> bool {
        matches!(
            self.source.raw_os_error(),
            Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS)
        )
    }

    /// The errno, as rdma-core's programs print it (`ibv_xsrq_pingpong`'s "Couldn't Open the
    /// XRC Domain 95").
    pub fn errno(&self) -> i32 {
        self.source.raw_os_error().unwrap_or(libc::EIO)
    }
}

/// An XRC domain (`ibv_open_xrcd`); closed (`ibv_close_xrcd`) when the last `Arc` goes,
/// after every XRC SRQ and XRC receive QP made on it (they hold its `Arc`).
#[doc(alias = "ibv_xrcd")]
#[doc(alias = "ibv_close_xrcd")]
pub struct XrcDomain {
    raw: NonNull<ffi::ibv_xrcd>,
    ctx: Arc<DeviceContext>,
}

// SAFETY: an XRC domain is a kernel handle; libibverbs' verbs on it (create SRQ/QP, close)
// take no thread-affine state and may be called from any thread.
unsafe impl Send for XrcDomain {}
// SAFETY: as above; `&self` methods only read the handle.
unsafe impl Sync for XrcDomain {}

impl DeviceContext {
    /// Opens an XRC domain (`ibv_open_xrcd`). With `fd`, the domain is bound to that file's
    /// inode, and every process that opens it on the same file shares it: `oflags` then says
    /// whether to create it (`libc::O_CREAT`) and whether it must be new (`libc::O_EXCL`).
    /// Without `fd` (`-1` to the verb), the domain is private and `oflags` must hold
    /// `O_CREAT`. The kernel takes its own reference to the file: `fd` may be closed once
    /// this returns.
    ///
    /// Devices without XRC (rxe, siw) fail with `EOPNOTSUPP`
    /// ([`XrcDomainError::is_not_supported`]).
    #[doc(alias = "ibv_open_xrcd")]
    pub fn open_xrcd(
        self: &Arc<Self>,
        fd: Option<BorrowedFd<'_>>,
        oflags: c_int,
    ) -> Result<Arc<XrcDomain>, XrcDomainError> {
        let raw_fd = fd.map_or(-1, |fd| fd.as_raw_fd());
        let mut attr = ffi::ibv_xrcd_init_attr {
            comp_mask: ffi::ibv_xrcd_init_attr_mask::IBV_XRCD_INIT_ATTR_FD
                | ffi::ibv_xrcd_init_attr_mask::IBV_XRCD_INIT_ATTR_OFLAGS,
            fd: raw_fd,
            oflags,
        };
        // SAFETY: the context is open for as long as self lives; attr is initialised and
        // only read by the verb; fd, when given, is borrowed (open) for the call.
        let xrcd = fresh(|| unsafe { ffi::ibv_open_xrcd(self.as_raw(), &mut attr) });
        let raw = non_null(xrcd).map_err(|source| XrcDomainError {
            device: self.name().to_owned(),
            fd: fd.map(|fd| fd.as_raw_fd()),
            oflags,
            source,
        })?;
        Ok(Arc::new(XrcDomain {
            raw,
            ctx: Arc::clone(self),
        }))
    }
}

impl XrcDomain {
    /// The device context this domain belongs to.
    pub fn context(&self) -> &Arc<DeviceContext> {
        &self.ctx
    }

    /// The raw `ibv_xrcd`, valid while this domain is alive.
    pub fn as_raw(&self) -> *mut ffi::ibv_xrcd {
        self.raw.as_ptr()
    }
}

impl Drop for XrcDomain {
    fn drop(&mut self) {
        // ibv_close_xrcd is a verbs.h inline reaching the provider's own close_xrcd, so it is
        // called on a test double's context too (whose provider implements it).
        // SAFETY: raw came from ibv_open_xrcd and is closed once; every XRC SRQ and receive
        // QP made on it holds an Arc of this domain, so none is left.
        let ret = fresh(|| unsafe { ffi::ibv_close_xrcd(self.raw.as_ptr()) });
        if let Err(e) = from_ret(ret) {
            crate::diagnostics::report_drop_failure("ibv_close_xrcd", "an XRC domain", &e);
        }
    }
}

impl fmt::Debug for XrcDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("XrcDomain")
            .field("device", &self.ctx.name())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_supported_is_typed_and_said() {
        let e = XrcDomainError {
            device: "rxe0".into(),
            fd: Some(3),
            oflags: libc::O_CREAT,
            source: io::Error::from_raw_os_error(libc::EOPNOTSUPP),
        };
        assert!(e.is_not_supported());
        assert_eq!(e.errno(), 95);
        let text = e.to_string();
        assert!(
            text.starts_with("ibv_open_xrcd (fd 3, oflags 0o100) failed on rxe0"),
            "{text}"
        );
        assert!(text.contains("not supported by this device"), "{text}");
        let e = XrcDomainError {
            fd: None,
            source: io::Error::from_raw_os_error(libc::ENOENT),
            ..e
        };
        assert!(!e.is_not_supported());
        assert!(e.to_string().contains("fd none"), "{e}");
        assert!(e.to_string().contains("pass O_CREAT"), "{e}");
    }
}
