//! The device-test convention, for tests of code built on sideway (sideway's own use it).
//!
//! A device test needs an RDMA device, and most machines that build code have none. The
//! convention: with `RDMA_TEST_DEVICE` set (a test rig, or a CI job on a machine with a
//! NIC), the named device must open, or the test fails; without it, the first device is
//! used if there is one, and with none the test is skipped. A skipped test says so: it
//! prints the [`Skip`] it was handed (`skipped: <test>: <reason>`), a line test runners
//! can count, and passes. A skipped test thus never hides a rig that lost its device.
//!
//! This module prints nothing itself: printing the skip is the caller's line.
//!
//! ```no_run
//! use sideway::testing::{test_device, TestDevice};
//!
//! #[test]
//! fn loopback_write() {
//!     let ctx = match test_device("loopback_write").unwrap_or_else(|e| panic!("{e}")) {
//!         TestDevice::Ready(ctx) => ctx,
//!         TestDevice::Skip(skip) => {
//!             println!("{skip}"); // "skipped: loopback_write: no RDMA device (...)"
//!             return;
//!         }
//!     };
//!     let gid_index = sideway::testing::gid_index(&ctx);
//!     // ...
//! #   let _ = gid_index;
//! }
//! ```

use std::net::IpAddr;
use std::sync::Arc;

use crate::verbs::device::{open_device, DeviceContext, DeviceError, LinkLayer};

/// The variable that names the device a test must use.
pub const DEVICE_ENV: &str = "RDMA_TEST_DEVICE";

/// The variable that names the GID index a test must use.
pub const GID_INDEX_ENV: &str = "RDMA_TEST_GID_INDEX";

/// The variable that holds the IPv4 address of the test device's network interface, for
/// tests that connect through rdma_cm.
pub const IP_ENV: &str = "RDMA_TEST_IP";

/// Why no device (or no address) could be had for a test that must not skip.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TestDeviceError {
    /// `RDMA_TEST_DEVICE` is set, so the test must run, but `RDMA_TEST_IP` is not.
    #[error("{test}: RDMA_TEST_DEVICE is set but RDMA_TEST_IP is not")]
    IpMissing {
        /// The test's name.
        test: String,
    },
    /// `RDMA_TEST_IP` is not an IP address.
    #[error("{test}: RDMA_TEST_IP={value} is not an IP address: {source}")]
    IpInvalid {
        /// The test's name.
        test: String,
        /// The variable's value.
        value: String,
        /// Why it does not parse.
        source: std::net::AddrParseError,
    },
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

/// What a device test runs on: from [`test_device`].
#[derive(Debug)]
pub enum TestDevice {
    /// The device to test on.
    Ready(Arc<DeviceContext>),
    /// The machine has no device and `RDMA_TEST_DEVICE` does not ask for one: print this,
    /// then end the test.
    Skip(Skip),
}

/// Why a device test is skipped. Its `Display` is the line to print:
/// `skipped: <test>: no RDMA device (<reason>)`.
#[derive(Debug)]
pub struct Skip {
    test: String,
    reason: DeviceError,
}

impl Skip {
    /// The test's name.
    pub fn test(&self) -> &str {
        &self.test
    }

    /// Why no device opened.
    pub fn reason(&self) -> &DeviceError {
        &self.reason
    }
}

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "skipped: {}: no RDMA device ({})",
            self.test, self.reason
        )
    }
}

