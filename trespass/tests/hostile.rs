//! A hostile peer: a raw sideway program that connects to a trespass listener with a valid
//! hello, then lies (lengths beyond its credit, writes past the ring's end, credits for
//! bytes never sent, a second FIN, data after FIN, messages beyond the limit, writes outside
//! the ring). Each lie must end that connection with a typed error on the trespass side, never
//! a panic or a hang, and leave a second, honest connection to the same listener untouched.
//!
//! Device tests: they skip without a device, and fail with `RDMA_TEST_DEVICE` set and none.

mod common;

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use sideway::completion_queue::CompletionQueue;
use sideway::connection::CompletionWaiter;
use sideway::memory_region::{AccessFlags, RegisteredBuffer};
use sideway::queue_pair::{QueuePair, SendData, SendFlags};
use sideway::rdmacm::{CmId, ConnParam, EventChannel, EventType, PortSpace};
use trespass::wire::{Control, Hello, Imm, Lend, LEND_LEN};
use trespass::{Config, Listener, Stream};

const WAIT: Option<Duration> = Some(Duration::from_secs(10));
const RING: u32 = 16 * 1024;

/// A peer that speaks trespass's handshake and then writes whatever it is told to.
struct Liar {
    _channel: Arc<EventChannel>,
    _id: Arc<CmId>,
    _cq: Arc<CompletionQueue>,
    qp: QueuePair,
    waiter: CompletionWaiter,
    buf: RegisteredBuffer,
    ring: RegisteredBuffer,
    peer: Hello,
    next: u64,
}

/// Receives the liar posts (and promises in its hello), for whatever the honest side sends.
const LIAR_RECVS: u16 = 64;

/// The wr_id of the liar's `n`th receive (0-based).
fn recv_id(n: u64) -> u64 {
    1 << 40 | n
}

impl Liar {
    fn connect(addr: SocketAddr) -> Liar {
        Liar::connect_with(addr, false)
    }

    /// Connects, its hello saying whether it lends (then its QP takes and issues READs).
    fn connect_with(addr: SocketAddr, lends: bool) -> Liar {
        let channel = EventChannel::new().unwrap();
        let id = channel.create_id(PortSpace::Tcp).unwrap();
        id.resolve_addr(None, addr, Duration::from_secs(2)).unwrap();
        channel.wait_for(EventType::AddrResolved, WAIT).unwrap();
        id.resolve_route(Duration::from_secs(2)).unwrap();
        channel.wait_for(EventType::RouteResolved, WAIT).unwrap();
        let ctx = id.device_context().unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq_builder().cqe(256).build().unwrap();
        let mut qp = id
            .create_qp(
                pd.create_qp_builder()
                    .send_cq(&cq)
                    .recv_cq(&cq)
                    .max_send_wr(32)
                    .max_recv_wr(64),
            )
            .unwrap();
        let ring = pd
            .reg_buffer(
                RING as usize,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            )
            .unwrap();
        let buf = pd
            .reg_buffer(4 * RING as usize, AccessFlags::LOCAL_WRITE)
            .unwrap();
        // Receives for whatever the honest side sends back (credits, a FIN).
        let mut batch = qp.start_post_recv();
        for i in 0..u64::from(LIAR_RECVS) {
            let _ = batch.recv(recv_id(i), &[]);
        }
        batch.post().unwrap();
        let hello = Hello {
            ring_addr: ring.addr(),
            ring_rkey: ring.rkey(),
            ring_size: RING,
            recv_depth: LIAR_RECVS,
            max_message: 1 << 20,
            lends,
        };
        let reads = if lends { 4 } else { 0 };
        let mut param = ConnParam::new();
        param
            .private_data(&hello.encode())
            .responder_resources(reads)
            .initiator_depth(reads)
            .retry_count(7)
            .rnr_retry_count(0);
        id.connect(&param).unwrap();
        let est = channel.wait_for(EventType::Established, WAIT).unwrap();
        let peer = Hello::decode(est.private_data()).unwrap();
        drop(est);
        let waiter = CompletionWaiter::new(&cq, Duration::from_secs(10));
        Liar {
            _channel: channel,
            _id: id,
            _cq: cq,
            qp,
            waiter,
            buf,
            ring,
            peer,
            next: 0,
        }
    }

