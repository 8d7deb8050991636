//! Device tests: RDMA WRITE between two RC QPs of one device, through the raw bindings.
//!
//! Each test starts with [`open_test_device`]: with no RDMA device and `RDMA_TEST_DEVICE`
//! unset it prints `skipped: <reason>` and the test returns; with `RDMA_TEST_DEVICE` set, a
//! missing library or device fails the test. On RoCE the address vector uses the GID index
//! in `RDMA_TEST_GID_INDEX` (default 1, the IPv4-mapped RoCE v2 GID of a SoftRoCE device).
//!
//! The tests own every verbs object through small guards whose `Drop` destroys it, so a
//! failing assertion still releases the device.

use std::env;
use std::ffi::{c_int, CStr};
use std::io;
use std::ptr;
use std::thread;
use std::time::{Duration, Instant};

use rdma_mummy_sys::*;

/// How long a test waits for its completion before failing.
const COMPLETION_TIMEOUT: Duration = Duration::from_secs(10);
const PORT: u8 = 1;
const MESSAGE_LEN: usize = 4096;

fn errno_text() -> String {
    io::Error::last_os_error().to_string()
}

fn errno_value(rc: c_int) -> String {
    io::Error::from_raw_os_error(rc).to_string()
}

/// An open device context; closes it on drop.
struct Device {
    ctx: *mut ibv_context,
    name: String,
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: ctx came from ibv_open_device and every child object is dropped first
        // (the guards below borrow the Device).
        unsafe { ibv_close_device(self.ctx) };
    }
}

/// Opens the device under test, or says why the test is skipped (`None`).
fn open_test_device() -> Option<Device> {
    let wanted = env::var("RDMA_TEST_DEVICE").ok().filter(|v| !v.is_empty());
    let skip_or_fail = |reason: String| -> Option<Device> {
        match &wanted {
            Some(name) => panic!("RDMA_TEST_DEVICE={name} is set, but {reason}"),
            None => {
                println!("skipped: {reason}");
                None
            }
        }
    };
    if let Err(e) = Library::Ibverbs.load() {
        return skip_or_fail(e.to_string());
    }
    let mut num: c_int = 0;
    // SAFETY: num is a valid out-pointer; the list is freed below.
    let list = unsafe { ibv_get_device_list(&mut num) };
    if list.is_null() {
        return skip_or_fail(format!(
            "no RDMA devices (ibv_get_device_list: {})",
            errno_text()
        ));
    }
    let mut names = Vec::new();
    let mut chosen = None;
    for i in 0..usize::try_from(num).unwrap_or(0) {
        // SAFETY: the list holds num valid device pointers.
        let dev = unsafe { *list.add(i) };
        // SAFETY: dev is a valid device; the name is a NUL-terminated string it owns.
        let name = unsafe { CStr::from_ptr(ibv_get_device_name(dev)) }
            .to_string_lossy()
            .into_owned();
        if chosen.is_none() && wanted.as_deref().is_none_or(|w| w == name) {
            chosen = Some((dev, name.clone()));
        }
        names.push(name);
    }
    let result = match chosen {
        Some((dev, name)) => {
            // SAFETY: dev is valid until the list is freed; an opened context outlives it.
            let ctx = unsafe { ibv_open_device(dev) };
            if ctx.is_null() {
                panic!("ibv_open_device({name}) failed: {}", errno_text());
            }
            Some(Device { ctx, name })
        }
        None if names.is_empty() => None,
        None => {
            // SAFETY: list came from ibv_get_device_list.
            unsafe { ibv_free_device_list(list) };
            panic!(
                "RDMA_TEST_DEVICE={} not found; devices: {names:?}",
                wanted.unwrap_or_default()
            );
        }
    };
    // SAFETY: list came from ibv_get_device_list; opened contexts stay valid.
    unsafe { ibv_free_device_list(list) };
    result.or_else(|| skip_or_fail("no RDMA devices".to_owned()))
}

/// What the address vector needs to reach a QP of this port.
struct PortInfo {
    lid: u16,
    mtu: ibv_mtu::Type,
    /// `Some((gid_index, gid))` on RoCE, where routing is by GID.
    gid: Option<(u8, ibv_gid)>,
}

