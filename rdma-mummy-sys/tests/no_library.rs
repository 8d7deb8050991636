//! Behaviour when rdma-core cannot be loaded.
//!
//! A process loads each library at most once, so the checks run in a child: the parent test
//! re-runs this test binary, selecting only the ignored `child_*` test, with
//! `RDMA_MUMMY_LIBIBVERBS`, `RDMA_MUMMY_LIBRDMACM` and `RDMA_MUMMY_LIBMLX5` pointing at files
//! that do not exist.

use std::env;
use std::ffi::CStr;
use std::io;
use std::process::Command;
use std::ptr;

use rdma_mummy_sys::{Library, EOPNOTSUPP};

const CHILD_MARKER: &str = "RDMA_MUMMY_SYS_TEST_CHILD";
const MISSING_IBVERBS: &str = "/nonexistent/libibverbs.so.1";
const MISSING_RDMACM: &str = "/nonexistent/librdmacm.so.1";
const MISSING_MLX5: &str = "/nonexistent/libmlx5.so.1";

fn last_errno() -> Option<i32> {
    io::Error::last_os_error().raw_os_error()
}

#[test]
fn missing_libraries_fail_cleanly_in_a_child_process() {
    let exe = env::current_exe().expect("the test binary knows its path");
    let output = Command::new(exe)
        .args([
            "--ignored",
            "--exact",
            "child_without_libraries",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_MARKER, "1")
        .env("RDMA_MUMMY_LIBIBVERBS", MISSING_IBVERBS)
        .env("RDMA_MUMMY_LIBRDMACM", MISSING_RDMACM)
        .env("RDMA_MUMMY_LIBMLX5", MISSING_MLX5)
        .output()
        .expect("the test binary can be re-run");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "child failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    // Proves the child really ran the checks rather than matching no test.
    assert!(
        stdout.contains("child checks passed"),
        "child did not run its checks:\n{stdout}\n{stderr}"
    );
}

#[test]
#[ignore = "run by missing_libraries_fail_cleanly_in_a_child_process with the libraries hidden"]
fn child_without_libraries() {
    assert_eq!(
        env::var(CHILD_MARKER).as_deref(),
        Ok("1"),
        "run only as the child of missing_libraries_fail_cleanly_in_a_child_process"
    );

    // The typed error names the library, the path tried and dlerror()'s reason.
    let err = rdma_mummy_sys::ensure_loaded().expect_err("libibverbs must not load");
    assert_eq!(err.library(), Library::Ibverbs);
    assert_eq!(err.path(), MISSING_IBVERBS);
    assert!(
        err.dlerror().contains(MISSING_IBVERBS) && err.dlerror().contains("No such file"),
        "dlerror text missing: {:?}",
        err.dlerror()
    );
    let text = err.to_string();
    assert!(text.contains("libibverbs") && text.contains("apt install libibverbs1 librdmacm1"));
    let err = Library::Rdmacm.load().expect_err("librdmacm must not load");
    assert_eq!(err.path(), MISSING_RDMACM);
    assert!(!Library::Ibverbs.has_symbol(c"ibv_get_device_list"));

    // SAFETY: each call gets valid arguments (or NULL where the verb allows it); with the
    // libraries missing the shim returns before using any of them.
    unsafe {
        let mut num = -1;
        let list = rdma_mummy_sys::ibv_get_device_list(&mut num);
        assert!(list.is_null(), "ibv_get_device_list returned a list");
        assert_eq!(last_errno(), Some(EOPNOTSUPP as i32));

        // An errno-returning verb returns the errno value itself.
        let rc = rdma_mummy_sys::ffi::ibv_fork_init();
        assert_eq!(rc, EOPNOTSUPP as i32);

        // A -1 verb.
        let rc = rdma_mummy_sys::ibv_close_device(ptr::null_mut());
        assert_eq!(rc, -1);
        assert_eq!(last_errno(), Some(EOPNOTSUPP as i32));

        // String helpers stay printable.
        let status = rdma_mummy_sys::ibv_wc_status_str(0);
        assert!(!status.is_null());
        assert!(!CStr::from_ptr(status).to_bytes().is_empty());

        // A void verb returns without touching its argument.
        rdma_mummy_sys::ibv_free_device_list(ptr::null_mut());

        // librdmacm's side.
        let channel = rdma_mummy_sys::rdma_create_event_channel();
        assert!(channel.is_null());
        assert_eq!(last_errno(), Some(EOPNOTSUPP as i32));

        // rsocket, socket-style: -1 and errno.
        let fd = rdma_mummy_sys::rsocket(2, 1, 0);
        assert_eq!(fd, -1);
        assert_eq!(last_errno(), Some(EOPNOTSUPP as i32));
        // The variadic one, with and without its argument.
        assert_eq!(rdma_mummy_sys::rfcntl(3, 4, 0o4000), -1); // F_SETFL, O_NONBLOCK
        assert_eq!(last_errno(), Some(EOPNOTSUPP as i32));
        assert_eq!(rdma_mummy_sys::rfcntl(3, 3), -1); // F_GETFL
        assert_eq!(last_errno(), Some(EOPNOTSUPP as i32));
        // size_t riowrite: -1 converted, as rsocket itself reports a failure.
        assert_eq!(
            rdma_mummy_sys::riowrite(3, ptr::null(), 0, 0, 0),
            usize::MAX as _
        );
        assert_eq!(last_errno(), Some(EOPNOTSUPP as i32));

        // An export only rdma-core's internal headers declare.
        assert_eq!(rdma_mummy_sys::ibv_dontfork_range(ptr::null_mut(), 0), -1);
        assert_eq!(last_errno(), Some(EOPNOTSUPP as i32));
        assert!(rdma_mummy_sys::ibv_get_sysfs_path().is_null());

        // libmlx5: no device is an mlx5 one, an errno-returning mlx5dv call returns the
        // errno value, a pointer-returning one NULL.
        assert!(!rdma_mummy_sys::mlx5dv_is_supported(ptr::null_mut()));
        let mut attrs = rdma_mummy_sys::mlx5dv_context::default();
        assert_eq!(
            rdma_mummy_sys::mlx5dv_query_device(ptr::null_mut(), &mut attrs),
            EOPNOTSUPP as i32
        );
        let qp =
            rdma_mummy_sys::mlx5dv_create_qp(ptr::null_mut(), ptr::null_mut(), ptr::null_mut());
        assert!(qp.is_null());
        assert_eq!(last_errno(), Some(EOPNOTSUPP as i32));
        assert!(rdma_mummy_sys::mlx5dv_qp_ex_from_ibv_qp_ex(ptr::null_mut()).is_null());
    }
    let err = Library::Mlx5.load().expect_err("libmlx5 must not load");
    assert_eq!(err.path(), MISSING_MLX5);
    let text = err.to_string();
    assert!(
        text.contains("apt install ibverbs-providers") && text.contains("RDMA_MUMMY_LIBMLX5"),
        "{text}"
    );

    // Nothing in this process linked rdma-core at build time: had either library been a
    // DT_NEEDED dependency it would be mapped since start-up.
    let maps = std::fs::read_to_string("/proc/self/maps").expect("Linux has /proc/self/maps");
    for lib in ["libibverbs.so", "librdmacm.so", "libmlx5.so"] {
        assert!(!maps.contains(lib), "{lib} is mapped into the process");
    }
    println!("child checks passed");
}