    /// Disconnects without a FIN, as a process that dies does (its NIC's DREQ).
    fn disconnect(&self) {
        self._id.disconnect().unwrap();
    }

    /// The immediate of its `n`th receive's completion (`None` on a failure or none).
    fn recv(&mut self, n: u64) -> Option<u32> {
        self.waiter
            .wait(recv_id(n))
            .ok()
            .filter(|wc| wc.is_success())
            .and_then(|wc| wc.imm_data())
    }

    /// Takes the receives from the first on until one says the peer consumed at least
    /// `bytes` in all (a byte credit); panics if none does within the waiter's bound.
    fn wait_for_credit(&mut self, bytes: u32) {
        for n in 0..u64::from(LIAR_RECVS) {
            let imm = self
                .recv(n)
                .unwrap_or_else(|| panic!("no credit for {bytes} bytes came"));
            if let Ok(Imm::CreditBytes(c)) = Imm::decode(imm) {
                if c >= bytes {
                    return;
                }
            }
        }
        panic!("{LIAR_RECVS} receives without a credit for {bytes} bytes");
    }

    /// An RDMA READ of `len` bytes at `addr` under `rkey` into its buffer's start; waits,
    /// and returns whether it succeeded.
    fn read(&mut self, rkey: u32, addr: u64, len: usize) -> bool {
        let id = self.next;
        self.next += 1;
        let mut batch = self.qp.start_post_send();
        let _ = batch.wr(id, SendFlags::SIGNALED).rdma_read(
            rkey,
            addr,
            SendData::Sge(self.buf.sge(0..len).unwrap()),
        );
        batch.post().unwrap();
        matches!(self.waiter.wait(id), Ok(wc) if wc.is_success())
    }

    /// Announces a lent region and writes its descriptor at ring offset `offset`.
    fn lend(&mut self, offset: u64, lend: Lend) -> bool {
        self.buf.write_at(0, &lend.encode()).unwrap();
        let piece = Imm::Data {
            len: LEND_LEN as u32,
            msg: true,
            eom: true,
        }
        .encode();
        self.control(Imm::Control(Control::Lend)) && self.write(offset, LEND_LEN, piece)
    }

    /// Writes `len` bytes with immediate `imm` at `offset` of the peer's ring, and waits
    /// for the completion; returns whether it succeeded.
    fn write(&mut self, offset: u64, len: usize, imm: u32) -> bool {
        let id = self.next;
        self.next += 1;
        let data = if len == 0 {
            SendData::Empty
        } else {
            SendData::Sge(self.buf.sge(0..len).unwrap())
        };
        let mut batch = self.qp.start_post_send();
        let _ = batch.wr(id, SendFlags::SIGNALED).rdma_write_with_imm(
            self.peer.ring_rkey,
            self.peer.ring_addr + offset,
            imm,
            data,
        );
        batch.post().unwrap();
        match self.waiter.wait(id) {
            Ok(wc) => wc.is_success(),
            Err(_) => false,
        }
    }

    fn data(&mut self, offset: u64, len: u32) -> bool {
        let imm = Imm::Data {
            len,
            msg: false,
            eom: false,
        }
        .encode();
        self.write(offset, len as usize, imm)
    }

    fn control(&mut self, imm: Imm) -> bool {
        self.write(0, 0, imm.encode())
    }

    /// `batches` times 16 zero-length stream writes with immediate data, posted at once
    /// (the last of each signaled), without waiting for a single receive credit; true when
    /// every batch completed.
    fn burst(&mut self, batches: usize) -> bool {
        let imm = Imm::Data {
            len: 0,
            msg: false,
            eom: false,
        }
        .encode();
        let mut ok = true;
        for _ in 0..batches {
            let mut batch = self.qp.start_post_send();
            let first = self.next;
            for i in 0..16 {
                let flags = if i == 15 {
                    SendFlags::SIGNALED
                } else {
                    SendFlags::empty()
                };
                let _ = batch.wr(first + i, flags).rdma_write_with_imm(
                    self.peer.ring_rkey,
                    self.peer.ring_addr,
                    imm,
                    SendData::Empty,
                );
            }
            self.next += 16;
            batch.post().unwrap();
            ok &= matches!(self.waiter.wait(first + 15), Ok(wc) if wc.is_success());
        }
        ok
    }
}

