//! Socket addresses between C (`sockaddr_in`, `sockaddr_in6`) and Rust (`SocketAddr`).

use std::ffi::c_int;
use std::mem::size_of;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use libc::{sa_family_t, sockaddr, sockaddr_in, sockaddr_in6, sockaddr_storage, socklen_t};

/// The address a C caller passed, if it is an IPv4 or IPv6 one of the right length.
///
/// # Safety
///
/// `addr` points to `len` readable bytes (or is null).
pub(crate) unsafe fn read(addr: *const sockaddr, len: socklen_t) -> Option<SocketAddr> {
    if addr.is_null() || (len as usize) < size_of::<sa_family_t>() {
        return None;
    }
    let mut storage: sockaddr_storage = unsafe_zeroed();
    let n = (len as usize).min(size_of::<sockaddr_storage>());
    // SAFETY: the caller promises `len` readable bytes at `addr`; `n` is at most that and at
    // most the size of `storage`.
    unsafe { std::ptr::copy_nonoverlapping(addr.cast::<u8>(), (&raw mut storage).cast(), n) };
    from_storage(&storage, n)
}

/// The address in `storage`, of which `n` bytes are meaningful.
pub(crate) fn from_storage(storage: &sockaddr_storage, n: usize) -> Option<SocketAddr> {
    match c_int::from(storage.ss_family) {
        libc::AF_INET if n >= size_of::<sockaddr_in>() => {
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in, and the
            // family says this is one.
            let sin = unsafe { &*(storage as *const sockaddr_storage).cast::<sockaddr_in>() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 if n >= size_of::<sockaddr_in6>() => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe { &*(storage as *const sockaddr_storage).cast::<sockaddr_in6>() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// `addr` as a C socket address of `family` (an IPv4 address in an `AF_INET6` socket's
/// answer is written v4-mapped, as the kernel does), and its length.
pub(crate) fn to_storage(addr: SocketAddr, family: c_int) -> (sockaddr_storage, socklen_t) {
    let mut storage: sockaddr_storage = unsafe_zeroed();
    let addr = match (addr, family) {
        (SocketAddr::V4(a), libc::AF_INET6) => {
            SocketAddr::V6(SocketAddrV6::new(a.ip().to_ipv6_mapped(), a.port(), 0, 0))
        }
        (SocketAddr::V6(a), libc::AF_INET) => match a.ip().to_ipv4_mapped() {
            Some(ip) => SocketAddr::V4(SocketAddrV4::new(ip, a.port())),
            None => SocketAddr::V6(a),
        },
        (a, _) => a,
    };
    match addr {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            let sin = unsafe { &mut *(&raw mut storage).cast::<sockaddr_in>() };
            sin.sin_family = libc::AF_INET as sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr.s_addr = u32::from(*a.ip()).to_be();
            (storage, size_of::<sockaddr_in>() as socklen_t)
        }
        SocketAddr::V6(a) => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe { &mut *(&raw mut storage).cast::<sockaddr_in6>() };
            sin6.sin6_family = libc::AF_INET6 as sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_addr.s6_addr = a.ip().octets();
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_scope_id = a.scope_id();
            (storage, size_of::<sockaddr_in6>() as socklen_t)
        }
    }
}

/// Writes `addr` for a caller of accept/getpeername/getsockname: at most `*len` bytes, and
/// the full length into `*len` (a shorter buffer gets a truncated address, as from the
/// kernel). Null pointers write nothing.
///
/// # Safety
///
/// `out` and `len` are null or valid, `out` for `*len` bytes.
pub(crate) unsafe fn write(
    addr: SocketAddr,
    family: c_int,
    out: *mut sockaddr,
    len: *mut socklen_t,
) {
    if out.is_null() || len.is_null() {
        return;
    }
    let (storage, full) = to_storage(addr, family);
    // SAFETY: `len` is valid (checked non-null, the caller's promise).
    let room = unsafe { *len } as usize;
    let n = room.min(full as usize);
    // SAFETY: `out` has `*len` writable bytes; `n` is at most that and at most `full`, which
    // is within `storage`.
    unsafe {
        std::ptr::copy_nonoverlapping((&raw const storage).cast::<u8>(), out.cast(), n);
        *len = full;
    }
}

/// The IPv4 address inside a v4-mapped IPv6 one (rdma_cm resolves those as IPv4).
pub(crate) fn unmap(addr: SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V6(a) => match a.ip().to_ipv4_mapped() {
            Some(ip) => SocketAddr::new(IpAddr::V4(ip), a.port()),
            None => addr,
        },
        a => a,
    }
}

/// Where to reach a listener bound to `local` from this host: its own address, or the
/// loopback of its family when it is bound to every address.
pub(crate) fn reach_locally(local: SocketAddr) -> SocketAddr {
    let ip = match unmap(local).ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, local.port())
}

fn unsafe_zeroed() -> sockaddr_storage {
    // SAFETY: sockaddr_storage is plain integers and arrays, for which zero is valid.
    unsafe { std::mem::zeroed() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(a: SocketAddr, family: c_int) -> SocketAddr {
        let (s, len) = to_storage(a, family);
        // SAFETY: `s` holds `len` bytes.
        unsafe { read((&raw const s).cast(), len) }.expect("an inet address")
    }

    #[test]
    fn v4_and_v6_survive_the_trip() {
        let v4: SocketAddr = "198.18.0.1:5201".parse().unwrap();
        assert_eq!(round_trip(v4, libc::AF_INET), v4);
        let v6: SocketAddr = "[fd00::1]:443".parse().unwrap();
        assert_eq!(round_trip(v6, libc::AF_INET6), v6);
    }

    #[test]
    fn a_v6_socket_sees_v4_mapped_and_rdma_cm_gets_v4() {
        let v4: SocketAddr = "198.18.0.1:7".parse().unwrap();
        let mapped = round_trip(v4, libc::AF_INET6);
        assert_eq!(
            mapped,
            "[::ffff:198.18.0.1]:7".parse::<SocketAddr>().unwrap()
        );
        assert_eq!(unmap(mapped), v4);
        // And an AF_INET socket is never handed an IPv6 answer for a mapped address.
        assert_eq!(round_trip(mapped, libc::AF_INET), v4);
    }

    #[test]
    fn short_or_foreign_addresses_are_not_read() {
        let (s, len) = to_storage("198.18.0.1:7".parse().unwrap(), libc::AF_INET);
        // SAFETY: `s` holds at least `len` bytes.
        assert!(unsafe { read((&raw const s).cast(), len - 1) }.is_none());
        // SAFETY: a null address is allowed (and read as none).
        assert!(unsafe { read(std::ptr::null(), len) }.is_none());
        let mut unix: sockaddr_storage = unsafe_zeroed();
        unix.ss_family = libc::AF_UNIX as sa_family_t;
        let n = size_of::<sockaddr_storage>() as socklen_t;
        // SAFETY: `unix` is a whole sockaddr_storage, `n` bytes.
        assert!(unsafe { read((&raw const unix).cast(), n) }.is_none());
    }

    #[test]
    fn a_short_buffer_gets_a_truncated_address_and_the_full_length() {
        let mut out = [0xffu8; 4];
        let mut len: socklen_t = 4;
        let a: SocketAddr = "198.18.0.1:258".parse().unwrap();
        // SAFETY: `out` has `len` bytes.
        unsafe { write(a, libc::AF_INET, out.as_mut_ptr().cast(), &mut len) };
        assert_eq!(len as usize, size_of::<sockaddr_in>());
        assert_eq!(
            out[2..4],
            [1, 2],
            "the port, big-endian, is within the first 4 bytes"
        );
    }

    #[test]
    fn listeners_on_every_address_are_reached_through_loopback() {
        assert_eq!(
            reach_locally("0.0.0.0:80".parse().unwrap()),
            "127.0.0.1:80".parse().unwrap()
        );
        assert_eq!(
            reach_locally("[::]:80".parse().unwrap()),
            "[::1]:80".parse().unwrap()
        );
        let own: SocketAddr = "198.18.0.1:80".parse().unwrap();
        assert_eq!(reach_locally(own), own);
    }
}
