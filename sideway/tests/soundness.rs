//! Device tests of the memory rule (`sideway::memory_region`): registered memory outlives its
//! registration, a registration outlives every window bound to it, and a failed
//! deregistration leaks the memory instead of freeing it.
//!
//! Each test registers memory through `reg_buffer_owned` with an owner that records when it
//! is freed, so the tests see exactly when the memory goes, and a loopback RC pair on one
//! device plays the peer that WRITEs and READs it through its rkey.

mod common;
#[path = "common/pairs.rs"]
mod pairs;

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use sideway::completion_queue::{CompletionQueue, WcStatus};
use sideway::device::{DeviceCapFlags, DeviceContext};
use sideway::memory_region::{leaked_memory, AccessFlags, RegisteredBuffer};
use sideway::memory_window::MwType;
use sideway::protection_domain::ProtectionDomain;
use sideway::queue_pair::{QueuePair, SendFlags};

/// Heap memory that says when it is freed.
struct Tracked {
    ptr: NonNull<u8>,
    len: usize,
    freed: Arc<AtomicBool>,
}

// SAFETY: the memory is owned exclusively; the tests only free it (drop).
unsafe impl Send for Tracked {}
// SAFETY: `&Tracked` gives no access to the bytes.
unsafe impl Sync for Tracked {}

impl Drop for Tracked {
    fn drop(&mut self) {
        let slice = std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len);
        // SAFETY: made by Box::into_raw of a boxed slice of this length, freed once here.
        drop(unsafe { Box::from_raw(slice) });
        self.freed.store(true, Ordering::SeqCst);
    }
}

/// `len` zeroed bytes registered with `access`, and the flag their owner sets when freed.
fn tracked(
    pd: &Arc<ProtectionDomain>,
    len: usize,
    access: AccessFlags,
) -> (RegisteredBuffer, Arc<AtomicBool>) {
    let raw = Box::into_raw(vec![0u8; len].into_boxed_slice());
    let ptr = NonNull::new(raw.cast::<u8>()).unwrap();
    let freed = Arc::new(AtomicBool::new(false));
    let owner = Tracked {
        ptr,
        len,
        freed: Arc::clone(&freed),
    };
    // SAFETY: the memory is len initialised bytes at a fixed address, owned by `owner` alone
    // and freed only when it drops.
    let buf = unsafe { pd.reg_buffer_owned(owner, ptr, len, access) }.unwrap();
    (buf, freed)
}

struct Rc {
    a: QueuePair,
    b: QueuePair,
    cq_a: Arc<CompletionQueue>,
    cq_b: Arc<CompletionQueue>,
}

fn rc_pair(ctx: &Arc<DeviceContext>, pd: &Arc<ProtectionDomain>) -> Rc {
    let cq_a = ctx.create_cq_builder().cqe(64).build().unwrap();
    let cq_b = ctx.create_cq_builder().cqe(64).build().unwrap();
    let new = |cq: &Arc<CompletionQueue>| {
        let mut b = pd.create_qp_builder();
        b.send_cq(cq).recv_cq(cq).max_send_wr(16).max_recv_wr(16);
        b.build().unwrap()
    };
    let (a, b) = (new(&cq_a), new(&cq_b));
    pairs::connect(ctx, &a, &b);
    Rc { a, b, cq_a, cq_b }
}

/// The peer (QP b) WRITEs `data` to `addr` through `rkey`, then READs it back from there
/// into its own buffer: the status of each, and what came back.
fn peer_write_then_read(
    rc: &mut Rc,
    pd: &Arc<ProtectionDomain>,
    rkey: u32,
    addr: u64,
    data: &[u8; 8],
) -> (WcStatus, WcStatus, Vec<u8>) {
    let mut local = pd.reg_buffer(64, AccessFlags::LOCAL_WRITE).unwrap();
    local.write_at(0, data).unwrap();
    let mut s = rc.b.start_post_send();
    s.wr(1, SendFlags::SIGNALED)
        .rdma_write(rkey, addr, local.sge(0..8).unwrap());
    s.post().unwrap();
    let wrote = pairs::wait_for(&rc.cq_b, 1)[0].status();
    let mut s = rc.b.start_post_send();
    s.wr(2, SendFlags::SIGNALED)
        .rdma_read(rkey, addr, local.sge(32..40).unwrap());
    s.post().unwrap();
    let read = pairs::wait_for(&rc.cq_b, 1)[0].status();
    (wrote, read, local.to_vec(32..40).unwrap())
}

