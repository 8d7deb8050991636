//! The one place where C return conventions become Rust results.
//!
//! The verbs report failure four ways, and providers mix them:
//!
//! | convention | verbs |
//! | --- | --- |
//! | NULL, `errno` set | `ibv_alloc_pd`, `ibv_reg_mr`, `ibv_create_cq`, `ibv_create_qp`, ... |
//! | `-1`, `errno` set | `ibv_get_cq_event`, `ibv_dealloc_mw`, every `rdma_*` call, ... |
//! | the error number itself, positive | `ibv_modify_qp`, `ibv_query_port`, `ibv_post_send`, ... |
//! | the error number negated | some providers' posts and destroys (rxe's, for one) |
//!
//! `-1` is ambiguous: it is both "see `errno`" and `-EPERM`. It is told apart by clearing
//! `errno` before the call: a `-1` that leaves `errno` at 0 is `-EPERM`. So a control-path
//! call goes through [`fresh`], which clears `errno` and makes the call, and whose result
//! ([`Fresh`]) is the only thing [`from_ret`] and [`non_null`] accept: a call site cannot
//! forget the clearing. A NULL (or `-1`) that leaves `errno` at 0 is a provider that failed
//! without saying why; it reads as `EIO` rather than the misleading "Success".
//!
//! The data path (posts, `ibv_wr_complete`) does not clear `errno`: that is a call into libc
//! per post, and those verbs return the error number itself. [`from_post_ret`] reads their
//! result, cold on failure; there a `-1` is read from `errno` when it is set.

use std::io;
use std::os::raw::c_int;
use std::ptr::NonNull;

/// The result of a call made by [`fresh`]: `errno` was cleared just before it.
#[derive(Debug, Clone, Copy)]
#[must_use = "a verb's result must be checked"]
pub(crate) struct Fresh<T>(T);

/// Clears `errno`, then makes `call`: the one way a control-path verb is called.
#[inline]
pub(crate) fn fresh<T>(call: impl FnOnce() -> T) -> Fresh<T> {
    set_errno(0);
    Fresh(call())
}

/// A NULL-on-failure pointer: `Ok` when non-NULL, else the `errno` the call left.
pub(crate) fn non_null<T>(ptr: Fresh<*mut T>) -> Result<NonNull<T>, io::Error> {
    NonNull::new(ptr.0).ok_or_else(|| errno_or(EIO))
}

/// An out-parameter that a successful call should have set, found NULL: the provider failed
/// without saying why, `EIO`.
pub(crate) fn out_ptr<T>(ptr: *mut T) -> Result<NonNull<T>, io::Error> {
    NonNull::new(ptr).ok_or_else(|| io::Error::from_raw_os_error(EIO))
}

/// A verb that returns 0 (or, for some, a non-negative count) on success, and on failure
/// `-1` with `errno` set, a positive error number, or a negative one.
pub(crate) fn from_ret(ret: Fresh<c_int>) -> Result<(), io::Error> {
    classify(ret.0, EPERM)
}

/// As [`from_ret`], for verbs whose non-negative results are counts (`ibv_query_gid_table`
/// returns an `ssize_t`): the count on success.
pub(crate) fn count_from_ret<T>(ret: Fresh<T>) -> Result<usize, io::Error>
where
    T: TryInto<c_int> + TryInto<usize> + Copy + PartialOrd + Default,
{
    let n = ret.0;
    if n >= T::default() {
        // A count too large for usize cannot come from a verb; read it as EIO.
        return TryInto::<usize>::try_into(n).map_err(|_| io::Error::from_raw_os_error(EIO));
    }
    // A negative result: -1 (see errno) or a negated error number; anything below c_int's
    // range is no error number at all.
    Err(negative(
        TryInto::<c_int>::try_into(n).unwrap_or(-EIO),
        EPERM,
    ))
}

/// A data-path verb's result (`ibv_post_send`, `ibv_post_recv`, `ibv_post_srq_recv`,
/// `ibv_wr_complete`, `ibv_poll_cq` errors): 0, or an error number, positive or negative.
/// `errno` was not cleared before the call (see the module's docs), so a `-1` is read from
/// `errno` when it is set, and as `EPERM` otherwise.
///
/// A plain inlined match: a version that moved the failure into an `#[inline(never)]`
/// function made the whole posting loop of the null-provider benchmarks about 2 ns per
/// request slower (docs/benchmarks.md).
#[inline]
pub(crate) fn from_post_ret(ret: c_int) -> Result<(), io::Error> {
    match ret {
        0 => Ok(()),
        -1 => Err(errno_or(EPERM)),
        // c_int::MIN saturates to c_int::MAX rather than overflowing.
        n => Err(io::Error::from_raw_os_error(n.saturating_abs())),
    }
}