/// Runs `lie` against a listener on `port` while an honest connection to the same listener
/// moves data; returns the error the lied-to stream's reads end with (after `read_first`
/// bytes, read before the lie's second part if any).
fn lied_to(
    ip: IpAddr,
    port: u16,
    read_first: usize,
    lie: impl FnOnce(&mut Liar) + Send + 'static,
) -> io::Error {
    let mut config = Config::new();
    config.ring_size(RING).keepalive(None);
    lied_to_with(ip, port, &config, read_first, lie)
}

/// [`lied_to`] with the listener's (and the honest client's) configuration.
fn lied_to_with(
    ip: IpAddr,
    port: u16,
    config: &Config,
    read_first: usize,
    lie: impl FnOnce(&mut Liar) + Send + 'static,
) -> io::Error {
    let addr = SocketAddr::new(ip, port);
    let listener: Listener = config.bind(addr).unwrap();
    // The honest connection first.
    let honest_cfg = config.clone();
    let honest = thread::spawn(move || honest_cfg.connect(addr).unwrap());
    let (mut honest_server, _) = listener.accept().unwrap();
    let mut honest_client: Stream = honest.join().unwrap();
    // Then the liar.
    let liar = thread::spawn(move || {
        let mut liar = Liar::connect(addr);
        lie(&mut liar);
        liar
    });
    let (mut victim, _) = listener.accept().unwrap();
    victim
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buf = vec![0u8; 4 * RING as usize];
    // What the lie needs read before its second part; then the whole lie is told (its writes
    // are in this side's memory and completion queue) before anything else is read.
    victim.read_exact(&mut buf[..read_first]).unwrap();
    let _liar = liar.join().unwrap();
    let err = loop {
        match victim.read(&mut buf) {
            Ok(0) => panic!("the lie read as end of stream"),
            Ok(_) => {}
            Err(e) => break e,
        }
    };
    // The same error again: it is sticky.
    let again = victim.read(&mut buf).unwrap_err();
    assert_eq!(again.kind(), err.kind());
    // The honest connection is untouched.
    honest_client.write_all(b"still here").unwrap();
    let mut back = [0u8; 10];
    honest_server.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"still here");
    println!("port {port}: {err}");
    err
}

fn protocol_error(err: &io::Error, says: &str) {
    assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    assert!(
        err.to_string().contains(says),
        "{err:?} does not say {says:?}"
    );
    let inner = err
        .get_ref()
        .and_then(|e| e.downcast_ref::<trespass::Error>());
    assert_eq!(
        inner.map(trespass::Error::fault),
        Some(trespass::Fault::Peer),
        "{err:?}"
    );
}

#[test]
fn a_peer_that_writes_beyond_its_credit_is_cut_off() {
    let Some(ip) = common::test_ip("a_peer_that_writes_beyond_its_credit_is_cut_off") else {
        return;
    };
    let err = lied_to(ip, 7621, 0, |l| {
        assert!(l.data(0, RING));
        // The ring is full and nothing was credited: more is a lie.
        l.data(0, 100);
    });
    protocol_error(&err, "more than its credit");
}

#[test]
fn a_peer_that_writes_more_often_than_it_has_receives_is_cut_off_and_the_shared_pool_serves_on() {
    let Some(ip) = common::test_ip(
        "a_peer_that_writes_more_often_than_it_has_receives_is_cut_off_and_the_shared_pool_serves_on",
    ) else {
        return;
    };
    // The listener and the honest client draw from one shared queue of 16 receives (one
    // process, one device); the liar is promised 8 and writes 48 at once, taking receives
    // the honest connection is promised. The pool is refilled as completions are routed,
    // and the honest side's writes wait (RNR) rather than fail.
    let mut config = Config::new();
    config
        .ring_size(RING)
        .keepalive(None)
        .recv_depth(8)
        .shared_receive_queue(Some(16));
    let err = lied_to_with(ip, 7660, &config, 0, |l| {
        l.burst(3);
    });
    protocol_error(&err, "granted only");
}

