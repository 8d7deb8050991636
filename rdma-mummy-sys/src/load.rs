//! Whether the shim could load libibverbs, librdmacm and libmlx5, and why not.
//!
//! The C shim owns the loading: each library is `dlopen`ed once per process, on the first call
//! of one of its functions or of [`Library::load`]. This module turns the shim's record of that
//! attempt (the file name tried and the `dlerror()` text) into a [`LoadError`] that says what
//! to install. Higher layers call [`ensure_loaded`] (or [`Library::load`]) before their first
//! verb, so a missing library is one readable error instead of `EOPNOTSUPP` from every call.

use std::borrow::Cow;
use std::ffi::{c_char, CStr};
use std::fmt;

use crate::ffi;

/// One of the rdma-core libraries the shim loads at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[doc(alias = "rdma_mummy_library")]
pub enum Library {
    /// `libibverbs.so.1`: every `ibv_*` function.
    Ibverbs,
    /// `librdmacm.so.1`: every `rdma_*` function.
    Rdmacm,
    /// `libmlx5.so.1`: every `mlx5dv_*` function (mlx5's direct verbs, `infiniband/mlx5dv.h`).
    /// A provider library, shipped with the mlx5 provider (Debian/Ubuntu: `ibverbs-providers`):
    /// optional, and not loaded by [`ensure_loaded`]; without it `mlx5dv_is_supported` is
    /// false and the other `mlx5dv_*` functions fail with `EOPNOTSUPP`.
    Mlx5,
}

impl Library {
    /// The libraries every program needs, in the order [`ensure_loaded`] loads them.
    pub const ALL: [Library; 2] = [Library::Ibverbs, Library::Rdmacm];

    /// The providers' direct-verbs libraries: each is loaded only when its functions are used
    /// (or [`Library::load`] is called), and a program runs without them.
    pub const PROVIDERS: [Library; 1] = [Library::Mlx5];

    /// The file name the shim passes to `dlopen` unless [`Library::env_var`] overrides it.
    pub fn soname(self) -> &'static str {
        match self {
            Library::Ibverbs => "libibverbs.so.1",
            Library::Rdmacm => "librdmacm.so.1",
            Library::Mlx5 => "libmlx5.so.1",
        }
    }

    /// The environment variable that replaces [`Library::soname`] (read once, at load time).
    pub fn env_var(self) -> &'static str {
        match self {
            Library::Ibverbs => "RDMA_MUMMY_LIBIBVERBS",
            Library::Rdmacm => "RDMA_MUMMY_LIBRDMACM",
            Library::Mlx5 => "RDMA_MUMMY_LIBMLX5",
        }
    }

    /// A function every version of the library exports: a file that loads but lacks it is
    /// some other library (a wrong [`Library::env_var`]).
    pub fn marker(self) -> &'static CStr {
        match self {
            Library::Ibverbs => c"ibv_get_device_list",
            Library::Rdmacm => c"rdma_create_event_channel",
            Library::Mlx5 => c"mlx5dv_query_device",
        }
    }

    fn raw(self) -> ffi::rdma_mummy_library::Type {
        match self {
            Library::Ibverbs => ffi::rdma_mummy_library::RDMA_MUMMY_LIB_IBVERBS,
            Library::Rdmacm => ffi::rdma_mummy_library::RDMA_MUMMY_LIB_RDMACM,
            Library::Mlx5 => ffi::rdma_mummy_library::RDMA_MUMMY_LIB_MLX5,
        }
    }

    /// Loads the library if no call has yet, and reports the outcome (`rdma_mummy_load`).
    /// A file that loads but lacks the library's [`Library::marker`] is an error too: every
    /// verb would fail with `EOPNOTSUPP`, and the error says the file is the wrong one.
    ///
    /// The outcome is fixed for the life of the process: a failed load is not retried.
    #[doc(alias = "rdma_mummy_load")]
    #[doc(alias = "rdma_mummy_load_error")]
    pub fn load(self) -> Result<(), LoadError> {
        // SAFETY: rdma_mummy_load takes a library number, which raw() makes valid, and
        // synchronises with concurrent first uses through pthread_once.
        if unsafe { ffi::rdma_mummy_load(self.raw()) } == 0 {
            if self.has_symbol(self.marker()) {
                return Ok(());
            }
            // SAFETY: as below: NULL or a string the shim keeps for the life of the process.
            let path = unsafe { owned(ffi::rdma_mummy_load_path(self.raw())) };
            return Err(LoadError {
                library: self,
                path: path.unwrap_or_else(|| self.soname().to_owned()),
                message: format!(
                    "it loaded, but it has no {}",
                    self.marker().to_string_lossy()
                ),
                wrong_library: true,
            });
        }
        // SAFETY: both return NULL or a NUL-terminated string the shim never frees or
        // changes after loading, which the call above completed.
        let (path, message) = unsafe {
            (
                ffi::rdma_mummy_load_path(self.raw()),
                ffi::rdma_mummy_load_error(self.raw()),
            )
        };
        Err(LoadError {
            library: self,
            // SAFETY: as above, each pointer is NULL or a string that lives forever.
            path: unsafe { owned(path) }.unwrap_or_else(|| self.soname().to_owned()),
            // SAFETY: as above.
            message: unsafe { owned(message) }
                .unwrap_or_else(|| "no reason recorded by the loader".to_owned()),
            wrong_library: false,
        })
    }

    /// Whether the loaded library exports `name` (`rdma_mummy_has_symbol`); `false` when the
    /// library did not load. Tells an older rdma-core that lacks a verb from a verb that fails.
    #[doc(alias = "rdma_mummy_has_symbol")]
    pub fn has_symbol(self, name: &CStr) -> bool {
        // SAFETY: name is a valid NUL-terminated string for the duration of the call, and the
        // shim only passes it to dlsym.
        unsafe { ffi::rdma_mummy_has_symbol(self.raw(), name.as_ptr()) != 0 }
    }
}

