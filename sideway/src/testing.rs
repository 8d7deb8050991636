//! The device-test convention, for tests of code built on sideway (sideway's own use it).
//!
//! A device test needs an RDMA device, and most machines that build code have none. The
//! convention: with `RDMA_TEST_DEVICE` set (a test rig, or a CI job on a machine with a
//! NIC), the named device must open, or the test fails; without it, the first device is
//! used if there is one, and with none the test prints `skipped: <test>: <reason>` and
//! passes. A skipped test thus never hides a rig that lost its device.
//!
//! ```no_run
//! #[test]
//! fn loopback_write() {
//!     let Some(ctx) = sideway::testing::device_or_skip("loopback_write")
//!         .unwrap_or_else(|e| panic!("{e}"))
//!     else {
//!         return;
//!     };
//!     let gid_index = sideway::testing::gid_index(&ctx);
//!     // ...
//! #   let _ = gid_index;
//! }
//! ```

use std::sync::Arc;

use crate::device::{open_device, DeviceContext, DeviceError, LinkLayer};

/// The variable that names the device a test must use.
pub const DEVICE_ENV: &str = "RDMA_TEST_DEVICE";

/// The variable that names the GID index a test must use.
pub const GID_INDEX_ENV: &str = "RDMA_TEST_GID_INDEX";

/// Why no device could be opened for a test that must not skip.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TestDeviceError {
    /// `RDMA_TEST_DEVICE` names a device that did not open.
    #[error("{test}: RDMA_TEST_DEVICE={name} is set but: {source}")]
    Required {
        /// The test's name.
        test: String,
        /// The device named.
        name: String,
        /// Why it did not open.
        source: DeviceError,
    },
    /// The first device was there but did not open.
    #[error("{test}: opening the first RDMA device failed: {source}")]
    Open {
        /// The test's name.
        test: String,
        /// Why it did not open.
        source: DeviceError,
    },
}

/// The device `test` runs on; `Ok(None)` after printing `skipped: <test>: <reason>` when the
/// machine has no device and `RDMA_TEST_DEVICE` does not ask for one.
pub fn device_or_skip(test: &str) -> Result<Option<Arc<DeviceContext>>, TestDeviceError> {
    match std::env::var(DEVICE_ENV) {
        Ok(name) if !name.is_empty() => match open_device(Some(&name)) {
            Ok(ctx) => Ok(Some(ctx)),
            Err(source) => Err(TestDeviceError::Required {
                test: test.to_owned(),
                name,
                source,
            }),
        },
        _ => match open_device(None) {
            Ok(ctx) => Ok(Some(ctx)),
            Err(
                e @ (DeviceError::NoDevice | DeviceError::Library(_) | DeviceError::List { .. }),
            ) => {
                println!("skipped: {test}: no RDMA device ({e})");
                Ok(None)
            }
            Err(source) => Err(TestDeviceError::Open {
                test: test.to_owned(),
                source,
            }),
        },
    }
}

/// The GID index a test uses on port 1: `RDMA_TEST_GID_INDEX`, else 1 on a RoCE (Ethernet)
/// port and 0 elsewhere. Set the variable where index 1 is not the GID to use (the SoftRoCE
/// rig sets it).
pub fn gid_index(ctx: &DeviceContext) -> u8 {
    if let Some(i) = std::env::var(GID_INDEX_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return i;
    }
    match ctx.query_port(1).map(|p| p.link_layer()) {
        Ok(LinkLayer::Ethernet) => 1,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_required_device_that_does_not_open_names_the_variable_and_the_cause() {
        let e = TestDeviceError::Required {
            test: "loopback".into(),
            name: "mlx5_9".into(),
            source: DeviceError::NoDevice,
        };
        let text = e.to_string();
        assert!(
            text.starts_with("loopback: RDMA_TEST_DEVICE=mlx5_9 is set but: "),
            "{text}"
        );
        assert!(text.ends_with(&DeviceError::NoDevice.to_string()), "{text}");
    }
}
