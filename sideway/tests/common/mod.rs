//! The gate every device test starts with.
//!
//! With `RDMA_TEST_DEVICE` set (the SoftRoCE rig sets it), the named device must open, or the
//! test fails. Without it, the first device is used if there is one; with none, the test
//! prints `skipped: <reason>` and returns.

#![allow(dead_code)] // each test binary uses its own subset

pub(crate) mod fake_library;

use std::sync::Arc;

use sideway::device::DeviceContext;

/// The device to test on, or `None` (after printing why) when the test must be skipped.
pub(crate) fn device_or_skip(test: &str) -> Option<Arc<DeviceContext>> {
    match sideway::testing::test_device(test).unwrap_or_else(|e| panic!("{e}")) {
        sideway::testing::TestDevice::Ready(ctx) => Some(ctx),
        sideway::testing::TestDevice::Skip(skip) => {
            println!("{skip}");
            None
        }
    }
}

/// The device's IPv4 address for rdma_cm tests, or `None` (after printing why) when the
/// test must be skipped.
pub(crate) fn ip_or_skip(test: &str) -> Option<std::net::IpAddr> {
    match sideway::testing::test_ip(test).unwrap_or_else(|e| panic!("{e}")) {
        sideway::testing::TestIp::Ready(ip) => Some(ip),
        sideway::testing::TestIp::Skip(line) => {
            println!("{line}");
            None
        }
    }
}

/// The GID index tests use: `RDMA_TEST_GID_INDEX`, else 1 on RoCE ports and 0 elsewhere.
pub(crate) fn gid_index(ctx: &DeviceContext) -> u8 {
    sideway::testing::gid_index(ctx)
}

/// A copy of all of `buf`'s bytes: the device may write a registered buffer, so tests read
/// it by copy, never through a slice.
pub(crate) fn bytes<A: sideway::memory_region::BufferAccess>(
    buf: &sideway::memory_region::RegisteredBuffer<A>,
) -> Vec<u8> {
    buf.to_vec(0..buf.len()).expect("the whole buffer")
}
