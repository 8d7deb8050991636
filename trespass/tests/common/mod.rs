//! The gate every trespass device test starts with: the device's IPv4 address, or `None`
//! after printing `skipped: <reason>`. With `RDMA_TEST_DEVICE` set (the SoftRoCE rig sets
//! it) a missing device or address is a failure.

use std::net::IpAddr;

pub(crate) fn test_ip(test: &str) -> Option<IpAddr> {
    match sideway::testing::test_ip(test).unwrap_or_else(|e| panic!("{e}")) {
        sideway::testing::TestIp::Ready(ip) => Some(ip),
        sideway::testing::TestIp::Skip(line) => {
            println!("{line}");
            None
        }
    }
}
