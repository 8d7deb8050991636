//! Device tests: two RC queue pairs on one device, connected to each other (loopback), for
//! classic and extended QPs and CQs alike. Every test checks the data that moved, not only
//! the return codes.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use sideway::completion_queue::{
    CompletionQueue, CompletionQueueError, WcFlags, WcFlagsEx, WcOpcode, WcStatus, WorkCompletion,
};
use sideway::device::DeviceContext;
use sideway::memory_region::{AccessFlags, RegisteredBuffer};
use sideway::queue_pair::PostError;
use sideway::queue_pair::{
    ConnectOptions, MaskDiagnosis, QpAttrMask, QpState, QueuePair, QueuePairAttribute, SendData,
    SendFlags,
};

const BUF_LEN: usize = 64 * 1024;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Classic,
    Extended,
}

/// Two connected QPs, `a` and `b`, each with its own CQ and a registered buffer.
struct Pair {
    a: QueuePair,
    b: QueuePair,
    cq_a: Arc<CompletionQueue>,
    cq_b: Arc<CompletionQueue>,
    buf_a: RegisteredBuffer,
    buf_b: RegisteredBuffer,
    _ctx: Arc<DeviceContext>,
}

fn access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

fn new_qp(ctx: &Arc<DeviceContext>, kind: Kind) -> (QueuePair, Arc<CompletionQueue>) {
    let cq = match kind {
        Kind::Classic => ctx.create_cq_builder().cqe(256).build().unwrap(),
        Kind::Extended => ctx.create_cq_builder().cqe(256).build_ex().unwrap(),
    };
    (new_qp_on(ctx, kind, &cq), cq)
}

/// A QP of `kind` whose send and receive CQ is `cq`.
fn new_qp_on(ctx: &Arc<DeviceContext>, kind: Kind, cq: &Arc<CompletionQueue>) -> QueuePair {
    let pd = ctx.alloc_pd().unwrap();
    let mut builder = pd.create_qp_builder();
    builder
        .send_cq(cq)
        .recv_cq(cq)
        .max_send_wr(128)
        .max_recv_wr(128)
        .max_send_sge(4)
        .max_recv_sge(4)
        .max_inline_data(64);
    let qp = match kind {
        Kind::Classic => builder.build().unwrap(),
        Kind::Extended => builder.build_ex().unwrap(),
    };
    assert_eq!(qp.is_extended(), kind == Kind::Extended);
    qp
}

fn options(ctx: &DeviceContext, psn: u32) -> ConnectOptions {
    let mut o = ConnectOptions::new();
    let mtu = ctx.query_port(1).unwrap().active_mtu();
    o.port_num(1)
        .gid_index(common::gid_index(ctx))
        .path_mtu(mtu)
        .sq_psn(psn);
    o
}

fn pair(test: &str, kind: Kind) -> Option<Pair> {
    let ctx = common::device_or_skip(test)?;
    let (a, cq_a) = new_qp(&ctx, kind);
    let (b, cq_b) = new_qp(&ctx, kind);
    let (oa, ob) = (options(&ctx, 0x1234), options(&ctx, 0x5678));
    let ea = a.local_endpoint(&oa).unwrap();
    let eb = b.local_endpoint(&ob).unwrap();
    assert_eq!((ea.qp_num, ea.psn), (a.qp_num(), 0x1234));
    a.connect(&oa, &eb).unwrap();
    b.connect(&ob, &ea).unwrap();
    let buf_a = a.pd().reg_buffer(BUF_LEN, access()).unwrap();
    let buf_b = b.pd().reg_buffer(BUF_LEN, access()).unwrap();
    Some(Pair {
        a,
        b,
        cq_a,
        cq_b,
        buf_a,
        buf_b,
        _ctx: ctx,
    })
}

/// Polls until `n` completions arrived (in batches, with `poll_into`), or fails after 10 s.
fn wait(cq: &CompletionQueue, n: usize) -> Vec<WorkCompletion> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut out = Vec::new();
    let mut batch = [WorkCompletion::default(); 16];
    while out.len() < n {
        let got = cq.poll_into(&mut batch).unwrap();
        out.extend_from_slice(&batch[..got]);
        assert!(
            Instant::now() < deadline,
            "timed out after 10 s waiting for {n} completions; got {}: {out:?}",
            out.len()
        );
    }
    out
}