impl Library {
    /// The Debian/Ubuntu package that ships the library.
    fn debian_package(self) -> &'static str {
        match self {
            Library::Ibverbs => "libibverbs1",
            Library::Rdmacm => "librdmacm1",
            Library::Mlx5 => "ibverbs-providers",
        }
    }
}

impl fmt::Display for Library {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Library::Ibverbs => "libibverbs",
            Library::Rdmacm => "librdmacm",
            Library::Mlx5 => "libmlx5",
        })
    }
}

/// Copies a C string the shim keeps for the life of the process.
///
/// # Safety
///
/// `p` is NULL or points to a NUL-terminated string that stays valid during the call.
unsafe fn owned(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-NULL, and the caller guarantees a NUL-terminated string.
    let text: Cow<'_, str> = unsafe { CStr::from_ptr(p) }.to_string_lossy();
    Some(text.into_owned())
}

/// A library of rdma-core could not be loaded.
///
/// Every verb of that library fails with `EOPNOTSUPP` in this process; this error says why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    library: Library,
    path: String,
    message: String,
    /// The file loaded but is not this library (it lacks [`Library::marker`]).
    wrong_library: bool,
}

impl LoadError {
    /// The library that failed to load.
    pub fn library(&self) -> Library {
        self.library
    }

    /// The file name given to `dlopen` (the soname, or the environment override).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The dynamic loader's reason, as `dlerror()` reported it; for a file that loaded but
    /// is not the library ([`LoadError::is_wrong_library`]), which function it lacks.
    pub fn dlerror(&self) -> &str {
        &self.message
    }