#[test]
fn a_peer_that_writes_past_the_ring_end_is_cut_off() {
    let Some(ip) = common::test_ip("a_peer_that_writes_past_the_ring_end_is_cut_off") else {
        return;
    };
    let err = lied_to(ip, 7622, RING as usize - 10, |l| {
        assert!(l.data(0, RING - 10));
        // Wait until the victim read those and said so, so the next lie is not about
        // credit: the ring is empty, its tail 10 bytes before the end.
        l.wait_for_credit(RING - 10);
        // 20 bytes (written anywhere inside the ring) announced at that tail: they would
        // run past the end, which no honest sender does (it splits the write).
        l.data(0, 20);
    });
    protocol_error(&err, "past the ring's end");
}

#[test]
fn credits_for_bytes_never_sent_are_a_lie() {
    let Some(ip) = common::test_ip("credits_for_bytes_never_sent_are_a_lie") else {
        return;
    };
    let err = lied_to(ip, 7623, 0, |l| {
        l.control(Imm::CreditBytes(1000));
    });
    protocol_error(&err, "only 0 were written");
    let err = lied_to(ip, 7624, 0, |l| {
        l.control(Imm::CreditRecvs(1 << 20));
    });
    protocol_error(&err, "receives posted again");
}

#[test]
fn a_second_fin_and_data_after_fin_are_lies() {
    let Some(ip) = common::test_ip("a_second_fin_and_data_after_fin_are_lies") else {
        return;
    };
    let err = lied_to(ip, 7625, 0, |l| {
        l.control(Imm::Control(Control::Fin));
        l.control(Imm::Control(Control::Fin));
    });
    // The first FIN ends the stream: the reader sees end of stream unless the second
    // arrives first; either way the lie is caught before anything is delivered wrongly.
    protocol_error(&err, "second FIN");
    let err = lied_to(ip, 7626, 0, |l| {
        l.control(Imm::Control(Control::Fin));
        l.data(0, 10);
    });
    protocol_error(&err, "after its FIN");
}

#[test]
fn unknown_control_and_unasked_answers_are_lies() {
    let Some(ip) = common::test_ip("unknown_control_and_unasked_answers_are_lies") else {
        return;
    };
    let err = lied_to(ip, 7627, 0, |l| {
        l.write(0, 0, 0xc000_00ff);
    });
    protocol_error(&err, "unknown control");
    let err = lied_to(ip, 7628, 0, |l| {
        l.control(Imm::Control(Control::Pong));
    });
    protocol_error(&err, "nobody asked for");
    let err = lied_to(ip, 7629, 0, |l| {
        // Announces 100 bytes, writes 10.
        let imm = Imm::Data {
            len: 100,
            msg: false,
            eom: false,
        }
        .encode();
        l.write(0, 10, imm);
    });
    protocol_error(&err, "announced as 100");
}

#[test]
fn a_message_longer_than_advertised_is_a_lie() {
    let Some(ip) = common::test_ip("a_message_longer_than_advertised_is_a_lie") else {
        return;
    };
    let addr = SocketAddr::new(ip, 7630);
    let mut config = Config::new();
    config.ring_size(RING).max_message(1000).keepalive(None);
    let listener = config.bind(addr).unwrap();
    let liar = thread::spawn(move || {
        let mut l = Liar::connect(addr);
        assert_eq!(l.peer.max_message, 1000, "the limit travels in the hello");
        for i in 0..2 {
            let imm = Imm::Data {
                len: 600,
                msg: true,
                eom: i == 1,
            }
            .encode();
            l.write(600 * i, 600, imm);
        }
        l
    });
    let (mut victim, _) = listener.accept().unwrap();
    victim
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut msg = Vec::new();
    let err = victim.recv_msg(&mut msg).unwrap_err();
    protocol_error(&err, "more than 1000 bytes");
    drop(liar.join().unwrap());
}

#[test]
fn a_write_outside_the_ring_fails_at_the_liar_and_ends_only_that_connection() {
    let Some(ip) =
        common::test_ip("a_write_outside_the_ring_fails_at_the_liar_and_ends_only_that_connection")
    else {
        return;
    };
    let err = lied_to(ip, 7631, 0, |l| {
        // The victim's NIC refuses: the ring's registration ends at RING.
        let ok = l.data(u64::from(RING) - 4, 100);
        assert!(!ok, "a write past the registration must fail");
    });
    // The refused write broke the queue pair; the victim's NIC reported the refused access
    // (a remote access error on its receive): the peer's fault, typed as such. A provider
    // that reports only a flush gives a reset instead.
    match err.kind() {
        io::ErrorKind::InvalidData => protocol_error(&err, "outside the ring"),
        io::ErrorKind::ConnectionReset => println!("reset only: {err}"),
        _ => panic!("{err:?}"),
    }
}