fn supports(ctx: &DeviceContext, t: MwType) -> bool {
    let caps = ctx.query_device().unwrap().device_cap_flags();
    match t {
        MwType::Type1 => caps.contains(DeviceCapFlags::MEM_WINDOW),
        _ => {
            caps.intersects(DeviceCapFlags::MEM_WINDOW_TYPE_2A | DeviceCapFlags::MEM_WINDOW_TYPE_2B)
        }
    }
}

/// Hole 1 of the old API: a clone of `buf.mr()` outlived the buffer, and the buffer's drop
/// freed the memory the region (and the peer's rkey) still named.
#[test]
fn a_region_clone_keeps_the_memory_after_its_buffer_is_dropped() {
    let Some(ctx) =
        common::device_or_skip("a_region_clone_keeps_the_memory_after_its_buffer_is_dropped")
    else {
        return;
    };
    let pd = ctx.alloc_pd().unwrap();
    let mut rc = rc_pair(&ctx, &pd);
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let (buf, freed) = tracked(&pd, 4096, access);
    let (rkey, addr) = (buf.rkey(), buf.addr());
    let mr = Arc::clone(buf.mr());
    drop(buf);
    assert!(
        !freed.load(Ordering::SeqCst),
        "the memory was freed while a clone of its region lives"
    );
    let (wrote, read, back) = peer_write_then_read(&mut rc, &pd, rkey, addr + 100, b"landed!!");
    assert_eq!((wrote, read), (WcStatus::Success, WcStatus::Success));
    assert_eq!(
        back, b"landed!!",
        "the peer's WRITE did not land in live memory"
    );
    drop(mr);
    // Freed means deregistered: a failed deregistration would have leaked it instead.
    assert!(
        freed.load(Ordering::SeqCst),
        "the last handle's drop deregisters and frees"
    );
    // The rkey is dead now: the peer's access is refused, not served from freed memory.
    let (wrote, _, _) = peer_write_then_read(&mut rc, &pd, rkey, addr + 100, b"too late");
    assert_ne!(wrote, WcStatus::Success, "a deregistered rkey still worked");
}

/// Hole 2: a window bound to a region kept nothing alive, so dropping the region's owner
/// freed memory the window still granted (or, with the kernel refusing to deregister, freed
/// it after a failed deregistration).
fn a_window_keeps_its_region_alive(test: &str, mw_type: MwType) {
    let Some(ctx) = common::device_or_skip(test) else {
        return;
    };
    let pd = ctx.alloc_pd().unwrap();
    if !supports(&ctx, mw_type) {
        let err = pd.alloc_mw(mw_type).unwrap_err();
        println!(
            "skipped: {mw_type:?} memory windows unsupported by {}: {err}",
            ctx.name()
        );
        return;
    }
    let mut rc = rc_pair(&ctx, &pd);
    let (buf, freed) = tracked(&pd, 4096, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND);
    let mw = pd.alloc_mw(mw_type).unwrap();
    let base = buf.addr() + 1024;
    let window = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let rkey = match mw_type {
        MwType::Type1 => mw
            .bind(
                &mut rc.a,
                5,
                SendFlags::SIGNALED,
                buf.mr(),
                base..base + 512,
                window,
            )
            .unwrap(),
        _ => {
            let rkey = mw.next_rkey();
            let mut s = rc.a.start_post_send();
            s.wr(5, SendFlags::SIGNALED)
                .bind_mw(&mw, rkey, buf.mr(), base..base + 512, window);
            s.post().unwrap();
            rkey
        }
    };
    pairs::wait_for(&rc.cq_a, 1)[0].ok().unwrap();
    assert!(mw.bound_region().is_some());
    drop(buf);
    assert!(
        !freed.load(Ordering::SeqCst),
        "the memory was freed while a window was bound to its region"
    );
    let (wrote, read, back) = peer_write_then_read(&mut rc, &pd, rkey, base + 8, b"viawin!!");
    assert_eq!((wrote, read), (WcStatus::Success, WcStatus::Success));
    assert_eq!(
        back, b"viawin!!",
        "the WRITE through the window did not land in live memory"
    );
    drop(mw);
    assert!(
        freed.load(Ordering::SeqCst),
        "dropping the window released the region, which deregistered and freed"
    );
}

