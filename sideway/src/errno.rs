//! The one place where C return conventions become Rust results.
//!
//! libibverbs reports failure three ways: a NULL pointer with `errno` set, `-1` with `errno`
//! set, or the error number itself as the return value (most verbs that take attributes,
//! `ibv_modify_qp`, `ibv_query_port`, ...). Some providers also return a negative error
//! number. Every call site goes through one of these helpers, so none builds an OS error by
//! hand and none can mix the conventions up.

use std::io;
use std::os::raw::c_int;
use std::ptr::NonNull;

/// A NULL-on-failure pointer: `Ok` when non-NULL, else the `errno` the call left.
pub(crate) fn non_null<T>(ptr: *mut T) -> Result<NonNull<T>, io::Error> {
    NonNull::new(ptr).ok_or_else(errno_or_unknown)
}

/// A verb that returns 0 or an error number (positive, or negative from some providers),
/// or -1 with `errno` set. Inlined: the data path calls it once per post.
#[inline]
pub(crate) fn from_ret(ret: c_int) -> Result<(), io::Error> {
    match ret {
        0 => Ok(()),
        -1 => Err(errno_or_unknown()),
        n => Err(io::Error::from_raw_os_error(n.saturating_abs())),
    }
}

/// The current `errno`; a zero `errno` (a provider that failed without setting it) becomes
/// EIO rather than the misleading "Success".
#[cold]
fn errno_or_unknown() -> io::Error {
    match io::Error::last_os_error().raw_os_error() {
        Some(0) | None => io::Error::from_raw_os_error(libc_eio()),
        Some(n) => io::Error::from_raw_os_error(n),
    }
}

const fn libc_eio() -> i32 {
    5 // EIO on every Linux architecture
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn return_conventions() {
        assert!(from_ret(0).is_ok());
        assert_eq!(from_ret(22).unwrap_err().raw_os_error(), Some(22));
        assert_eq!(from_ret(-95).unwrap_err().raw_os_error(), Some(95));
        assert!(from_ret(-1).is_err());
        let mut x = 5u8;
        assert!(non_null(&mut x as *mut u8).is_ok());
        assert!(non_null(std::ptr::null_mut::<u8>()).is_err());
    }
}