#[test]
fn a_peer_of_another_protocol_version_is_refused_with_a_message_saying_so() {
    let Some(ip) =
        common::test_ip("a_peer_of_another_protocol_version_is_refused_with_a_message_saying_so")
    else {
        return;
    };
    // A client speaking version 9 to a trespass listener: rejected, with the listener's
    // version in the refusal; the listener goes on serving.
    let addr = SocketAddr::new(ip, 7632);
    let mut config = Config::new();
    config.keepalive(None);
    let listener = config.bind(addr).unwrap();
    let server = thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = [0u8; 2];
        s.read_exact(&mut buf).unwrap();
        buf
    });
    let channel = EventChannel::new().unwrap();
    let id = channel.create_id(PortSpace::Tcp).unwrap();
    id.resolve_addr(None, addr, Duration::from_secs(2)).unwrap();
    channel.wait_for(EventType::AddrResolved, WAIT).unwrap();
    id.resolve_route(Duration::from_secs(2)).unwrap();
    channel.wait_for(EventType::RouteResolved, WAIT).unwrap();
    let ctx = id.device_context().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq_builder().build().unwrap();
    let _qp = id
        .create_qp(pd.create_qp_builder().send_cq(&cq).recv_cq(&cq))
        .unwrap();
    let mut future = Hello {
        ring_addr: 0x1000,
        ring_rkey: 1,
        ring_size: RING,
        recv_depth: 16,
        max_message: 100,
        lends: false,
    }
    .encode();
    future[5] = 9;
    let mut param = ConnParam::new();
    param.private_data(&future);
    id.connect(&param).unwrap();
    let ev = channel.get_event(WAIT).unwrap();
    assert_eq!(ev.event_type(), EventType::Rejected);
    let refusal = trespass::wire::Refusal::decode(ev.private_data());
    assert_eq!(refusal, Ok(trespass::wire::Refusal::BadHello), "{ev:?}");
    assert_eq!(
        &ev.private_data()[4..6],
        &trespass::wire::VERSION.to_be_bytes()
    );
    drop(ev);
    // An honest client after it is served.
    let mut c = config.connect(addr).unwrap();
    c.write_all(b"ok").unwrap();
    assert_eq!(&server.join().unwrap(), b"ok");

    // A trespass client refused by a listener of version 7: the error names both versions.
    let addr = SocketAddr::new(ip, 7633);
    let lch = EventChannel::new().unwrap();
    let lid = lch.create_id(PortSpace::Tcp).unwrap();
    lid.bind_addr(addr).unwrap();
    lid.listen(4).unwrap();
    let refuser = thread::spawn(move || {
        let req = lch.wait_for(EventType::ConnectRequest, WAIT).unwrap();
        let mut refusal = trespass::wire::Refusal::BadHello.encode();
        refusal[5] = 7;
        req.id().reject(&refusal).unwrap();
        drop(req);
        lid
    });
    let err = config.connect(addr).unwrap_err();
    drop(refuser.join().unwrap());
    println!("refused by version 7: {err}");
    assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused, "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("version 7") && text.contains("version 1"),
        "{text}"
    );
}

#[test]
fn a_peer_that_lends_memory_its_key_does_not_open_is_cut_off() {
    let Some(ip) = common::test_ip("a_peer_that_lends_memory_its_key_does_not_open_is_cut_off")
    else {
        return;
    };
    let addr = SocketAddr::new(ip, 7668);
    let mut config = Config::new();
    config.ring_size(RING).keepalive(None);
    let listener = config.bind(addr).unwrap();
    // An honest connection to the same listener first.
    let honest_cfg = config.clone();
    let honest = thread::spawn(move || honest_cfg.connect(addr).unwrap());
    let (mut honest_server, _) = listener.accept().unwrap();
    let mut honest_client: Stream = honest.join().unwrap();
    let liar = thread::spawn(move || {
        let mut l = Liar::connect_with(addr, true);
        assert!(l.peer.lends, "a trespass listener lends");
        // Its buffer is registered for local write only: the key opens nothing remote.
        let lend = Lend {
            addr: l.buf.addr(),
            rkey: l.buf.rkey(),
            len: 4096,
        };
        assert!(l.lend(0, lend));
        l
    });
    let (mut victim, _) = listener.accept().unwrap();
    victim
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let _liar = liar.join().unwrap();
    let mut msg = Vec::new();
    let err = victim.recv_msg(&mut msg).unwrap_err();
    println!("port 7668: {err}");
    protocol_error(&err, "could not be read");
    let again = victim.recv_msg(&mut msg).unwrap_err();
    assert_eq!(again.kind(), err.kind(), "sticky");
    honest_client.write_all(b"still here").unwrap();
    let mut back = [0u8; 10];
    honest_server.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"still here");
}