/// Waits for one successful completion.
fn wait_ok(cq: &CompletionQueue) -> WorkCompletion {
    let wc = wait(cq, 1);
    assert_eq!(wc.len(), 1, "{wc:?}");
    wc[0].ok().unwrap();
    wc[0]
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

macro_rules! both_kinds {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn classic() {
                super::$name(concat!(stringify!($name), "::classic"), super::Kind::Classic)
            }
            #[test]
            fn extended() {
                super::$name(concat!(stringify!($name), "::extended"), super::Kind::Extended)
            }
        }
    )*};
}

both_kinds!(
    connects_to_rts,
    rdma_write,
    rdma_read,
    send_recv,
    immediate_data,
    atomics,
    inline_data,
    sge_lists,
    batch_of_64_writes,
    wrong_rkey_is_a_remote_access_error,
    invalid_requests_post_nothing,
    a_claimed_cq_polls_every_completion,
);

fn connects_to_rts(test: &str, kind: Kind) {
    let Some(p) = pair(test, kind) else { return };
    assert_eq!(p.a.state().unwrap(), QpState::Rts);
    assert_eq!(p.b.state().unwrap(), QpState::Rts);
    let attr =
        p.a.query(QpAttrMask::DEST_QPN | QpAttrMask::SQ_PSN | QpAttrMask::RQ_PSN | QpAttrMask::AV)
            .unwrap();
    assert_eq!(attr.dest_qp_num(), p.b.qp_num());
    assert_eq!(attr.sq_psn(), 0x1234);
    assert_eq!(attr.rq_psn(), 0x5678);
    if !attr.ah_attr().dgid().is_zero() {
        assert!(attr.ah_attr().is_global());
    }
}

fn rdma_write(test: &str, kind: Kind) {
    let Some(mut p) = pair(test, kind) else {
        return;
    };
    let data = pattern(7, 4096);
    p.buf_a.write_at(0, &data).unwrap();
    let (rkey, raddr) = (p.buf_b.rkey(), p.buf_b.addr() + 512);
    let mut batch = p.a.start_post_send();
    batch
        .wr(11, SendFlags::SIGNALED)
        .rdma_write(rkey, raddr, p.buf_a.sge(0..4096).unwrap());
    assert_eq!(batch.len(), 1);
    batch.post().unwrap();
    let wc = wait_ok(&p.cq_a);
    assert_eq!((wc.wr_id(), wc.opcode()), (11, WcOpcode::RdmaWrite));
    assert_eq!(&common::bytes(&p.buf_b)[512..512 + 4096], &data[..]);
    assert!(common::bytes(&p.buf_b)[..512].iter().all(|&b| b == 0));
}

fn rdma_read(test: &str, kind: Kind) {
    let Some(mut p) = pair(test, kind) else {
        return;
    };
    let data = pattern(3, 3000);
    p.buf_b.write_at(100, &data).unwrap();
    let (rkey, raddr) = (p.buf_b.rkey(), p.buf_b.addr() + 100);
    let mut batch = p.a.start_post_send();
    batch
        .wr(5, SendFlags::SIGNALED | SendFlags::FENCE)
        .rdma_read(rkey, raddr, p.buf_a.sge(8192..11192).unwrap());
    batch.post().unwrap();
    let wc = wait_ok(&p.cq_a);
    assert_eq!((wc.wr_id(), wc.opcode()), (5, WcOpcode::RdmaRead));
    assert_eq!(&common::bytes(&p.buf_a)[8192..11192], &data[..]);
}