    /// Whether the file loaded but is some other library than this one (most often a
    /// [`Library::env_var`] naming the wrong file).
    pub fn is_wrong_library(&self) -> bool {
        self.wrong_library
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lib = self.library;
        if self.wrong_library {
            let marker = lib.marker().to_string_lossy();
            return if self.path == lib.soname() {
                write!(
                    f,
                    "{} loaded, but it has no {marker}: it is not {lib}; reinstall \
                     rdma-core's {lib} (Debian/Ubuntu: `apt install --reinstall {}`) or set \
                     {} to the real library's path",
                    self.path,
                    lib.debian_package(),
                    lib.env_var()
                )
            } else {
                write!(
                    f,
                    "{}={} loaded, but it has no {marker}: it is not {lib}; unset it or point \
                     it at {}",
                    lib.env_var(),
                    self.path,
                    lib.soname()
                )
            };
        }
        let install = match lib {
            Library::Ibverbs | Library::Rdmacm => {
                "install rdma-core's libraries (Debian/Ubuntu: `apt install libibverbs1 \
                 librdmacm1`, RHEL/Fedora: `dnf install libibverbs librdmacm`)"
            }
            Library::Mlx5 => {
                "install rdma-core's mlx5 provider (Debian/Ubuntu: `apt install \
                 ibverbs-providers`, RHEL/Fedora: `dnf install libibverbs`)"
            }
        };
        write!(
            f,
            "cannot load {} from `{}`: {}; {install} or set {} to the library's path",
            self.library,
            self.path,
            self.message,
            self.library.env_var()
        )
    }
}

impl std::error::Error for LoadError {}

/// Loads libibverbs and librdmacm (once per process) and reports the first that failed.
///
/// Call it before the first verb: afterwards every bound function forwards to the loaded
/// library. Loading is thread-safe and happens at most once per library.
#[doc(alias = "rdma_mummy_load")]
pub fn ensure_loaded() -> Result<(), LoadError> {
    Library::ALL.into_iter().try_for_each(Library::load)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_library_path_reason_and_remedy() {
        let err = LoadError {
            library: Library::Rdmacm,
            path: "/opt/x/librdmacm.so.1".to_owned(),
            message: "file not found".to_owned(),
            wrong_library: false,
        };
        let text = err.to_string();
        for needle in [
            "librdmacm",
            "/opt/x/librdmacm.so.1",
            "file not found",
            "apt install libibverbs1 librdmacm1",
            "RDMA_MUMMY_LIBRDMACM",
        ] {
            assert!(text.contains(needle), "{needle:?} missing from {text:?}");
        }
    }

    #[test]
    fn a_wrong_library_is_named_as_such() {
        let err = LoadError {
            library: Library::Ibverbs,
            path: "libc.so.6".to_owned(),
            message: "it loaded, but it has no ibv_get_device_list".to_owned(),
            wrong_library: true,
        };
        assert_eq!(
            err.to_string(),
            "RDMA_MUMMY_LIBIBVERBS=libc.so.6 loaded, but it has no ibv_get_device_list: it is \
             not libibverbs; unset it or point it at libibverbs.so.1"
        );
        let err = LoadError {
            path: "librdmacm.so.1".to_owned(),
            library: Library::Rdmacm,
            ..err
        };
        let text = err.to_string();
        assert!(
            text.starts_with("librdmacm.so.1 loaded, but it has no rdma_create_event_channel"),
            "{text}"
        );
        assert!(
            text.contains("apt install --reinstall librdmacm1"),
            "{text}"
        );
    }

    #[test]
    fn a_missing_provider_library_names_its_package() {
        let err = LoadError {
            library: Library::Mlx5,
            path: "libmlx5.so.1".to_owned(),
            message: "libmlx5.so.1: cannot open shared object file".to_owned(),
            wrong_library: false,
        };
        let text = err.to_string();
        for needle in [
            "libmlx5",
            "apt install ibverbs-providers",
            "RDMA_MUMMY_LIBMLX5",
        ] {
            assert!(text.contains(needle), "{needle:?} missing from {text:?}");
        }
        assert!(!text.contains("librdmacm1"), "{text}");
    }

    #[test]
    fn library_names_match_the_shim() {
        assert_eq!(Library::Mlx5.soname(), "libmlx5.so.1");
        assert_eq!(
            Library::Mlx5.raw(),
            ffi::rdma_mummy_library::RDMA_MUMMY_LIB_MLX5
        );
        assert_eq!(Library::Ibverbs.soname(), "libibverbs.so.1");
        assert_eq!(Library::Rdmacm.env_var(), "RDMA_MUMMY_LIBRDMACM");
        assert_eq!(
            Library::Rdmacm.raw(),
            ffi::rdma_mummy_library::RDMA_MUMMY_LIB_RDMACM
        );
    }
}