fn query_port(dev: &Device) -> PortInfo {
    let mut attr = ibv_port_attr::default();
    // SAFETY: ctx is open and attr is a valid ibv_port_attr (verbs.h's ibv_query_port).
    let rc = unsafe { ibv_query_port(dev.ctx, PORT, &mut attr) };
    assert_eq!(
        rc,
        0,
        "ibv_query_port({}, {PORT}): {}",
        dev.name,
        errno_value(rc)
    );
    assert_eq!(
        attr.state,
        ibv_port_state::IBV_PORT_ACTIVE,
        "port {PORT} of {} is not active",
        dev.name
    );
    let gid = if u32::from(attr.link_layer) == IBV_LINK_LAYER_ETHERNET {
        let index: u8 = env::var("RDMA_TEST_GID_INDEX")
            .ok()
            .map(|v| v.parse().expect("RDMA_TEST_GID_INDEX is a small integer"))
            .unwrap_or(1);
        let mut gid = ibv_gid::default();
        // SAFETY: ctx is open and gid is a valid out-parameter.
        let rc = unsafe { ibv_query_gid(dev.ctx, PORT, c_int::from(index), &mut gid) };
        assert_eq!(rc, 0, "ibv_query_gid(index {index}): {}", errno_text());
        Some((index, gid))
    } else {
        None
    };
    PortInfo {
        lid: attr.lid,
        // 1024 bytes is enough for the test and accepted by every device.
        mtu: attr.active_mtu.min(ibv_mtu::IBV_MTU_1024),
        gid,
    }
}

/// A protection domain plus one registered buffer: the first half is the source of the
/// write, the second half its destination.
struct Memory<'d> {
    _dev: &'d Device,
    pd: *mut ibv_pd,
    mr: *mut ibv_mr,
    buf: Box<[u8]>,
}

impl<'d> Memory<'d> {
    fn new(dev: &'d Device) -> Self {
        // SAFETY: ctx is open.
        let pd = unsafe { ibv_alloc_pd(dev.ctx) };
        assert!(!pd.is_null(), "ibv_alloc_pd: {}", errno_text());
        let mut buf = vec![0u8; 2 * MESSAGE_LEN].into_boxed_slice();
        for (i, b) in buf[..MESSAGE_LEN].iter_mut().enumerate() {
            *b = (i * 7 + 3) as u8;
        }
        let access =
            ibv_access_flags::IBV_ACCESS_LOCAL_WRITE | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE;
        // SAFETY: pd is valid; buf stays allocated (and unmoved: a boxed slice) until the
        // MR is deregistered in Drop.
        let mr = unsafe { ibv_reg_mr(pd, buf.as_mut_ptr().cast(), buf.len(), access as c_int) };
        if mr.is_null() {
            let err = errno_text();
            // SAFETY: pd is valid and unused.
            unsafe { ibv_dealloc_pd(pd) };
            panic!("ibv_reg_mr: {err}");
        }
        Memory {
            _dev: dev,
            pd,
            mr,
            buf,
        }
    }

    fn source(&self) -> u64 {
        self.buf.as_ptr() as u64
    }

    fn destination(&self) -> u64 {
        self.source() + MESSAGE_LEN as u64
    }

    fn lkey(&self) -> u32 {
        // SAFETY: mr is a live MR.
        unsafe { (*self.mr).lkey }
    }

    fn rkey(&self) -> u32 {
        // SAFETY: mr is a live MR.
        unsafe { (*self.mr).rkey }
    }

    /// Checks that the destination half now equals the source half.
    fn assert_written(&self) {
        // The device wrote the destination behind the compiler's back; read it through a
        // volatile copy so no earlier read can be reused.
        let written: Vec<u8> = (0..MESSAGE_LEN)
            // SAFETY: the index is inside buf, which is live and initialised.
            .map(|i| unsafe { ptr::read_volatile(self.buf.as_ptr().add(MESSAGE_LEN + i)) })
            .collect();
        assert!(
            written == self.buf[..MESSAGE_LEN],
            "destination differs from source after the RDMA WRITE"
        );
    }
}