fn send_recv(test: &str, kind: Kind) {
    let Some(mut p) = pair(test, kind) else {
        return;
    };
    let mut recv = p.b.start_post_recv();
    recv.recv(21, &[p.buf_b.sge(1000..1256).unwrap()]);
    recv.post().unwrap();
    let data = pattern(9, 100);
    p.buf_a.write_at(0, &data).unwrap();
    let mut batch = p.a.start_post_send();
    batch
        .wr(20, SendFlags::SIGNALED | SendFlags::SOLICITED)
        .send(p.buf_a.sge(0..100).unwrap());
    batch.post().unwrap();
    let s = wait_ok(&p.cq_a);
    assert_eq!((s.wr_id(), s.opcode()), (20, WcOpcode::Send));
    let r = wait_ok(&p.cq_b);
    assert_eq!(
        (r.wr_id(), r.opcode(), r.byte_len()),
        (21, WcOpcode::Recv, 100)
    );
    assert_eq!(r.qp_num(), p.b.qp_num());
    assert_eq!(r.imm_data(), None);
    assert_eq!(&common::bytes(&p.buf_b)[1000..1100], &data[..]);
}

fn immediate_data(test: &str, kind: Kind) {
    let Some(mut p) = pair(test, kind) else {
        return;
    };
    let mut recv = p.b.start_post_recv();
    recv.recv(1, &[p.buf_b.sge(0..64).unwrap()]).recv(2, &[]);
    assert_eq!(recv.len(), 2);
    recv.post().unwrap();
    let (rkey, raddr) = (p.buf_b.rkey(), p.buf_b.addr() + 4096);
    p.buf_a.write_at(0, &pattern(1, 32)).unwrap();
    p.buf_a.write_at(32, &pattern(2, 32)).unwrap();
    let mut batch = p.a.start_post_send();
    batch
        .wr(10, SendFlags::SIGNALED)
        .send_with_imm(0xdead_beef, p.buf_a.sge(0..32).unwrap())
        .wr(11, SendFlags::SIGNALED)
        .rdma_write_with_imm(rkey, raddr, 0x1234_5678, p.buf_a.sge(32..64).unwrap());
    batch.post().unwrap();
    let sent = wait(&p.cq_a, 2);
    assert_eq!(sent.len(), 2);
    for wc in &sent {
        wc.ok().unwrap();
    }
    assert_eq!(sent[1].opcode(), WcOpcode::RdmaWrite);
    let got = wait(&p.cq_b, 2);
    assert_eq!(got.len(), 2, "{got:?}");
    let (r1, r2) = (got[0].ok().unwrap(), got[1].ok().unwrap());
    assert_eq!((r1.wr_id(), r1.opcode()), (1, WcOpcode::Recv));
    assert!(r1.wc_flags().contains(WcFlags::WITH_IMM));
    assert_eq!(r1.imm_data(), Some(0xdead_beef));
    assert_eq!(&common::bytes(&p.buf_b)[..32], &pattern(1, 32)[..]);
    assert_eq!((r2.wr_id(), r2.opcode()), (2, WcOpcode::RecvRdmaWithImm));
    assert_eq!(r2.imm_data(), Some(0x1234_5678));
    assert_eq!(r2.byte_len(), 32);
    assert_eq!(&common::bytes(&p.buf_b)[4096..4128], &pattern(2, 32)[..]);
}

/// The atomic's result or target, read in place as a program spinning on it would.
fn read_u64(buf: &RegisteredBuffer, at: usize) -> u64 {
    let in_place = buf.read_volatile::<u64>(at).unwrap();
    let copied = u64::from_ne_bytes(common::bytes(buf)[at..at + 8].try_into().unwrap());
    assert_eq!(in_place, copied, "a volatile read and a copy disagree");
    in_place
}