#[test]
fn a_returned_buffers_key_opens_nothing() {
    let Some(ip) = common::test_ip("a_returned_buffers_key_opens_nothing") else {
        return;
    };
    // A peer that fetches a lent buffer, returns it, and reads again with the same key once
    // the lender has it back: the lender's registration is gone, so its NIC refuses.
    let addr = SocketAddr::new(ip, 7669);
    let mut config = Config::new();
    config.ring_size(RING).keepalive(None);
    let listener = config.bind(addr).unwrap();
    let (returned_tx, returned_rx) = std::sync::mpsc::channel::<()>();
    let fetcher = thread::spawn(move || {
        let mut l = Liar::connect_with(addr, true);
        // The lender's first two writes with immediate: the LEND, then its descriptor at
        // ring offset 0.
        assert_eq!(l.recv(0), Some(Imm::Control(Control::Lend).encode()));
        assert!(l.recv(1).is_some());
        let mut desc = [0u8; LEND_LEN];
        l.ring.read_at(0, &mut desc).unwrap();
        let lend = Lend::decode(&desc, 1 << 20).unwrap();
        assert_eq!(lend.len, 8192);
        assert!(l.read(lend.rkey, lend.addr, 8192), "the lent buffer reads");
        let mut got = vec![0u8; 8192];
        l.buf.read_at(0, &mut got).unwrap();
        assert!(got == common::pattern(9, 8192), "the lent bytes");
        assert!(l.control(Imm::Control(Control::Return)));
        returned_rx.recv().unwrap();
        let again = l.read(lend.rkey, lend.addr, 8192);
        assert!(!again, "a READ with the key of a returned buffer must fail");
        l
    });
    let (mut lender, _) = listener.accept().unwrap();
    lender
        .set_write_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    lender.lend_msg(common::pattern(9, 8192)).unwrap();
    let back = lender.reclaim().unwrap();
    assert!(
        back == common::pattern(9, 8192),
        "the buffer comes back unchanged"
    );
    returned_tx.send(()).unwrap();
    let _fetcher = fetcher.join().unwrap();
}

/// How long the long-spin tests' reads busy-poll: far beyond every bound they check.
const LONG_SPIN: Duration = Duration::from_secs(60);

/// A raw peer connected to a listener on `port` whose connections busy-poll for
/// [`LONG_SPIN`] (keep-alive `keepalive`): the listener, the accepted stream, the sender of
/// the signals the peer's thread may wait for ([`failed_read`] sends one as its read
/// begins and one when it ended), and that thread, which connects and then runs `peer` with
/// the signals' receiver.
fn long_spin(
    ip: IpAddr,
    port: u16,
    keepalive: Option<Duration>,
    peer: impl FnOnce(Liar, std::sync::mpsc::Receiver<()>) -> Liar + Send + 'static,
) -> (
    Listener,
    Stream,
    std::sync::mpsc::Sender<()>,
    thread::JoinHandle<Liar>,
) {
    let addr = SocketAddr::new(ip, port);
    let mut config = Config::new();
    config
        .ring_size(RING)
        .keepalive(keepalive)
        .busy_poll(LONG_SPIN)
        .busy_poll_max(LONG_SPIN);
    let listener = config.bind(addr).unwrap();
    let (signal, signalled) = std::sync::mpsc::channel::<()>();
    let liar = thread::spawn(move || peer(Liar::connect(addr), signalled));
    let (victim, _) = listener.accept().unwrap();
    (listener, victim, signal, liar)
}

