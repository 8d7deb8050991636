//! Device tests: listing, opening, and querying a real device and its ports and GIDs.

mod common;

use sideway::device::{DeviceError, DeviceList, GidType, LinkLayer, PortState};

#[test]
fn lists_and_queries_the_device() {
    let Some(ctx) = common::device_or_skip("lists_and_queries_the_device") else {
        return;
    };
    let list = DeviceList::new().unwrap();
    let dev = list.find(ctx.name()).unwrap();
    assert_eq!(dev.name(), ctx.name());

    let attr = ctx.query_device().unwrap();
    assert!(attr.phys_port_cnt() >= 1);
    assert!(attr.max_qp() > 0 && attr.max_cqe() > 0 && attr.max_qp_wr() > 0);
    assert!(attr.max_sge() >= 1);
    assert_eq!(attr.node_guid(), dev.guid());

    let port = ctx.query_port(1).unwrap();
    assert_eq!(port.state(), PortState::Active, "{port:?}");
    assert!(port.active_mtu().bytes().is_some(), "{port:?}");
    assert!(port.gid_table_len() > 0);
}

#[test]
fn gid_table_has_the_test_gid() {
    let Some(ctx) = common::device_or_skip("gid_table_has_the_test_gid") else {
        return;
    };
    let index = common::gid_index(&ctx);
    let entry = ctx.query_gid(1, index).unwrap();
    assert_eq!(entry.index, index);
    assert_eq!(entry.port, 1);
    assert!(!entry.gid.is_zero());
    let table = ctx.query_gid_table().unwrap();
    assert!(table.contains(&entry), "{entry:?} not in {table:?}");
    if ctx.query_port(1).unwrap().link_layer() == LinkLayer::Ethernet {
        assert!(
            entry.netdev.is_some(),
            "a RoCE GID names its netdev: {entry:?}"
        );
        if let Ok(ip) = std::env::var("RDMA_TEST_IP") {
            // The rig's test GID is the IPv4-mapped RoCE v2 GID of RDMA_TEST_IP.
            assert_eq!(entry.gid_type, GidType::RoceV2);
            assert_eq!(entry.gid.to_ipv4_mapped().map(|a| a.to_string()), Some(ip));
        }
    }
}

#[test]
fn bad_ports_gids_and_names_are_clear_errors() {
    let Some(ctx) = common::device_or_skip("bad_ports_gids_and_names_are_clear_errors") else {
        return;
    };
    for port in [0, 9] {
        match ctx.query_port(port) {
            Err(e @ DeviceError::NoSuchPort { .. }) => {
                assert!(
                    e.to_string().contains(&format!("has no port {port}")),
                    "{e}"
                )
            }
            other => panic!("port {port}: {other:?}"),
        }
    }
    let len = ctx.query_port(1).unwrap().gid_table_len();
    // A table of 256 entries or more has no index past it that a u8 can name.
    if let Ok(past) = u8::try_from(len) {
        match ctx.query_gid(1, past) {
            Err(e @ DeviceError::NoSuchGid { .. }) => {
                assert!(e.to_string().contains("has no GID index"), "{e}")
            }
            other => panic!("{other:?}"),
        }
    }
    match sideway::open_device(Some("no_such_device9")) {
        Err(e @ DeviceError::NotFound { .. }) => {
            assert!(
                e.to_string().contains(ctx.name()),
                "lists the devices there are: {e}"
            )
        }
        other => panic!("{other:?}"),
    }
    // P_Key index 0 holds the default partition key on every port.
    assert_eq!(ctx.query_pkey(1, 0).unwrap() & 0x7fff, 0x7fff);
}