fn atomics(test: &str, kind: Kind) {
    let Some(mut p) = pair(test, kind) else {
        return;
    };
    p.buf_b.write_at(64, &5u64.to_ne_bytes()).unwrap();
    let (rkey, raddr) = (p.buf_b.rkey(), p.buf_b.addr() + 64);

    // Compare-and-swap that matches: 5 -> 9, old value 5 comes back.
    let mut batch = p.a.start_post_send();
    batch
        .wr(1, SendFlags::SIGNALED)
        .atomic_cmp_swp(rkey, raddr, 5, 9, p.buf_a.sge(0..8).unwrap());
    batch.post().unwrap();
    let wc = wait_ok(&p.cq_a);
    assert_eq!(wc.opcode(), WcOpcode::CompSwap);
    assert_eq!(read_u64(&p.buf_a, 0), 5);
    assert_eq!(read_u64(&p.buf_b, 64), 9);

    // Compare-and-swap that does not match: memory stays 9, old value 9 comes back.
    let mut batch = p.a.start_post_send();
    batch.wr(2, SendFlags::SIGNALED).atomic_cmp_swp(
        rkey,
        raddr,
        5,
        100,
        p.buf_a.sge(8..16).unwrap(),
    );
    batch.post().unwrap();
    wait_ok(&p.cq_a);
    assert_eq!(read_u64(&p.buf_a, 8), 9);
    assert_eq!(read_u64(&p.buf_b, 64), 9);

    // Fetch-and-add: 9 + 3 = 12, old value 9 comes back.
    let mut batch = p.a.start_post_send();
    batch
        .wr(3, SendFlags::SIGNALED)
        .atomic_fetch_add(rkey, raddr, 3, p.buf_a.sge(16..24).unwrap());
    batch.post().unwrap();
    let wc = wait_ok(&p.cq_a);
    assert_eq!(wc.opcode(), WcOpcode::FetchAdd);
    assert_eq!(read_u64(&p.buf_a, 16), 9);
    assert_eq!(read_u64(&p.buf_b, 64), 12);
}

fn inline_data(test: &str, kind: Kind) {
    let Some(mut p) = pair(test, kind) else {
        return;
    };
    let mut recv = p.b.start_post_recv();
    recv.recv(1, &[p.buf_b.sge(0..64).unwrap()])
        .recv(2, &[p.buf_b.sge(64..128).unwrap()]);
    recv.post().unwrap();
    let (rkey, raddr) = (p.buf_b.rkey(), p.buf_b.addr());
    let msg = *b"inline hello";
    let parts: [&[u8]; 3] = [b"one,", b"two,", b"three"];
    let written = pattern(5, 48);
    {
        let mut batch = p.a.start_post_send();
        batch
            .wr(1, SendFlags::SIGNALED)
            .send(&msg)
            .wr(2, SendFlags::SIGNALED)
            .send(&parts[..])
            .wr(3, SendFlags::SIGNALED)
            .rdma_write(rkey, raddr + 1024, &written[..]);
        batch.post().unwrap();
    }
    // The inline bytes may change once posted: the device already has its copy.
    let sent = wait(&p.cq_a, 3);
    assert_eq!(sent.len(), 3);
    for wc in &sent {
        wc.ok().unwrap();
    }
    let got = wait(&p.cq_b, 2);
    assert_eq!(got[0].byte_len(), msg.len() as u32);
    assert_eq!(&common::bytes(&p.buf_b)[..msg.len()], &msg[..]);
    assert_eq!(got[1].byte_len(), 13);
    assert_eq!(&common::bytes(&p.buf_b)[64..64 + 13], b"one,two,three");
    assert_eq!(&common::bytes(&p.buf_b)[1024..1024 + 48], &written[..]);

    // Inline straight from a registered buffer the device may write (no slice is formed).
    p.buf_a.write_at(200, b"from the buffer").unwrap();
    let mut recv = p.b.start_post_recv();
    recv.recv(3, &[p.buf_b.sge(128..192).unwrap()]);
    recv.post().unwrap();
    let mut batch = p.a.start_post_send();
    batch
        .wr(4, SendFlags::SIGNALED)
        .send(p.buf_a.inline(200..215).unwrap());
    batch.post().unwrap();
    wait_ok(&p.cq_a);
    let got = wait(&p.cq_b, 1);
    assert_eq!(got[0].byte_len(), 15);
    assert_eq!(&common::bytes(&p.buf_b)[128..143], b"from the buffer");
    assert!(
        p.buf_a.inline(200..p.buf_a.len() + 1).is_none(),
        "bounds are checked"
    );
}

