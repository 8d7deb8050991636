//! The gate every trespass device test starts with: the device's IPv4 address, or `None`
//! after printing `skipped: <reason>`. With `RDMA_TEST_DEVICE` set (the SoftRoCE rig sets
//! it) a missing device or address is a failure.

use std::net::IpAddr;

pub(crate) fn test_ip(test: &str) -> Option<IpAddr> {
    match sideway::testing::test_device(test).unwrap_or_else(|e| panic!("{e}")) {
        sideway::testing::TestDevice::Ready(_) => {}
        sideway::testing::TestDevice::Skip(skip) => {
            println!("{skip}");
            return None;
        }
    }
    match std::env::var("RDMA_TEST_IP") {
        Ok(ip) if !ip.is_empty() => Some(
            ip.parse()
                .unwrap_or_else(|e| panic!("RDMA_TEST_IP={ip} is not an IP address: {e}")),
        ),
        _ if std::env::var_os("RDMA_TEST_DEVICE").is_some() => {
            panic!("{test}: RDMA_TEST_DEVICE is set but RDMA_TEST_IP is not")
        }
        _ => {
            println!("skipped: {test}: RDMA_TEST_IP is not set (the RDMA device's IPv4 address)");
            None
        }
    }
}
