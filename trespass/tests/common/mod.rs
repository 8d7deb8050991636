//! The gate every trespass device test starts with: the device's IPv4 address, or `None`
//! after printing `skipped: <reason>`. With `RDMA_TEST_DEVICE` set (the SoftRoCE rig sets
//! it) a missing device or address is a failure.

use std::net::IpAddr;
use std::time::Duration;

use trespass::Config;

pub(crate) fn test_ip(test: &str) -> Option<IpAddr> {
    match sideway::testing::test_ip(test).unwrap_or_else(|e| panic!("{e}")) {
        sideway::testing::TestIp::Ready(ip) => Some(ip),
        sideway::testing::TestIp::Skip(line) => {
            println!("{line}");
            None
        }
    }
}

/// Deterministic bytes, different at every offset of a long stream.
#[allow(dead_code)] // not every test file that shares this module streams bytes
pub(crate) fn pattern(offset: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| ((offset + i).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8)
        .collect()
}

/// Small buffers, so that writers outrun the ring and reads and writes would block often.
#[allow(dead_code)] // not every test file that shares this module uses it
pub(crate) fn small_config() -> Config {
    let mut c = Config::new();
    c.ring_size(64 * 1024)
        .send_buffer(32 * 1024)
        .recv_depth(16)
        .send_depth(16)
        .max_write(16 * 1024)
        .connect_timeout(Duration::from_secs(10))
        .linger(Duration::from_secs(10));
    c
}