fn sge_lists(test: &str, kind: Kind) {
    let Some(mut p) = pair(test, kind) else {
        return;
    };
    let data = pattern(11, 1024);
    p.buf_a.write_at(0, &data).unwrap();
    let (rkey, raddr) = (p.buf_b.rkey(), p.buf_b.addr());

    // Equal-length entries from three places: a gathered WRITE lands contiguously, and a
    // gathered SEND scatters into the receive's two entries.
    let equal = [
        p.buf_a.sge(0..20).unwrap(),
        p.buf_a.sge(100..120).unwrap(),
        p.buf_a.sge(500..520).unwrap(),
    ];
    let expect: Vec<u8> = [&data[0..20], &data[100..120], &data[500..520]].concat();
    let mut recv = p.b.start_post_recv();
    recv.recv(
        9,
        &[
            p.buf_b.sge(8000..8025).unwrap(),
            p.buf_b.sge(9000..9100).unwrap(),
        ],
    );
    recv.post().unwrap();
    let mut batch = p.a.start_post_send();
    batch
        .wr(1, SendFlags::SIGNALED)
        .rdma_write(rkey, raddr + 2048, &equal)
        .wr(2, SendFlags::SIGNALED)
        .send(SendData::SgeList(&equal));
    batch.post().unwrap();
    for wc in wait(&p.cq_a, 2) {
        wc.ok().unwrap();
    }
    assert_eq!(&common::bytes(&p.buf_b)[2048..2048 + 60], &expect[..]);
    assert_eq!(common::bytes(&p.buf_b)[2048 + 60], 0);
    let r = wait_ok(&p.cq_b);
    assert_eq!(r.byte_len(), 60);
    assert_eq!(&common::bytes(&p.buf_b)[8000..8025], &expect[..25]);
    assert_eq!(&common::bytes(&p.buf_b)[9000..9035], &expect[25..]);

    // Entries of different lengths.
    let rxe = p.a.pd().context().query_device().unwrap().vendor_id() == RXE_VENDOR_ID;
    if kind == Kind::Extended && rxe {
        println!(
            "{test}: unequal-length lists not checked: rxe's ibv_wr_set_sge_list miscounts \
             them before rdma-core PR 1744"
        );
        return;
    }
    let unequal = [
        p.buf_a.sge(0..10).unwrap(),
        p.buf_a.sge(100..120).unwrap(),
        p.buf_a.sge(500..530).unwrap(),
        p.buf_a.sge(700..701).unwrap(),
    ];
    let expect: Vec<u8> = [
        &data[0..10],
        &data[100..120],
        &data[500..530],
        &data[700..701],
    ]
    .concat();
    let mut batch = p.a.start_post_send();
    batch
        .wr(3, SendFlags::SIGNALED)
        .rdma_write(rkey, raddr + 4096, &unequal);
    batch.post().unwrap();
    wait_ok(&p.cq_a);
    assert_eq!(&common::bytes(&p.buf_b)[4096..4096 + 61], &expect[..]);
    assert_eq!(common::bytes(&p.buf_b)[4096 + 61], 0);
}

/// `vendor_id` of SoftRoCE devices.
const RXE_VENDOR_ID: u32 = 0xff_ffff;

fn batch_of_64_writes(test: &str, kind: Kind) {
    let Some(mut p) = pair(test, kind) else {
        return;
    };
    let data = pattern(13, 64 * 256);
    p.buf_a.write_at(0, &data).unwrap();
    post_writes(&mut p, 64);
    let wcs = wait(&p.cq_a, 64);
    assert_eq!(wcs.len(), 64);
    let mut ids: Vec<u64> = wcs
        .iter()
        .map(|wc| {
            wc.ok().unwrap();
            assert_eq!(wc.opcode(), WcOpcode::RdmaWrite);
            wc.wr_id()
        })
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, (1000..1064).collect::<Vec<u64>>());
    assert_eq!(&common::bytes(&p.buf_b)[..data.len()], &data[..]);
}

/// Posts `n` signaled 256-byte WRITEs from `p.a` to `p.b` (wr_ids 1000, 1001, ...) in one
/// batch, checking that the batch holds all `n`.
fn post_writes(p: &mut Pair, n: usize) {
    let (rkey, base) = (p.buf_b.rkey(), p.buf_b.addr());
    let mut batch = p.a.start_post_send();
    for i in 0..n {
        let sge = p.buf_a.sge(i * 256..(i + 1) * 256).unwrap();
        batch.wr(1000 + i as u64, SendFlags::SIGNALED).rdma_write(
            rkey,
            base + (i * 256) as u64,
            sge,
        );
    }
    assert_eq!(batch.len(), n);
    batch.post().unwrap();
}

