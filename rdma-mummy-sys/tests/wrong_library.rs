//! Behaviour when `RDMA_MUMMY_LIBIBVERBS` and `RDMA_MUMMY_LIBRDMACM` name a library that
//! loads but is not rdma-core's (here the C library): the load fails with an error that says
//! so and how to fix it, instead of every verb failing with `EOPNOTSUPP`.
//!
//! A process loads each library at most once, so the checks run in a child: the parent test
//! re-runs this test binary, selecting only the ignored `child_*` test, with the variables set.

use std::env;
use std::process::Command;

use rdma_mummy_sys::Library;

const CHILD_MARKER: &str = "RDMA_MUMMY_SYS_TEST_CHILD";
const NOT_RDMA: &str = "libc.so.6";

#[test]
fn a_library_without_the_verbs_is_refused_in_a_child_process() {
    let exe = env::current_exe().expect("the test binary knows its path");
    let output = Command::new(exe)
        .args([
            "--ignored",
            "--exact",
            "child_with_the_wrong_libraries",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_MARKER, "1")
        .env("RDMA_MUMMY_LIBIBVERBS", NOT_RDMA)
        .env("RDMA_MUMMY_LIBRDMACM", NOT_RDMA)
        .output()
        .expect("the test binary can be re-run");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "child failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    assert!(
        stdout.contains("child checks passed"),
        "child did not run its checks:\n{stdout}\n{stderr}"
    );
}

#[test]
#[ignore = "run by a_library_without_the_verbs_is_refused_in_a_child_process"]
fn child_with_the_wrong_libraries() {
    assert_eq!(
        env::var(CHILD_MARKER).as_deref(),
        Ok("1"),
        "run only as the child of a_library_without_the_verbs_is_refused_in_a_child_process"
    );
    let err = rdma_mummy_sys::ensure_loaded().expect_err("libc is not libibverbs");
    assert_eq!(err.library(), Library::Ibverbs);
    assert_eq!(err.path(), NOT_RDMA);
    assert!(err.is_wrong_library());
    assert_eq!(
        err.to_string(),
        "RDMA_MUMMY_LIBIBVERBS=libc.so.6 loaded, but it has no ibv_get_device_list: it is not \
         libibverbs; unset it or point it at libibverbs.so.1"
    );
    let err = Library::Rdmacm.load().expect_err("libc is not librdmacm");
    assert!(err.is_wrong_library());
    assert!(
        err.to_string().starts_with(
            "RDMA_MUMMY_LIBRDMACM=libc.so.6 loaded, but it has no rdma_create_event_channel"
        ),
        "{err}"
    );
    // The outcome is fixed: asking again says the same.
    assert!(Library::Ibverbs.load().unwrap_err().is_wrong_library());
    println!("child checks passed");
}