/// The device `test` runs on, or [`TestDevice::Skip`] when the machine has no device and
/// `RDMA_TEST_DEVICE` does not ask for one. Prints nothing.
pub fn test_device(test: &str) -> Result<TestDevice, TestDeviceError> {
    match std::env::var(DEVICE_ENV) {
        Ok(name) if !name.is_empty() => match open_device(Some(&name)) {
            Ok(ctx) => Ok(TestDevice::Ready(ctx)),
            Err(source) => Err(TestDeviceError::Required {
                test: test.to_owned(),
                name,
                source,
            }),
        },
        _ => match open_device(None) {
            Ok(ctx) => Ok(TestDevice::Ready(ctx)),
            Err(
                reason @ (DeviceError::NoDevice
                | DeviceError::Library(_)
                | DeviceError::List { .. }),
            ) => Ok(TestDevice::Skip(Skip {
                test: test.to_owned(),
                reason,
            })),
            Err(source) => Err(TestDeviceError::Open {
                test: test.to_owned(),
                source,
            }),
        },
    }
}

/// The GID index a test uses on port 1: `RDMA_TEST_GID_INDEX`; else, on a RoCE (Ethernet)
/// port, the first IPv4-mapped RoCE v2 GID ([`DeviceContext::roce_v2_ipv4_gid`]), or 1
/// when there is none; 0 elsewhere. Set the variable where that is not the GID to use (the
/// SoftRoCE rig sets it).
pub fn gid_index(ctx: &DeviceContext) -> u8 {
    if let Some(i) = std::env::var(GID_INDEX_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return i;
    }
    match ctx.query_port(1).map(|p| p.link_layer()) {
        Ok(LinkLayer::Ethernet) => ctx.roce_v2_ipv4_gid(1, None).map_or(1, |e| e.index),
        _ => 0,
    }
}

/// What an rdma_cm test runs on: from [`test_ip`].
#[derive(Debug)]
pub enum TestIp {
    /// The device's address to listen on and connect to.
    Ready(IpAddr),
    /// The test is skipped: print this line (`skipped: <test>: <reason>`), then end the
    /// test.
    Skip(String),
}

/// The address `test` connects through rdma_cm on: `RDMA_TEST_IP`, once a device is there
/// ([`test_device`]). Skipped when there is no device, or no address and `RDMA_TEST_DEVICE`
/// does not ask for one; an error when the rig named a device but no (valid) address.
/// Prints nothing.
pub fn test_ip(test: &str) -> Result<TestIp, TestDeviceError> {
    if let TestDevice::Skip(skip) = test_device(test)? {
        return Ok(TestIp::Skip(skip.to_string()));
    }
    match std::env::var(IP_ENV) {
        Ok(value) if !value.is_empty() => match value.parse() {
            Ok(ip) => Ok(TestIp::Ready(ip)),
            Err(source) => Err(TestDeviceError::IpInvalid {
                test: test.to_owned(),
                value,
                source,
            }),
        },
        _ if std::env::var_os(DEVICE_ENV).is_some() => Err(TestDeviceError::IpMissing {
            test: test.to_owned(),
        }),
        _ => Ok(TestIp::Skip(format!(
            "skipped: {test}: {IP_ENV} is not set (the IPv4 address of the RDMA device's network interface)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rig_without_an_address_or_with_a_bad_one_says_which_variable() {
        let e = TestDeviceError::IpMissing {
            test: "echo".into(),
        };
        assert_eq!(
            e.to_string(),
            "echo: RDMA_TEST_DEVICE is set but RDMA_TEST_IP is not"
        );
        let source = "198.18.0".parse::<IpAddr>().unwrap_err();
        let e = TestDeviceError::IpInvalid {
            test: "echo".into(),
            value: "198.18.0".into(),
            source,
        };
        assert!(
            e.to_string()
                .starts_with("echo: RDMA_TEST_IP=198.18.0 is not an IP address: "),
            "{e}"
        );
    }

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

    #[test]
    fn a_skip_is_the_line_test_runners_count() {
        let skip = Skip {
            test: "loopback".into(),
            reason: DeviceError::NoDevice,
        };
        let text = skip.to_string();
        assert!(
            text.starts_with("skipped: loopback: no RDMA device ("),
            "{text}"
        );
        assert_eq!((skip.test(), text.lines().count()), ("loopback", 1));
    }
}