impl Drop for Memory<'_> {
    fn drop(&mut self) {
        // SAFETY: mr and pd are live; the QPs using them were destroyed first (they borrow
        // this Memory).
        unsafe {
            ibv_dereg_mr(self.mr);
            ibv_dealloc_pd(self.pd);
        }
    }
}

/// A QP and its CQ (classic or extended), destroyed on drop, QP first.
struct QueuePair<'m> {
    _mem: &'m Memory<'m>,
    qp: *mut ibv_qp,
    cq: *mut ibv_cq,
}

impl Drop for QueuePair<'_> {
    fn drop(&mut self) {
        // SAFETY: qp and cq are live and nothing else uses them.
        unsafe {
            ibv_destroy_qp(self.qp);
            ibv_destroy_cq(self.cq);
        }
    }
}

fn qp_caps() -> ibv_qp_cap {
    ibv_qp_cap {
        max_send_wr: 8,
        max_recv_wr: 8,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

/// A classic CQ and RC QP (`ibv_create_cq`, `ibv_create_qp`).
fn classic_qp<'m>(dev: &Device, mem: &'m Memory<'m>) -> QueuePair<'m> {
    // SAFETY: ctx is open; no channel, no context pointer.
    let cq = unsafe { ibv_create_cq(dev.ctx, 16, ptr::null_mut(), ptr::null_mut(), 0) };
    assert!(!cq.is_null(), "ibv_create_cq: {}", errno_text());
    let mut attr = ibv_qp_init_attr {
        send_cq: cq,
        recv_cq: cq,
        cap: qp_caps(),
        qp_type: ibv_qp_type::IBV_QPT_RC,
        ..Default::default()
    };
    // SAFETY: pd is live and attr fully initialised.
    let qp = unsafe { ibv_create_qp(mem.pd, &mut attr) };
    if qp.is_null() {
        let err = errno_text();
        // SAFETY: cq is live and unused.
        unsafe { ibv_destroy_cq(cq) };
        panic!("ibv_create_qp: {err}");
    }
    QueuePair { _mem: mem, qp, cq }
}

/// An extended CQ and an extended RC QP able to post RDMA WRITEs through `ibv_wr_*`.
fn extended_qp<'m>(dev: &Device, mem: &'m Memory<'m>) -> (QueuePair<'m>, *mut ibv_cq_ex) {
    let mut cq_attr = ibv_cq_init_attr_ex {
        cqe: 16,
        wc_flags: u64::from(
            ibv_create_cq_wc_flags::IBV_WC_EX_WITH_BYTE_LEN
                | ibv_create_cq_wc_flags::IBV_WC_EX_WITH_QP_NUM,
        ),
        ..Default::default()
    };
    // SAFETY: ctx is open and cq_attr fully initialised (shim-compiled static inline).
    let cq_ex = unsafe { ibv_create_cq_ex(dev.ctx, &mut cq_attr) };
    assert!(!cq_ex.is_null(), "ibv_create_cq_ex: {}", errno_text());
    // SAFETY: cq_ex is a live extended CQ.
    let cq = unsafe { ibv_cq_ex_to_cq(cq_ex) };
    let mut attr = ibv_qp_init_attr_ex {
        send_cq: cq,
        recv_cq: cq,
        cap: qp_caps(),
        qp_type: ibv_qp_type::IBV_QPT_RC,
        comp_mask: ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD
            | ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
        pd: mem.pd,
        send_ops_flags: u64::from(ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_RDMA_WRITE),
        ..Default::default()
    };
    // SAFETY: ctx is open and attr names a live PD and CQ.
    let qp = unsafe { ibv_create_qp_ex(dev.ctx, &mut attr) };
    if qp.is_null() {
        let err = errno_text();
        // SAFETY: cq is live and unused.
        unsafe { ibv_destroy_cq(cq) };
        panic!("ibv_create_qp_ex: {err}");
    }
    (QueuePair { _mem: mem, qp, cq }, cq_ex)
}

fn modify(qp: &QueuePair<'_>, attr: &mut ibv_qp_attr, mask: ibv_qp_attr_mask::Type, step: &str) {
    // SAFETY: qp is live and attr valid for the fields mask names.
    let rc = unsafe { ibv_modify_qp(qp.qp, attr, mask as c_int) };
    assert_eq!(rc, 0, "ibv_modify_qp to {step}: {}", errno_value(rc));
}

/// Moves `qp` through INIT, RTR and RTS, connected to the QP numbered `remote_qpn`.
fn connect(qp: &QueuePair<'_>, port: &PortInfo, remote_qpn: u32) {
    use ibv_qp_attr_mask::*;
    let mut init = ibv_qp_attr {
        qp_state: ibv_qp_state::IBV_QPS_INIT,
        pkey_index: 0,
        port_num: PORT,
        qp_access_flags: ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE,
        ..Default::default()
    };
    modify(
        qp,
        &mut init,
        IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
        "INIT",
    );

    let mut ah = ibv_ah_attr {
        dlid: port.lid,
        port_num: PORT,
        ..Default::default()
    };
    if let Some((index, gid)) = port.gid {
        ah.is_global = 1;
        ah.grh = ibv_global_route {
            dgid: gid,
            sgid_index: index,
            hop_limit: 1,
            ..Default::default()
        };
    }
    let mut rtr = ibv_qp_attr {
        qp_state: ibv_qp_state::IBV_QPS_RTR,
        path_mtu: port.mtu,
        dest_qp_num: remote_qpn,
        rq_psn: 0,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        ah_attr: ah,
        ..Default::default()
    };
    modify(
        qp,
        &mut rtr,
        IBV_QP_STATE
            | IBV_QP_AV
            | IBV_QP_PATH_MTU
            | IBV_QP_DEST_QPN
            | IBV_QP_RQ_PSN
            | IBV_QP_MAX_DEST_RD_ATOMIC
            | IBV_QP_MIN_RNR_TIMER,
        "RTR",
    );

    let mut rts = ibv_qp_attr {
        qp_state: ibv_qp_state::IBV_QPS_RTS,
        timeout: 14,
        retry_cnt: 7,
        // 7 means "retry forever", which can hang rxe; 6 is plenty for a loopback.
        rnr_retry: 6,
        sq_psn: 0,
        max_rd_atomic: 1,
        ..Default::default()
    };
    modify(
        qp,
        &mut rts,
        IBV_QP_STATE
            | IBV_QP_TIMEOUT
            | IBV_QP_RETRY_CNT
            | IBV_QP_RNR_RETRY
            | IBV_QP_SQ_PSN
            | IBV_QP_MAX_QP_RD_ATOMIC,
        "RTS",
    );
}

fn qp_num(qp: &QueuePair<'_>) -> u32 {
    // SAFETY: qp is live.
    unsafe { (*qp.qp).qp_num }
}

/// Fails the test once the deadline passes; otherwise yields briefly (the device is
/// emulated, so a busy loop would slow it down).
fn wait_or_fail(deadline: Instant, what: &str) {
    assert!(
        Instant::now() < deadline,
        "no completion for the {what} within {COMPLETION_TIMEOUT:?}"
    );
    thread::sleep(Duration::from_millis(1));
}

#[test]
fn rdma_write_through_extended_qp_and_cq() {
    let Some(dev) = open_test_device() else {
        return;
    };
    let port = query_port(&dev);

    let mut attr = ibv_device_attr_ex::default();
    // SAFETY: ctx is open; NULL input is what verbs.h passes for "no input".
    let rc = unsafe { ibv_query_device_ex(dev.ctx, ptr::null(), &mut attr) };
    assert_eq!(rc, 0, "ibv_query_device_ex: {}", errno_value(rc));
    assert!(attr.orig_attr.phys_port_cnt >= PORT);

    let mem = Memory::new(&dev);
    let (sender, cq_ex) = extended_qp(&dev, &mem);
    let receiver = classic_qp(&dev, &mem);
    connect(&sender, &port, qp_num(&receiver));
    connect(&receiver, &port, qp_num(&sender));

    // SAFETY: sender.qp was created with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS.
    let qpx = unsafe { ibv_qp_to_qp_ex(sender.qp) };
    assert!(!qpx.is_null(), "ibv_qp_to_qp_ex returned NULL");
    // SAFETY: qpx is the live extended QP, RDMA WRITE was requested in send_ops_flags, the
    // calls follow the start/op/setter/complete order, and the SGE and remote address lie in
    // mem's registered buffer, which outlives the completion.
    let rc = unsafe {
        ibv_wr_start(qpx);
        (*qpx).wr_id = 0x5157;
        (*qpx).wr_flags = ibv_send_flags::IBV_SEND_SIGNALED;
        ibv_wr_rdma_write(qpx, mem.rkey(), mem.destination());
        ibv_wr_set_sge(qpx, mem.lkey(), mem.source(), MESSAGE_LEN as u32);
        ibv_wr_complete(qpx)
    };
    assert_eq!(rc, 0, "ibv_wr_complete: {}", errno_value(rc));

    let deadline = Instant::now() + COMPLETION_TIMEOUT;
    loop {
        let mut poll_attr = ibv_poll_cq_attr::default();
        // SAFETY: cq_ex is live and only this thread polls it.
        let rc = unsafe { ibv_start_poll(cq_ex, &mut poll_attr) };
        if rc == ENOENT as c_int {
            wait_or_fail(deadline, "extended RDMA WRITE");
            continue;
        }
        assert_eq!(rc, 0, "ibv_start_poll: {}", errno_value(rc));
        // SAFETY: start_poll returned 0, so cq_ex is positioned on a completion until
        // end_poll; the CQ was created with BYTE_LEN and QP_NUM.
        let (status, wr_id, opcode, qpn) = unsafe {
            let completion = (
                (*cq_ex).status,
                (*cq_ex).wr_id,
                ibv_wc_read_opcode(cq_ex),
                ibv_wc_read_qp_num(cq_ex),
            );
            ibv_end_poll(cq_ex);
            completion
        };
        assert_eq!(
            status,
            ibv_wc_status::IBV_WC_SUCCESS,
            "completion status {status}"
        );
        assert_eq!(wr_id, 0x5157);
        assert_eq!(opcode, ibv_wc_opcode::IBV_WC_RDMA_WRITE);
        assert_eq!(qpn, qp_num(&sender));
        break;
    }
    mem.assert_written();
}

#[test]
fn rdma_write_through_classic_qp_and_cq() {
    let Some(dev) = open_test_device() else {
        return;
    };
    let port = query_port(&dev);
    let mem = Memory::new(&dev);
    let sender = classic_qp(&dev, &mem);
    let receiver = classic_qp(&dev, &mem);
    connect(&sender, &port, qp_num(&receiver));
    connect(&receiver, &port, qp_num(&sender));

    let mut sge = ibv_sge {
        addr: mem.source(),
        length: MESSAGE_LEN as u32,
        lkey: mem.lkey(),
    };
    let mut wr = ibv_send_wr {
        wr_id: 0x7e57,
        sg_list: &mut sge,
        num_sge: 1,
        opcode: ibv_wr_opcode::IBV_WR_RDMA_WRITE,
        send_flags: ibv_send_flags::IBV_SEND_SIGNALED,
        ..Default::default()
    };
    wr.wr.rdma = ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
        remote_addr: mem.destination(),
        rkey: mem.rkey(),
    };
    let mut bad: *mut ibv_send_wr = ptr::null_mut();
    // SAFETY: sender is a live RTS QP; wr is one fully initialised request whose SGE and
    // remote address lie in mem's registered buffer, which outlives the completion.
    let rc = unsafe { ibv_post_send(sender.qp, &mut wr, &mut bad) };
    assert_eq!(rc, 0, "ibv_post_send: {}", errno_value(rc));

    let deadline = Instant::now() + COMPLETION_TIMEOUT;
    let mut wc = ibv_wc::default();
    loop {
        // SAFETY: sender.cq is live and wc has room for one entry.
        let n = unsafe { ibv_poll_cq(sender.cq, 1, &mut wc) };
        assert!(n >= 0, "ibv_poll_cq returned {n}");
        if n == 1 {
            break;
        }
        wait_or_fail(deadline, "classic RDMA WRITE");
    }
    assert_eq!(
        wc.status,
        ibv_wc_status::IBV_WC_SUCCESS,
        "completion status {}",
        wc.status
    );
    assert_eq!(wc.wr_id, 0x7e57);
    assert_eq!(wc.opcode, ibv_wc_opcode::IBV_WC_RDMA_WRITE);
    assert_eq!(wc.qp_num, qp_num(&sender));
    mem.assert_written();
}
