//! Unit tests of what needs no device: private data limits, addresses through C, codes a newer
//! librdmacm may add, and the text of errors.

use std::io;
use std::net::SocketAddr;
use std::ptr;
use std::sync::Arc;
use std::time::Duration;

use super::address::{read_sockaddr, RawSockAddr};
use super::id::ContextRef;
use super::*;

#[test]
fn private_data_limits_follow_the_man_pages() {
    assert_eq!(
        max_private_data(PortSpace::Tcp, PrivateDataCall::Connect),
        56
    );
    assert_eq!(
        max_private_data(PortSpace::Tcp, PrivateDataCall::Accept),
        196
    );
    assert_eq!(
        max_private_data(PortSpace::Tcp, PrivateDataCall::Reject),
        148
    );
    assert_eq!(
        max_private_data(PortSpace::Udp, PrivateDataCall::Connect),
        180
    );
    assert_eq!(
        max_private_data(PortSpace::Udp, PrivateDataCall::Accept),
        136
    );
}

#[test]
fn socket_addresses_round_trip_through_c() {
    for addr in ["198.18.0.1:7471", "[fe80::1]:9", "0.0.0.0:0"] {
        let addr: SocketAddr = addr.parse().unwrap();
        let mut raw = RawSockAddr::new(addr);
        // SAFETY: raw is a whole sockaddr_storage.
        let back = unsafe { read_sockaddr(raw.as_mut_ptr().cast()) };
        assert_eq!(back, Some(addr));
    }
}

#[test]
fn unknown_event_types_and_reasons_survive() {
    assert_eq!(EventType::from(9), EventType::Established);
    assert!(matches!(EventType::from(99), EventType::Unknown(v) if v.get() == 99));
    let r = RejectReason { status: 28 };
    assert!(r.is_consumer_reject());
    assert_eq!(r.ib_reason(), Some(IbRejectReason::ConsumerDefined));
    let r = RejectReason { status: 8 };
    assert!(r.to_string().contains("nobody listens"), "{r}");
    assert_eq!(RejectReason { status: -111 }.ib_reason(), None);
}

#[test]
fn timeouts_name_the_step_the_addresses_and_the_wait() {
    let ends = Endpoints {
        local: Some("127.0.0.1:40000".parse().unwrap()),
        remote: Some("127.0.0.2:7174".parse().unwrap()),
    };
    let e = CmError::Timeout {
        timeout: Duration::from_secs(10),
        waiting_for: Some(EventType::ConnectResponse),
        endpoints: ends,
    };
    assert_eq!(
        e.to_string(),
        "rdma_cm connect (127.0.0.1:40000 -> 127.0.0.2:7174): no CONNECT_RESPONSE event \
             within 10 s: the peer did not answer: is the server running and listening on that \
             address and port, and reachable over RDMA?"
    );
    let e = CmError::Timeout {
        timeout: Duration::from_millis(2500),
        waiting_for: Some(EventType::AddrResolved),
        endpoints: Endpoints {
            local: None,
            ..ends
        },
    };
    let s = e.to_string();
    assert!(
        s.starts_with(
            "address resolution (to 127.0.0.2:7174): no ADDR_RESOLVED event within 2500 ms: "
        ),
        "{s}"
    );
    let e = CmError::Timeout {
        timeout: Duration::from_secs(1),
        waiting_for: Some(EventType::RouteResolved),
        endpoints: Endpoints::default(),
    };
    assert!(e
        .to_string()
        .starts_with("route resolution: no ROUTE_RESOLVED event within 1 s"));
    let e = CmError::Timeout {
        timeout: Duration::from_secs(1),
        waiting_for: None,
        endpoints: Endpoints::default(),
    };
    assert_eq!(e.to_string(), "no rdma_cm event arrived within 1 s");
    let e = CmError::Timeout {
        timeout: Duration::from_secs(1),
        waiting_for: Some(EventType::from(77)),
        endpoints: Endpoints::default(),
    };
    assert_eq!(
        e.to_string(),
        "waiting for an rdma_cm event: no Unknown(77) event within 1 s"
    );
}