/// The whole rule, in one place. `minus_one` is what a `-1` means when `errno` is 0.
fn classify(ret: c_int, minus_one: i32) -> Result<(), io::Error> {
    match ret {
        0 => Ok(()),
        n if n > 0 => Err(io::Error::from_raw_os_error(n)),
        n => Err(negative(n, minus_one)),
    }
}

#[cold]
fn negative(n: c_int, minus_one: i32) -> io::Error {
    if n == -1 {
        errno_or(minus_one)
    } else {
        // n < -1, so its negation is a positive error number (c_int::MIN saturates).
        io::Error::from_raw_os_error(n.checked_neg().unwrap_or(c_int::MAX))
    }
}

/// The current `errno`, or `otherwise` when it is 0.
#[cold]
fn errno_or(otherwise: i32) -> io::Error {
    match io::Error::last_os_error().raw_os_error() {
        Some(0) | None => io::Error::from_raw_os_error(otherwise),
        Some(n) => io::Error::from_raw_os_error(n),
    }
}

fn set_errno(value: c_int) {
    // SAFETY: __errno_location returns this thread's errno, valid for the thread's life.
    unsafe { *libc::__errno_location() = value };
}

const EIO: i32 = libc::EIO;
const EPERM: i32 = libc::EPERM;

#[cfg(test)]
mod tests {
    use super::*;

    fn failing_with(ret: c_int, errno: c_int) -> Fresh<c_int> {
        fresh(|| {
            set_errno(errno);
            ret
        })
    }

    #[test]
    fn every_convention_reads_right() {
        assert!(from_ret(fresh(|| 0)).is_ok());
        // A positive error number (ibv_modify_qp, ibv_query_port).
        assert_eq!(from_ret(fresh(|| 22)).unwrap_err().raw_os_error(), Some(22));
        // A negated one (some providers).
        assert_eq!(
            from_ret(fresh(|| -95)).unwrap_err().raw_os_error(),
            Some(95)
        );
        // -1 with errno set.
        let e = from_ret(failing_with(-1, libc::ENOMEM)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOMEM));
        // NULL with errno set, and NULL without.
        let e = non_null(fresh(|| {
            set_errno(libc::ENODEV);
            std::ptr::null_mut::<u8>()
        }))
        .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENODEV));
        let e = non_null(fresh(std::ptr::null_mut::<u8>)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO), "not \"Success\"");
        let mut x = 5u8;
        assert!(non_null(fresh(|| &mut x as *mut u8)).is_ok());
        assert_eq!(count_from_ret(fresh(|| 7isize)).unwrap(), 7);
        assert_eq!(
            count_from_ret(fresh(|| -12isize))
                .unwrap_err()
                .raw_os_error(),
            Some(12)
        );
        assert_eq!(
            count_from_ret(fresh(|| isize::MIN))
                .unwrap_err()
                .raw_os_error(),
            Some(libc::EIO)
        );
        assert_eq!(
            from_ret(fresh(|| c_int::MIN)).unwrap_err().raw_os_error(),
            Some(c_int::MAX)
        );
    }

    /// The ambiguity the clearing resolves: a stale errno from an earlier call must not be
    /// blamed for a provider's -EPERM.
    #[test]
    fn a_stale_errno_is_not_read_as_the_cause_of_minus_eperm() {
        set_errno(libc::ENOENT); // left by some earlier, unrelated call
        let e = from_ret(fresh(|| -libc::EPERM)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}");
        // A -1 that did set errno still reads as errno.
        let e = from_ret(failing_with(-1, libc::EBUSY)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EBUSY));
    }

    #[test]
    fn posts_read_every_convention_without_clearing() {
        assert!(from_post_ret(0).is_ok());
        assert_eq!(from_post_ret(12).unwrap_err().raw_os_error(), Some(12));
        assert_eq!(from_post_ret(-22).unwrap_err().raw_os_error(), Some(22));
        set_errno(0);
        assert_eq!(
            from_post_ret(-1).unwrap_err().raw_os_error(),
            Some(libc::EPERM)
        );
        set_errno(libc::ENOMEM);
        assert_eq!(
            from_post_ret(-1).unwrap_err().raw_os_error(),
            Some(libc::ENOMEM)
        );
    }
}
