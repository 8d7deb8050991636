//! The gate every device test starts with.
//!
//! With `RDMA_TEST_DEVICE` set (the SoftRoCE rig sets it), the named device must open, or the
//! test fails. Without it, the first device is used if there is one; with none, the test
//! prints `skipped: <reason>` and returns.

#![allow(dead_code)] // each test binary uses its own subset

use std::sync::Arc;

use sideway::{DeviceContext, DeviceError};

/// The device to test on, or `None` (after printing why) when the test must be skipped.
pub(crate) fn device_or_skip(test: &str) -> Option<Arc<DeviceContext>> {
    match std::env::var("RDMA_TEST_DEVICE") {
        Ok(name) if !name.is_empty() => Some(
            sideway::open_device(Some(&name))
                .unwrap_or_else(|e| panic!("RDMA_TEST_DEVICE={name} is set but: {e}")),
        ),
        _ => match sideway::open_device(None) {
            Ok(ctx) => Some(ctx),
            Err(
                e @ (DeviceError::NoDevice | DeviceError::Library(_) | DeviceError::List { .. }),
            ) => {
                println!("skipped: {test}: no RDMA device ({e})");
                None
            }
            Err(e) => panic!("{test}: opening the first RDMA device failed: {e}"),
        },
    }
}

/// The GID index tests use: `RDMA_TEST_GID_INDEX`, else 1 on RoCE ports and 0 elsewhere.
pub(crate) fn gid_index(ctx: &DeviceContext) -> u32 {
    if let Some(i) = std::env::var("RDMA_TEST_GID_INDEX")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return i;
    }
    match ctx.query_port(1).map(|p| p.link_layer()) {
        Ok(sideway::device::LinkLayer::Ethernet) => 1,
        _ => 0,
    }
}