fn a_claimed_cq_polls_every_completion(test: &str, kind: Kind) {
    let Some(mut p) = pair(test, kind) else {
        return;
    };
    post_writes(&mut p, 64);
    let mut claim = p.cq_a.claim().unwrap();
    if kind == Kind::Extended {
        assert!(matches!(p.cq_a.poll(), Err(CompletionQueueError::Busy)));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut ids = Vec::new();
    let mut five = [WorkCompletion::default(); 5];
    while ids.len() < 64 {
        // Both ways of polling a claim, in turn.
        let got = claim.poll_into(&mut five).unwrap();
        ids.extend(five[..got].iter().map(|wc| {
            wc.ok().unwrap();
            wc.wr_id()
        }));
        for wc in claim.poll().unwrap() {
            wc.ok().unwrap();
            assert_eq!(wc.opcode(), WcOpcode::RdmaWrite);
            ids.push(wc.wr_id());
        }
        assert!(
            Instant::now() < deadline,
            "timed out after 10 s; got {ids:?}"
        );
    }
    ids.sort_unstable();
    assert_eq!(ids, (1000..1064).collect::<Vec<u64>>());
    drop(claim);
    assert!(p.cq_a.poll().is_ok(), "the claim is released");
}

#[test]
fn completion_timestamps_are_read_on_the_poller() {
    let test = "completion_timestamps_are_read_on_the_poller";
    let Some(ctx) = common::device_or_skip(test) else {
        return;
    };
    let flags = WcFlagsEx::default_ex() | WcFlagsEx::COMPLETION_TIMESTAMP;
    let cq = match ctx.create_cq_builder().cqe(256).wc_flags(flags).build_ex() {
        Ok(cq) => cq,
        Err(e) => {
            println!(
                "skipped: {test}: {} makes no CQ with completion timestamps: {e}",
                ctx.name()
            );
            return;
        }
    };
    let a = new_qp_on(&ctx, Kind::Extended, &cq);
    let (b, cq_b) = new_qp(&ctx, Kind::Extended);
    let (oa, ob) = (options(&ctx, 1), options(&ctx, 2));
    let (ea, eb) = (
        a.local_endpoint(&oa).unwrap(),
        b.local_endpoint(&ob).unwrap(),
    );
    a.connect(&oa, &eb).unwrap();
    b.connect(&ob, &ea).unwrap();
    let buf_a = a.pd().reg_buffer(BUF_LEN, access()).unwrap();
    let buf_b = b.pd().reg_buffer(BUF_LEN, access()).unwrap();
    let mut p = Pair {
        a,
        b,
        cq_a: Arc::clone(&cq),
        cq_b,
        buf_a,
        buf_b,
        _ctx: ctx,
    };
    post_writes(&mut p, 4);
    let mut claim = cq.claim().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut stamps = Vec::new();
    while stamps.len() < 4 {
        let mut poller = claim.poll().unwrap();
        assert_eq!(
            poller.completion_timestamp(),
            None,
            "no completion returned yet"
        );
        while let Some(wc) = poller.next() {
            wc.ok().unwrap();
            let ts = poller.completion_timestamp();
            assert!(ts.is_some(), "completion {} has no timestamp", wc.wr_id());
            stamps.push((wc.wr_id(), ts));
        }
        assert_eq!(poller.completion_timestamp(), None, "the poller ran out");
        assert!(
            Instant::now() < deadline,
            "timed out after 10 s; got {stamps:?}"
        );
    }
    let ids: Vec<u64> = stamps.iter().map(|&(id, _)| id).collect();
    assert_eq!(ids, [1000, 1001, 1002, 1003], "{stamps:?}");
}

fn wrong_rkey_is_a_remote_access_error(test: &str, kind: Kind) {
    let Some(mut p) = pair(test, kind) else {
        return;
    };
    let bad_rkey = p.buf_b.rkey() ^ 0x00ff_ff00;
    let mut batch = p.a.start_post_send();
    batch.wr(77, SendFlags::SIGNALED).rdma_write(
        bad_rkey,
        p.buf_b.addr(),
        p.buf_a.sge(0..64).unwrap(),
    );
    batch.post().unwrap();
    let wc = wait(&p.cq_a, 1);
    assert_eq!(wc[0].wr_id(), 77);
    assert_eq!(wc[0].status(), WcStatus::RemAccessErr, "{wc:?}");
    let err = wc[0].ok().unwrap_err();
    assert_eq!(err.status, WcStatus::RemAccessErr);
    assert!(err.to_string().contains("remote key"), "{err}");
    assert!(common::bytes(&p.buf_b)[..64].iter().all(|&b| b == 0));
}

fn invalid_requests_post_nothing(test: &str, kind: Kind) {
    let Some(mut p) = pair(test, kind) else {
        return;
    };
    let five = [p.buf_a.sge(0..8).unwrap(); 5];
    let (rkey, raddr) = (p.buf_b.rkey(), p.buf_b.addr());
    p.buf_a.write_at(0, &[0xAA; 8]).unwrap();
    let mut batch = p.a.start_post_send();
    batch
        .wr(1, SendFlags::SIGNALED)
        .rdma_write(rkey, raddr, p.buf_a.sge(0..8).unwrap())
        .wr(2, SendFlags::SIGNALED)
        .rdma_write(rkey, raddr, &five);
    match batch.post() {
        Err(PostError::Invalid { index, wr_id, .. }) => assert_eq!((index, wr_id), (1, 2)),
        other => panic!("expected an invalid request, got {other:?}"),
    }
    let too_long = [0u8; 65];
    let mut batch = p.a.start_post_send();
    batch.wr(3, SendFlags::SIGNALED).send(&too_long);
    let err = batch.post().unwrap_err();
    assert!(err.to_string().contains("65 bytes of inline data"), "{err}");
    let mut batch = p.a.start_post_send();
    batch
        .wr(4, SendFlags::SIGNALED)
        .rdma_read(rkey, raddr, &b"no inline reads"[..]);
    assert!(batch
        .post()
        .unwrap_err()
        .to_string()
        .contains("cannot take inline"));
    // A dropped guard posts nothing either.
    {
        let mut batch = p.a.start_post_send();
        batch
            .wr(5, SendFlags::SIGNALED)
            .rdma_write(rkey, raddr, p.buf_a.sge(0..8).unwrap());
    }
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        p.cq_a
            .poll_into(&mut [WorkCompletion::default(); 4])
            .unwrap(),
        0
    );
    assert!(common::bytes(&p.buf_b)[..8].iter().all(|&b| b == 0));
    // The QP still works.
    let mut batch = p.a.start_post_send();
    batch
        .wr(6, SendFlags::SIGNALED)
        .rdma_write(rkey, raddr, p.buf_a.sge(0..8).unwrap());
    batch.post().unwrap();
    assert_eq!(wait_ok(&p.cq_a).wr_id(), 6);
    assert_eq!(&common::bytes(&p.buf_b)[..8], &[0xAA; 8]);
}