#[test]
fn memory_registration() {
    let Some(ctx) = common::device_or_skip("memory_registration") else {
        return;
    };
    let pd = ctx.alloc_pd().unwrap();
    let mut buf = pd
        .reg_buffer(
            8192,
            sideway::memory_region::AccessFlags::LOCAL_WRITE
                | sideway::memory_region::AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    assert_eq!(buf.len(), 8192);
    assert_eq!(buf.addr() % 4096, 0);
    assert_eq!(buf.mr().len(), 8192);
    buf.write_at(0, b"ping").unwrap();
    assert_eq!(&common::bytes(&buf)[..4], b"ping");
    let sge = buf.sge(4096..8192).unwrap();
    assert_eq!(sge.addr(), buf.addr() + 4096);
    assert_eq!(sge.length(), 4096);
    assert_eq!(sge.lkey(), buf.lkey());
    assert!(buf.sge(4096..8193).is_none());
    // Raw registration of memory we own, dropped before the memory.
    let mut raw = vec![0u8; 4096];
    // SAFETY: `raw` outlives the region, which is dropped at the end of this block first.
    let mr = unsafe {
        pd.reg_mr(
            raw.as_mut_ptr(),
            raw.len(),
            sideway::memory_region::AccessFlags::LOCAL_WRITE,
        )
        .unwrap()
    };
    assert_eq!(mr.addr(), raw.as_ptr() as u64);
    drop(mr);
    // An access combination the verbs reject, with the hint.
    // SAFETY: as above.
    let err = unsafe {
        pd.reg_mr(
            raw.as_mut_ptr(),
            raw.len(),
            sideway::memory_region::AccessFlags::REMOTE_WRITE,
        )
    };
    if let Err(e) = err {
        assert!(e.to_string().contains("ibv_reg_mr"), "{e}");
    }
}

/// The CPU's ways into a device-writable buffer: copies with bounds, fills, volatile reads
/// with alignment, and the read-only kind's slices (refused for write access).
#[test]
fn registered_buffer_access() {
    use sideway::memory_region::{AccessFlags, BufferError, MemoryRegionError};
    let Some(ctx) = common::device_or_skip("registered_buffer_access") else {
        return;
    };
    let pd = ctx.alloc_pd().unwrap();
    let mut buf = pd.reg_buffer(100, AccessFlags::LOCAL_WRITE).unwrap();
    assert!(buf.mr().access().contains(AccessFlags::LOCAL_WRITE));
    assert_eq!(common::bytes(&buf), vec![0; 100], "zeroed");
    buf.fill(10..20, 0xab).unwrap();
    buf.write_at(96, &[1, 2, 3, 4]).unwrap();
    assert_eq!(buf.to_vec(8..12).unwrap(), [0, 0, 0xab, 0xab]);
    assert_eq!(buf.read_volatile::<u8>(10).unwrap(), 0xab);
    assert_eq!(
        buf.read_volatile::<u32>(96).unwrap(),
        u32::from_ne_bytes([1, 2, 3, 4])
    );
    let mut out = [0u8; 4];
    buf.read_at(96, &mut out).unwrap();
    assert_eq!(out, [1, 2, 3, 4]);
    let past = BufferError::OutOfRange {
        start: 98,
        end: 102,
        len: 100,
    };
    assert_eq!(buf.write_at(98, &[0; 4]).unwrap_err(), past);
    assert_eq!(buf.read_at(98, &mut out).unwrap_err(), past);
    assert_eq!(buf.read_volatile::<u32>(98).unwrap_err(), past);
    let (start, end) = (20, 10);
    assert!(buf.to_vec(start..end).is_err(), "a reversed range");
    assert!(buf.fill(90..101, 0).is_err());
    assert!(buf.write_at(usize::MAX, &[1]).is_err(), "no overflow");
    assert_eq!(
        buf.read_volatile::<u64>(4).unwrap_err(),
        BufferError::Misaligned {
            offset: 4,
            align: 8
        }
    );

    // Memory the device only reads keeps its slices; write access is refused for it.
    let mut src = pd
        .reg_read_only_buffer(64, AccessFlags::REMOTE_READ)
        .unwrap();
    src.as_mut_slice()[..5].copy_from_slice(b"bytes");
    assert_eq!(&src.as_slice()[..5], b"bytes");
    for access in [
        AccessFlags::LOCAL_WRITE,
        AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE | AccessFlags::LOCAL_WRITE,
        AccessFlags::REMOTE_ATOMIC,
        AccessFlags::from_bits_retain(1 << 29),
    ] {
        let err = pd.reg_read_only_buffer(64, access).unwrap_err();
        assert!(
            matches!(err, MemoryRegionError::WritableAccess { .. }),
            "{access:?}: {err}"
        );
        assert!(err.to_string().contains("use reg_buffer"), "{err}");
    }
}
