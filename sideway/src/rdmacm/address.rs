//! Socket addresses as rdma_cm takes and gives them, and the pair of them an id has.

use rdma_mummy_sys as ffi;
use std::ffi::c_void;
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::raw::c_int;
use std::ptr;

/// The addresses of an rdma_cm id, as far as they are known; shown in errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Endpoints {
    /// The local address.
    pub local: Option<SocketAddr>,
    /// The remote address.
    pub remote: Option<SocketAddr>,
}

impl fmt::Display for Endpoints {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.local, self.remote) {
            (Some(l), Some(r)) => write!(f, " ({l} -> {r})"),
            (Some(l), None) => write!(f, " (on {l})"),
            (None, Some(r)) => write!(f, " (to {r})"),
            (None, None) => Ok(()),
        }
    }
}

/// A socket address in the C layout rdma_cm takes.
pub(super) struct RawSockAddr {
    storage: libc::sockaddr_storage,
}

impl RawSockAddr {
    pub(super) fn new(addr: SocketAddr) -> Self {
        // SAFETY: sockaddr_storage is plain data; all zeros is a valid (AF_UNSPEC) value.
        let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        match addr {
            SocketAddr::V4(a) => {
                let sin = libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: a.port().to_be(),
                    sin_addr: libc::in_addr {
                        s_addr: u32::from_ne_bytes(a.ip().octets()),
                    },
                    sin_zero: [0; 8],
                };
                // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
                unsafe { ptr::write(ptr::addr_of_mut!(storage).cast(), sin) };
            }
            SocketAddr::V6(a) => {
                let sin6 = libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: a.port().to_be(),
                    sin6_flowinfo: a.flowinfo().to_be(),
                    sin6_addr: libc::in6_addr {
                        s6_addr: a.ip().octets(),
                    },
                    sin6_scope_id: a.scope_id(),
                };
                // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
                unsafe { ptr::write(ptr::addr_of_mut!(storage).cast(), sin6) };
            }
        }
        RawSockAddr { storage }
    }

    pub(super) fn as_mut_ptr(&mut self) -> *mut ffi::sockaddr {
        ptr::addr_of_mut!(self.storage).cast()
    }
}

/// Reads an IPv4 or IPv6 socket address.
///
/// # Safety
///
/// `sa` points to at least `size_of::<sockaddr_storage>()` readable bytes, or is NULL.
pub(super) unsafe fn read_sockaddr(sa: *const c_void) -> Option<SocketAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: the caller guarantees a readable sockaddr_storage-sized buffer; an unaligned
    // read avoids assuming the C side's alignment.
    let storage: libc::sockaddr_storage = unsafe { ptr::read_unaligned(sa.cast()) };
    match c_int::from(storage.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin: libc::sockaddr_in =
                unsafe { ptr::read_unaligned(ptr::addr_of!(storage).cast()) };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6: libc::sockaddr_in6 =
                unsafe { ptr::read_unaligned(ptr::addr_of!(storage).cast()) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                u32::from_be(sin6.sin6_flowinfo),
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}