#[test]
fn bad_modify_names_the_missing_attributes() {
    let Some(ctx) = common::device_or_skip("bad_modify_names_the_missing_attributes") else {
        return;
    };
    for kind in [Kind::Classic, Kind::Extended] {
        let (qp, _cq) = new_qp(&ctx, kind);
        let mut init = QueuePairAttribute::new();
        init.set_qp_state(QpState::Init)
            .set_pkey_index(0)
            .set_port_num(1)
            .set_qp_access_flags(access());
        qp.modify(&init).unwrap();
        assert_eq!(qp.state().unwrap(), QpState::Init);

        let mut rtr = QueuePairAttribute::new();
        rtr.set_qp_state(QpState::Rtr)
            .set_path_mtu(sideway::device::Mtu::Mtu1024)
            .set_port_num(1);
        let err = qp.modify(&rtr).unwrap_err();
        assert_eq!(err.source.raw_os_error(), Some(libc_einval()), "{err}");
        assert_eq!((err.from, err.to), (QpState::Init, QpState::Rtr));
        assert_eq!(
            err.diagnosis,
            Some(MaskDiagnosis::Attributes {
                missing: QpAttrMask::AV
                    | QpAttrMask::RQ_PSN
                    | QpAttrMask::MIN_RNR_TIMER
                    | QpAttrMask::MAX_DEST_RD_ATOMIC
                    | QpAttrMask::DEST_QPN,
                not_allowed: QpAttrMask::PORT,
            })
        );
        let text = err.to_string();
        assert_eq!(
            text,
            format!(
                "failed to modify QP {:#x} from Init to RTR: missing attributes Av, RqPsn, \
                 MinRnrTimer, MaxDestRdAtomic, DestQpn; Port is not allowed here (EINVAL)",
                qp.qp_num()
            )
        );
        // The failed modify left the QP where it was.
        assert_eq!(qp.state().unwrap(), QpState::Init);

        // Connecting a QP that is not in Reset says which step failed, and why.
        let mut to_err = QueuePairAttribute::new();
        to_err.set_qp_state(QpState::Err);
        qp.modify(&to_err).unwrap();
        let opts = options(&ctx, 1);
        let me = qp.local_endpoint(&opts).unwrap();
        let err = qp.connect(&opts, &me).unwrap_err().to_string();
        assert!(err.contains("step 1/3 (Reset to Init)"), "{err}");
        assert!(
            err.contains("an RC QP has no transition from Error to Init"),
            "{err}"
        );
    }
}

