//! Shared by stride's integration tests: the CUDA driver test double (`fake_libcuda.c`),
//! compiled on demand; running a scenario in a child process (the CUDA loader is
//! process-global, so each driver setup needs a fresh process); and the RDMA device gate.

#![allow(dead_code)] // each test binary uses its own subset

use std::ffi::{c_int, CString, OsStr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use sideway::device::DeviceContext;

/// The test double's source, compiled into the test binary so that the library built from
/// it is named after exactly this text.
const FAKE_SOURCE: &str = include_str!("fake_libcuda.c");

/// Which build of the test double.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fake {
    /// Every entry point, dma-buf export included.
    Full,
    /// Without `cuMemGetHandleForAddressRange`, like a driver older than CUDA 11.7.
    NoDmaBufExport,
}

impl Fake {
    fn flags(self) -> &'static [&'static str] {
        match self {
            Fake::Full => &[],
            Fake::NoDmaBufExport => &["-DFAKE_CUDA_NO_DMABUF_EXPORT"],
        }
    }
}

/// FNV-1a: a stable name for a build, so that a changed source is never mistaken for an old
/// build of it.
fn fnv1a(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in part.as_bytes().iter().chain(&[0u8]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// The test double as a `libcuda.so.1`, built with the C compiler (`$CC`, else `cc`) into
/// cargo's temporary directory for tests. A build of this exact source is reused: so the
/// device run, where no compiler is installed, uses what the host's run built. When the
/// compiler is missing or fails and no build exists, this panics with the compiler's words.
pub(crate) fn fake_libcuda(variant: Fake) -> PathBuf {
    let flags = variant.flags();
    let mut key_parts = vec![FAKE_SOURCE];
    key_parts.extend_from_slice(flags);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("fake-libcuda-{:016x}", fnv1a(&key_parts)));
    let lib = dir.join("libcuda.so.1");
    if lib.exists() {
        return lib;
    }
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    // Written and built under names of this build's own (tests of one process build on
    // several threads at once), then renamed: no test compiles half a source or loads half
    // a library, and the last of several identical builds wins.
    static BUILDS: AtomicU32 = AtomicU32::new(0);
    let unique = format!(
        "{}.{}",
        std::process::id(),
        BUILDS.fetch_add(1, Ordering::Relaxed)
    );
    let source = dir.join(format!("fake_libcuda.{unique}.c"));
    std::fs::write(&source, FAKE_SOURCE)
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", source.display()));
    let partial = dir.join(format!("libcuda.so.1.{unique}.partial"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let out = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-pthread"])
        .args(flags)
        .arg("-o")
        .arg(&partial)
        .arg(&source)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run the C compiler `{cc}` ({e}) to build the CUDA test double {}: \
                 install gcc (or set CC)",
                source.display()
            )
        });
    assert!(
        out.status.success(),
        "`{cc}` failed to build the CUDA test double {} ({}):\n{}{}",
        source.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::rename(&partial, &lib).unwrap_or_else(|e| {
        panic!(
            "cannot rename {} to {}: {e}",
            partial.display(),
            lib.display()
        )
    });
    // Only this build used it; a leftover would be harmless.
    let _ = std::fs::remove_file(&source);
    lib
}

/// The variable that tells a child process which test it runs.
const CHILD: &str = "STRIDE_TEST_CHILD";

/// The driver variables a child starts without, unless `envs` sets them.
const DRIVER_VARS: &[&str] = &[
    "STRIDE_LIBCUDA",
    "FAKE_CUDA_GPUS",
    "FAKE_CUDA_DMABUF",
    "FAKE_CUDA_COPY_LOG",
];

/// Runs `body` in a fresh process of this test binary with `envs` set (and the driver
/// variables cleared otherwise). `test` must be the test function's name. In the child,
/// runs `body` itself.
pub(crate) fn in_child(test: &str, envs: &[(&str, &OsStr)], body: impl FnOnce()) {
    if std::env::var(CHILD).as_deref() == Ok(test) {
        body();
        return;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut cmd = Command::new(exe);
    cmd.args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, test);
    for var in DRIVER_VARS {
        cmd.env_remove(var);
    }
    for (name, value) in envs {
        cmd.env(name, value);
    }
    let out = cmd.output().expect("running the test binary again");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    print!("{stdout}");
    eprint!("{stderr}");
    assert!(
        out.status.success(),
        "{test} failed in its child process ({})",
        out.status
    );
    assert!(
        stdout.contains("1 passed"),
        "the child process ran no test named {test}"
    );
}

/// The test double's own counters (not part of the CUDA API), read from the loaded copy.
pub(crate) struct FakeCounters {
    handle: *mut std::ffi::c_void,
}

impl FakeCounters {
    /// Opens the already loaded test double at `path` (the same copy the loader uses).
    pub(crate) fn open(path: &Path) -> Self {
        let c_path = CString::new(path.as_os_str().as_encoded_bytes()).expect("a path");
        // SAFETY: c_path is NUL-terminated; the library is the test double, already loaded,
        // so this only takes another reference to it.
        let handle = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!handle.is_null(), "dlopen of {} failed", path.display());
        FakeCounters { handle }
    }

    fn call(&self, name: &str, arg: Option<u64>) -> c_int {
        let c_name = CString::new(name).expect("a name");
        // SAFETY: handle is open; c_name is NUL-terminated.
        let p = unsafe { libc::dlsym(self.handle, c_name.as_ptr()) };
        assert!(!p.is_null(), "the test double has no {name}");
        match arg {
            None => {
                // SAFETY: the double defines `int name(void)`.
                let f = unsafe {
                    std::mem::transmute::<*mut libc::c_void, extern "C" fn() -> c_int>(p)
                };
                f()
            }
            Some(a) => {
                // SAFETY: the double defines `int name(unsigned long long)`.
                let f = unsafe {
                    std::mem::transmute::<*mut libc::c_void, extern "C" fn(u64) -> c_int>(p)
                };
                f(a)
            }
        }
    }

    /// Allocations not yet freed.
    pub(crate) fn live_allocations(&self) -> i32 {
        self.call("fake_cuda_live_allocations", None)
    }

    /// Primary context retains not yet released, over all GPUs.
    pub(crate) fn context_refs(&self) -> i32 {
        self.call("fake_cuda_context_refs", None)
    }

    /// The successful copies so far: `[DtoH calls, DtoH bytes, HtoD calls, HtoD bytes]`.
    pub(crate) fn copies(&self) -> [u64; 4] {
        let c_name = CString::new("fake_cuda_copies").expect("a name");
        // SAFETY: handle is open; c_name is NUL-terminated.
        let p = unsafe { libc::dlsym(self.handle, c_name.as_ptr()) };
        assert!(!p.is_null(), "the test double has no fake_cuda_copies");
        // SAFETY: the double defines `unsigned long long fake_cuda_copies(int)`.
        let f = unsafe { std::mem::transmute::<*mut libc::c_void, extern "C" fn(c_int) -> u64>(p) };
        [f(0), f(1), f(2), f(3)]
    }

    /// 1 when the allocation holding `ptr` is marked SYNC_MEMOPS, 0 when not, -1 when none.
    pub(crate) fn sync_memops(&self, ptr: u64) -> i32 {
        self.call("fake_cuda_sync_memops", Some(ptr))
    }
}

/// The RDMA device to test on, or `None` (after printing why) when the test must be skipped
/// (sideway's device-test convention, `sideway::testing`).
pub(crate) fn device_or_skip(test: &str) -> Option<Arc<DeviceContext>> {
    match sideway::testing::test_device(test).unwrap_or_else(|e| panic!("{e}")) {
        sideway::testing::TestDevice::Ready(ctx) => Some(ctx),
        sideway::testing::TestDevice::Skip(skip) => {
            println!("{skip}");
            None
        }
    }
}