#[test]
fn a_type1_window_keeps_its_region_alive() {
    a_window_keeps_its_region_alive("a_type1_window_keeps_its_region_alive", MwType::Type1);
}

#[test]
fn a_type2_window_keeps_its_region_alive() {
    a_window_keeps_its_region_alive("a_type2_window_keeps_its_region_alive", MwType::Type2);
}

/// A deregistration that fails leaks the memory: the device may still reach it. Forced the
/// only way safe code cannot: a window bound behind sideway's back (raw `ibv_bind_mw`), so
/// the kernel refuses to deregister the region while nothing holds it.
#[test]
fn a_failed_deregistration_leaks_instead_of_freeing() {
    let test = "a_failed_deregistration_leaks_instead_of_freeing";
    let Some(ctx) = common::device_or_skip(test) else {
        return;
    };
    let pd = ctx.alloc_pd().unwrap();
    if !supports(&ctx, MwType::Type1) {
        let err = pd.alloc_mw(MwType::Type1).unwrap_err();
        println!(
            "skipped: {test} needs a type 1 memory window to make ibv_dereg_mr fail, and {} has none: {err}",
            ctx.name()
        );
        return;
    }
    let mut rc = rc_pair(&ctx, &pd);
    let (buf, freed) = tracked(&pd, 4096, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND);
    let mw = pd.alloc_mw(MwType::Type1).unwrap();
    let mut bind = sideway::sys::ibv_mw_bind {
        wr_id: 9,
        send_flags: SendFlags::SIGNALED.bits(),
        bind_info: sideway::sys::ibv_mw_bind_info {
            mr: buf.mr().as_raw(),
            addr: buf.addr(),
            length: 512,
            mw_access_flags: AccessFlags::REMOTE_WRITE.bits(),
        },
    };
    // SAFETY: the QP, window and region are alive; bind is fully initialised. The test binds
    // without telling the window, which is exactly what safe code cannot do.
    let ret = unsafe { sideway::sys::ibv_bind_mw(rc.a.as_raw(), mw.as_raw(), &mut bind) };
    assert_eq!(ret, 0, "ibv_bind_mw");
    pairs::wait_for(&rc.cq_a, 1)[0].ok().unwrap();
    assert!(mw.bound_region().is_none(), "the window knows of no region");
    let rkey = mw.rkey();

    let before = leaked_memory();
    drop(buf); // the region's last handle: ibv_dereg_mr fails, the window is bound
    let after = leaked_memory();
    if freed.load(Ordering::SeqCst) {
        panic!(
            "{} deregistered a region with a bound window, or sideway freed memory after a failed \
             deregistration (leaked before {before:?}, after {after:?})",
            ctx.name()
        );
    }
    assert_eq!(
        after.regions,
        before.regions + 1,
        "the leak was not counted"
    );
    assert_eq!(after.bytes, before.bytes + 4096);
    // The leaked memory is still live and still reachable through the window.
    let mut src = pd.reg_buffer(64, AccessFlags::LOCAL_WRITE).unwrap();
    src.write_at(0, b"leaked!!").unwrap();
    let mut s = rc.b.start_post_send();
    s.wr(3, SendFlags::SIGNALED)
        .rdma_write(rkey, bind.bind_info.addr + 8, src.sge(0..8).unwrap());
    s.post().unwrap();
    assert_eq!(pairs::wait_for(&rc.cq_b, 1)[0].status(), WcStatus::Success);
    assert!(!freed.load(Ordering::SeqCst));
    drop(mw);
}