fn libc_einval() -> i32 {
    22 // EINVAL on every Linux architecture
}

/// UC and UD QPs: the builder and connect() take them too (RC is the one the rest covers).
#[test]
fn uc_writes_land_and_ud_reaches_rts() {
    use sideway::queue_pair::{QpType, SendOpsFlags};
    let Some(ctx) = common::device_or_skip("uc_writes_land_and_ud_reaches_rts") else {
        return;
    };
    for kind in [Kind::Classic, Kind::Extended] {
        let build = |qp_type, ops| {
            let pd = ctx.alloc_pd().unwrap();
            let cq = match kind {
                Kind::Classic => ctx.create_cq_builder().build().unwrap(),
                Kind::Extended => ctx.create_cq_builder().build_ex().unwrap(),
            };
            let mut b = pd.create_qp_builder();
            b.send_cq(&cq)
                .recv_cq(&cq)
                .qp_type(qp_type)
                .send_ops_flags(ops);
            let qp = match kind {
                Kind::Classic => b.build().unwrap(),
                Kind::Extended => b.build_ex().unwrap(),
            };
            assert_eq!(qp.qp_type(), qp_type);
            (qp, cq)
        };
        let uc_ops = SendOpsFlags::RDMA_WRITE | SendOpsFlags::SEND;
        let (mut a, cq_a) = build(QpType::Uc, uc_ops);
        let (b, _cq_b) = build(QpType::Uc, uc_ops);
        let (oa, ob) = (options(&ctx, 1), options(&ctx, 2));
        let (ea, eb) = (
            a.local_endpoint(&oa).unwrap(),
            b.local_endpoint(&ob).unwrap(),
        );
        a.connect(&oa, &eb).unwrap();
        b.connect(&ob, &ea).unwrap();
        assert_eq!(a.state().unwrap(), QpState::Rts);
        let mut src = a.pd().reg_buffer(4096, access()).unwrap();
        let dst = b.pd().reg_buffer(4096, access()).unwrap();
        src.write_at(0, &pattern(17, 256)).unwrap();
        let mut batch = a.start_post_send();
        batch.wr(1, SendFlags::SIGNALED).rdma_write(
            dst.rkey(),
            dst.addr(),
            src.sge(0..256).unwrap(),
        );
        batch.post().unwrap();
        wait_ok(&cq_a);
        // UC has no acknowledgements: the sender's completion does not prove arrival.
        let deadline = Instant::now() + Duration::from_secs(10);
        while common::bytes(&dst)[..256] != pattern(17, 256)[..] {
            assert!(Instant::now() < deadline, "UC write did not land in 10 s");
            std::thread::sleep(Duration::from_millis(1));
        }

        let (ud, _cq) = build(QpType::Ud, SendOpsFlags::SEND);
        let mut opts = options(&ctx, 3);
        opts.qkey(0x1234_5678);
        ud.connect(&opts, &Default::default()).unwrap();
        let attr = ud.query(QpAttrMask::STATE | QpAttrMask::QKEY).unwrap();
        assert_eq!((attr.qp_state(), attr.qkey()), (QpState::Rts, 0x1234_5678));
    }
}