#[test]
fn errors_say_what_and_where() {
    let e = CmError::RouteUnresolvable {
        dst: Some("10.1.2.3:7471".parse().unwrap()),
        source: io::Error::from_raw_os_error(libc::ENETUNREACH),
    };
    let s = e.to_string();
    assert!(
        s.starts_with("cannot resolve a route to 10.1.2.3:7471: no RDMA device"),
        "{s}"
    );
    let e = CmError::PrivateDataTooLong {
        call: "rdma_connect",
        len: 57,
        max: 56,
        port_space: PortSpace::Tcp,
        transport: "InfiniBand/RoCE",
    };
    assert!(e.to_string().contains("57 bytes"), "{e}");
    let e = CmError::Call {
        call: "rdma_listen",
        endpoints: Endpoints {
            local: Some("198.18.0.1:7000".parse().unwrap()),
            remote: None,
        },
        source: io::Error::from_raw_os_error(libc::EADDRINUSE),
    };
    assert!(
        e.to_string()
            .starts_with("rdma_listen failed (on 198.18.0.1:7000): "),
        "{e}"
    );
    assert!(!e.to_string().contains("rdma link add"), "{e}");
}

#[test]
fn setup_without_a_device_says_what_to_do_as_open_device_does() {
    let no_device = |call| CmError::Call {
        call,
        endpoints: Endpoints::default(),
        source: io::Error::from_raw_os_error(libc::ENODEV),
    };
    let help = crate::verbs::device::DeviceError::NoDevice.to_string();
    let help = help.trim_start_matches("no RDMA device found; ");
    for call in [
        "rdma_create_event_channel",
        "rdma_create_id",
        "rdma_get_devices",
    ] {
        let s = no_device(call).to_string();
        assert!(
            s.starts_with(&format!("{call} failed: "))
                && s.contains("no RDMA device on this machine"),
            "{s}"
        );
        assert!(s.contains(help) && s.contains("rdma link add"), "{s}");
    }
    // Elsewhere ENODEV means something else: no guidance there.
    assert!(!no_device("rdma_bind_addr")
        .to_string()
        .contains("rdma link add"));
}

/// A value that holds its own context reference and gives it back in `Drop`, as `CmId` does
/// after `rdma_destroy_id`: the reference's whole life with no C call, so Miri can check it.
struct OwnContext {
    context: ContextRef<OwnContext>,
}

impl Drop for OwnContext {
    fn drop(&mut self) {
        // An event arriving now finds nothing: the last Arc is gone.
        // SAFETY: the context is this value's, not yet released.
        assert!(unsafe { ContextRef::<OwnContext>::upgrade(self.context.as_context()) }.is_none());
        // SAFETY: nothing upgrades through the context after this.
        unsafe { self.context.release() };
        // SAFETY: as above; a second release does nothing.
        unsafe { self.context.release() };
    }
}

/// `CmId`'s context reference: found through the C-side pointer while the value lives,
/// given back in `Drop` through the pointer `Weak::into_raw` gave (one made from `&mut self`
/// may not reach the counts; Miri's stacked borrows reports that), and given back at all (a
/// leaked one fails Miri's leak check). `cargo +nightly miri test -p sideway-rdma --lib
/// context_reference` runs it under Miri.
#[test]
fn the_context_reference_lives_as_long_as_the_value_and_is_given_back_in_drop() {
    let value = Arc::new_cyclic(|me| OwnContext {
        context: ContextRef::new(me),
    });
    let c_context = value.context.as_context();
    assert_eq!(Arc::weak_count(&value), 1, "the one the context holds");
    // SAFETY: c_context is the value's, not released while value lives.
    let found = unsafe { ContextRef::<OwnContext>::upgrade(c_context) }.unwrap();
    assert!(Arc::ptr_eq(&found, &value));
    drop(found);
    assert_eq!(Arc::weak_count(&value), 1, "upgrading consumed nothing");
    // SAFETY: NULL is allowed.
    assert!(unsafe { ContextRef::<OwnContext>::upgrade(ptr::null_mut()) }.is_none());
    // Dropping the last Arc runs Drop, which gives the reference back: the allocation is
    // freed, which Miri's leak check sees (a natively run test cannot).
    drop(value);
}