/// Reads from `victim` until the read fails, signalling `peer` as the read begins and when
/// it ended, then takes the peer's thread back: the read's error and how long it took.
fn failed_read(
    victim: &mut Stream,
    signal: std::sync::mpsc::Sender<()>,
    peer: thread::JoinHandle<Liar>,
) -> (io::Error, Duration) {
    // A peer that no longer listens has dropped its receiver: nothing to tell it.
    let _ = signal.send(());
    let start = std::time::Instant::now();
    let err = victim.read(&mut [0u8; 16]).unwrap_err();
    let took = start.elapsed();
    let _ = signal.send(());
    let _liar = peer.join().unwrap();
    (err, took)
}

/// A peer that says nothing, its receives posted and its QP up, until the read has ended.
fn silent(liar: Liar, signals: std::sync::mpsc::Receiver<()>) -> Liar {
    signals.recv().unwrap();
    signals.recv().unwrap();
    liar
}

/// A peer that disconnects without a FIN while this side's read busy-polls (here for a
/// minute) ends the read with a reset about when rdma_cm says so: a spin that has run a
/// millisecond reads rdma_cm's channel every millisecond, instead of meeting the event
/// only when the spin runs out and the wait prepares to sleep.
#[test]
fn a_disconnect_ends_a_long_busy_poll_at_once() {
    let Some(ip) = common::test_ip("a_disconnect_ends_a_long_busy_poll_at_once") else {
        return;
    };
    let (_listener, mut victim, signal, liar) = long_spin(ip, 7634, None, |liar, read_begins| {
        read_begins.recv().unwrap();
        // Well into the read's spin, past its first look at rdma_cm's channel.
        thread::sleep(Duration::from_millis(300));
        liar.disconnect();
        liar
    });
    let (err, took) = failed_read(&mut victim, signal, liar);
    assert_eq!(err.kind(), io::ErrorKind::ConnectionReset, "{err}");
    // The disconnect comes after 300 ms; the spin would run for 60 s. A bound far from
    // both: the emulated guest's rdma_cm may take a while to deliver the event.
    assert!(
        took < Duration::from_secs(20),
        "the read spun {took:?} after the peer disconnected (busy poll {LONG_SPIN:?})"
    );
    println!("the read ended {took:?} after it began: {err}");
}

/// A peer whose process stops answering (its QP stays up: the NIC still acknowledges, as
/// for a process under SIGSTOP) while this side's read busy-polls for a minute: keep-alive
/// probes it and declares it dead on its own schedule (about two periods), during the spin.
/// The spin runs the core's timers each time it looks at rdma_cm's channel, instead of
/// only when it runs out and the wait prepares to sleep.
#[test]
fn a_silent_peer_is_declared_dead_during_a_long_busy_poll() {
    let Some(ip) = common::test_ip("a_silent_peer_is_declared_dead_during_a_long_busy_poll") else {
        return;
    };
    let period = Duration::from_millis(500);
    let (_listener, mut victim, signal, liar) = long_spin(ip, 7635, Some(period), silent);
    let (err, took) = failed_read(&mut victim, signal, liar);
    assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
    assert!(err.to_string().contains("keep-alive"), "{err}");
    // Two periods of keep-alive are a second; the spin would run for 60 s. A bound far from
    // both, for the emulated guest.
    assert!(
        took < Duration::from_secs(20),
        "the read spun {took:?} with a silent peer (keep-alive {period:?}, busy poll {LONG_SPIN:?})"
    );
    println!("the read ended {took:?} after it began: {err}");
}

/// A read timeout shorter than the busy poll ends the read when it runs out: the spin stops
/// at the caller's deadline.
#[test]
fn a_read_timeout_ends_a_longer_busy_poll() {
    let Some(ip) = common::test_ip("a_read_timeout_ends_a_longer_busy_poll") else {
        return;
    };
    let timeout = Duration::from_millis(300);
    let (_listener, mut victim, signal, liar) = long_spin(ip, 7636, None, silent);
    victim.set_read_timeout(Some(timeout)).unwrap();
    let (err, took) = failed_read(&mut victim, signal, liar);
    assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
    assert!(
        took >= timeout,
        "the read timed out after {took:?}, before {timeout:?}"
    );
    assert!(
        took < Duration::from_secs(20),
        "the read spun {took:?} past its timeout of {timeout:?} (busy poll {LONG_SPIN:?})"
    );
    println!("the read timed out after {took:?}: {err}");
}
