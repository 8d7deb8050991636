//! The benchmarked operations, each in Rust (over sideway) and in C (`csrc/data_path.c`,
//! over verbs.h's inlines), and the table of pairs both bench targets run.
//!
//! Each side runs its whole loop itself (`iters` operations per call), so neither pays a
//! call across the language boundary per operation. Both do the same work per operation:
//! build the same requests (the C side a `struct ibv_send_wr` initialised the usual way,
//! which zeroes the fields it does not name, as sideway does), post them with one doorbell,
//! read the same completion fields and check the same status.
//!
//! The Rust side polls the way a hot loop should: it claims the CQ once per run
//! ([`CompletionQueue::claim`]) and polls the claimed CQ, so an extended CQ pays its
//! one-poller-at-a-time check once, not per poll (a classic CQ pays nothing either way).

use std::os::raw::c_int;
use std::sync::Arc;

use sideway::completion_queue::{CompletionQueue, WorkCompletion};
use sideway::memory_region::Sge;
use sideway::queue_pair::{QueuePair, SendFlags};
use sideway::sys::{ibv_cq, ibv_cq_ex, ibv_qp, ibv_qp_ex, ibv_sge};

use crate::null_provider::NullProvider;

/// The operands of every RDMA WRITE the benchmarks post (`struct bench_write`: [`Sge`] is
/// `repr(transparent)` over `ibv_sge`, so the layouts match).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Write {
    rkey: u32,
    remote_addr: u64,
    sge: Sge,
}

impl Write {
    /// A WRITE of `sge` to `remote_addr` in the peer's region of `rkey`.
    pub fn new(rkey: u32, remote_addr: u64, sge: Sge) -> Self {
        Write {
            rkey,
            remote_addr,
            sge,
        }
    }

    /// A WRITE of 64 bytes for the null provider. Its entry names no registered memory.
    ///
    /// # Safety
    ///
    /// Only for the null provider's QPs, which never dereference an SGE (they only read its
    /// length).
    pub unsafe fn null() -> Self {
        // SAFETY: the caller posts it only to the null provider, which never dereferences
        // the entry.
        let sge = unsafe { Sge::from_raw_parts(0x20_0000, 64, 0x5678) };
        Write::new(0x1234, 0x10_0000, sge)
    }
}

/// A completion array on a cache line of its own, as the C side's (`BENCH_ALIGNED`): where
/// the compiler puts an array decides how many of the provider's stores into it split a
/// cache line, which is not what is being compared (an `ibv_wc` array is 8-byte aligned in
/// Rust, while GCC aligns arrays of 16 bytes or more to 16; at 8 mod 16, a quarter of the
/// null provider's 16-byte stores cross a line, and polling 32 took about 15 % longer).
#[repr(C, align(64))]
struct Aligned<T>(T);

/// The largest batch the benchmarks post (the C side's array size).
pub const MAX_BATCH: u32 = 64;
/// The most completions one poll benchmark asks for (the C side's array size).
pub const MAX_POLL: u32 = 32;

extern "C" {
    fn bench_c_post_write(qp: *mut ibv_qp, w: *const Write, iters: u64) -> c_int;
    fn bench_c_post_write_ex(qp: *mut ibv_qp_ex, w: *const Write, iters: u64) -> c_int;
    fn bench_c_post_write_batch(qp: *mut ibv_qp, w: *const Write, batch: u32, iters: u64) -> c_int;
    fn bench_c_post_write_batch_ex(
        qp: *mut ibv_qp_ex,
        w: *const Write,
        batch: u32,
        iters: u64,
    ) -> c_int;
    fn bench_c_post_recv(qp: *mut ibv_qp, sge: *const ibv_sge, iters: u64) -> c_int;
    fn bench_c_poll_iter(cq: *mut ibv_cq, n: u32, iters: u64, sum: *mut u64) -> c_int;
    fn bench_c_poll_batch(cq: *mut ibv_cq, n: u32, iters: u64, sum: *mut u64) -> c_int;
    fn bench_c_poll_iter_ex(cq: *mut ibv_cq_ex, n: u32, iters: u64, sum: *mut u64) -> c_int;
    fn bench_c_poll_batch_ex(cq: *mut ibv_cq_ex, n: u32, iters: u64, sum: *mut u64) -> c_int;
    fn bench_c_cycle(
        qp: *mut ibv_qp,
        cq: *mut ibv_cq,
        w: *const Write,
        iters: u64,
        sum: *mut u64,
    ) -> c_int;
    fn bench_c_cycle_ex(
        qp: *mut ibv_qp_ex,
        cq: *mut ibv_cq_ex,
        w: *const Write,
        iters: u64,
        sum: *mut u64,
    ) -> c_int;

    // The same operations with the provider's pointers read once (`csrc/data_path_cached.c`).
    fn bench_cc_post_write(qp: *mut ibv_qp, w: *const Write, iters: u64) -> c_int;
    fn bench_cc_post_write_ex(qp: *mut ibv_qp_ex, w: *const Write, iters: u64) -> c_int;
    fn bench_cc_post_write_batch(qp: *mut ibv_qp, w: *const Write, batch: u32, iters: u64)
        -> c_int;
    fn bench_cc_post_write_batch_ex(
        qp: *mut ibv_qp_ex,
        w: *const Write,
        batch: u32,
        iters: u64,
    ) -> c_int;
    fn bench_cc_post_recv(qp: *mut ibv_qp, sge: *const ibv_sge, iters: u64) -> c_int;
    fn bench_cc_poll_iter(cq: *mut ibv_cq, n: u32, iters: u64, sum: *mut u64) -> c_int;
    fn bench_cc_poll_batch(cq: *mut ibv_cq, n: u32, iters: u64, sum: *mut u64) -> c_int;
    fn bench_cc_poll_iter_ex(cq: *mut ibv_cq_ex, n: u32, iters: u64, sum: *mut u64) -> c_int;
    fn bench_cc_poll_batch_ex(cq: *mut ibv_cq_ex, n: u32, iters: u64, sum: *mut u64) -> c_int;
    fn bench_cc_cycle(
        qp: *mut ibv_qp,
        cq: *mut ibv_cq,
        w: *const Write,
        iters: u64,
        sum: *mut u64,
    ) -> c_int;
    fn bench_cc_cycle_ex(
        qp: *mut ibv_qp_ex,
        cq: *mut ibv_cq_ex,
        w: *const Write,
        iters: u64,
        sum: *mut u64,
    ) -> c_int;
}

type Error = Box<dyn std::error::Error>;

fn c_result(call: &str, ret: c_int) -> Result<(), Error> {
    match ret {
        0 => Ok(()),
        n => Err(format!("{call}: {}", std::io::Error::from_raw_os_error(n)).into()),
    }
}

// ---- The Rust side ----

/// Posts one signaled WRITE per iteration.
#[inline(never)]
pub fn post_write(qp: &mut QueuePair, w: &Write, iters: u64) -> Result<(), Error> {
    let sge = w.sge;
    for i in 0..iters {
        let mut batch = qp.start_post_send();
        batch
            .wr(i, SendFlags::SIGNALED)
            .rdma_write(w.rkey, w.remote_addr, sge);
        batch.post()?;
    }
    Ok(())
}

/// Posts `n` WRITEs (the last signaled) with one doorbell per iteration.
#[inline(never)]
pub fn post_write_batch(qp: &mut QueuePair, w: &Write, n: u32, iters: u64) -> Result<(), Error> {
    let sge = w.sge;
    let n = u64::from(n);
    for i in 0..iters {
        let mut batch = qp.start_post_send();
        for k in 0..n {
            let flags = if k + 1 == n {
                SendFlags::SIGNALED
            } else {
                SendFlags::empty()
            };
            batch
                .wr(i * n + k, flags)
                .rdma_write(w.rkey, w.remote_addr, sge);
        }
        batch.post()?;
    }
    Ok(())
}

/// Posts one receive per iteration.
#[inline(never)]
pub fn post_recv(qp: &mut QueuePair, sge: Sge, iters: u64) -> Result<(), Error> {
    for i in 0..iters {
        let mut batch = qp.start_post_recv();
        batch.recv(i, &[sge]);
        batch.post()?;
    }
    Ok(())
}

/// Makes `n` completions ready, then takes them from the [`ClaimedCq::poll`] iterator until
/// it ends, per iteration.
///
/// [`ClaimedCq::poll`]: sideway::completion_queue::ClaimedCq::poll
#[inline(never)]
pub fn poll_iter(
    np: &NullProvider,
    cq: &Arc<CompletionQueue>,
    n: u32,
    iters: u64,
) -> Result<u64, Error> {
    let mut cq = cq.claim()?;
    let mut sum = 0;
    for _ in 0..iters {
        np.add_completions(n);
        for wc in cq.poll()? {
            if !wc.is_success() {
                return Err(wc.ok().unwrap_err().into());
            }
            sum += wc.wr_id();
        }
    }
    Ok(sum)
}

/// Makes `n` completions ready, then takes them with one [`ClaimedCq::poll_into`], per
/// iteration.
///
/// [`ClaimedCq::poll_into`]: sideway::completion_queue::ClaimedCq::poll_into
#[inline(never)]
pub fn poll_batch(
    np: &NullProvider,
    cq: &Arc<CompletionQueue>,
    n: u32,
    iters: u64,
) -> Result<u64, Error> {
    let mut cq = cq.claim()?;
    let mut slots = Aligned([WorkCompletion::default(); MAX_POLL as usize]);
    let slots = &mut slots.0[..n as usize];
    let mut sum = 0;
    for _ in 0..iters {
        np.add_completions(n);
        let got = cq.poll_into(slots)?;
        for wc in &slots[..got] {
            if !wc.is_success() {
                return Err(wc.ok().unwrap_err().into());
            }
            sum += wc.wr_id();
        }
    }
    Ok(sum)
}

/// Posts one signaled WRITE, then polls until its completion arrives, per iteration.
#[inline(never)]
pub fn cycle(
    qp: &mut QueuePair,
    cq: &Arc<CompletionQueue>,
    w: &Write,
    iters: u64,
) -> Result<u64, Error> {
    let mut cq = cq.claim()?;
    let sge = w.sge;
    let mut slot = Aligned([WorkCompletion::default(); 1]);
    let slot = &mut slot.0;
    let mut sum = 0;
    for i in 0..iters {
        let mut batch = qp.start_post_send();
        batch
            .wr(i, SendFlags::SIGNALED)
            .rdma_write(w.rkey, w.remote_addr, sge);
        batch.post()?;
        while cq.poll_into(slot)? == 0 {}
        let wc = &slot[0];
        if !wc.is_success() {
            return Err(wc.ok().unwrap_err().into());
        }
        sum += wc.wr_id();
    }
    Ok(sum)
}

// ---- The C side, over raw pointers ----

/// The C side's view of a QP and its CQ.
#[derive(Debug, Clone, Copy)]
pub struct RawObjects {
    /// The QP.
    pub qp: *mut ibv_qp,
    /// The same QP as `ibv_qp_ex` (NULL when it has none).
    pub qp_ex: *mut ibv_qp_ex,
    /// Its CQ.
    pub cq: *mut ibv_cq,
    /// The same CQ as `ibv_cq_ex` (NULL when it has none).
    pub cq_ex: *mut ibv_cq_ex,
}

/// The C side of one operation: which loop, on which objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum COp {
    /// `bench_c_post_write` or `_ex`.
    PostWrite,
    /// `bench_c_post_write_batch` or `_ex`, with this batch size.
    PostWriteBatch(u32),
    /// `bench_c_post_recv`.
    PostRecv,
    /// `bench_c_poll_iter` or `_ex`, this many completions.
    PollIter(u32),
    /// `bench_c_poll_batch` or `_ex`, this many completions.
    PollBatch(u32),
    /// `bench_c_cycle` or `_ex`.
    Cycle,
}

/// Which of the two C baselines runs an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CStyle {
    /// `csrc/data_path.c`: verbs.h's inlines, which load the provider's function pointer
    /// from the verbs object on every call, as a C program usually reads.
    Inline,
    /// `csrc/data_path_cached.c`: the provider's function pointers read once per run and
    /// called directly, as sideway calls them (it copies them when it creates its objects).
    Cached,
}

/// Runs `iters` iterations of `op` in C on `objs` (extended objects when `extended`), the
/// way verbs.h's inlines make a C program do it ([`CStyle::Inline`]).
///
/// # Safety
///
/// `objs` are live verbs objects (the QP's CQ is `cq`; the `_ex` pointers non-NULL when
/// `extended`), used by no other thread meanwhile; `w`'s SGE names registered memory on a
/// real device. Poll operations need a null provider's CQ.
pub unsafe fn run_c(
    op: COp,
    objs: &RawObjects,
    extended: bool,
    w: &Write,
    iters: u64,
) -> Result<u64, Error> {
    // SAFETY: the caller's guarantees, passed on.
    unsafe { run_c_style(CStyle::Inline, op, objs, extended, w, iters) }
}

/// Runs `iters` iterations of `op` in C in the given style; [`run_c`] with a choice of
/// baseline.
///
/// # Safety
///
/// As for [`run_c`].
pub unsafe fn run_c_style(
    style: CStyle,
    op: COp,
    objs: &RawObjects,
    extended: bool,
    w: &Write,
    iters: u64,
) -> Result<u64, Error> {
    if style == CStyle::Cached {
        // SAFETY: the caller's guarantees, passed on.
        return unsafe { run_c_cached(op, objs, extended, w, iters) };
    }
    let mut sum = 0;
    // SAFETY: every call below gets objects the caller guarantees live and unshared; w and
    // sum outlive the calls, which only read w and add to sum.
    let ret = unsafe {
        match (op, extended) {
            (COp::PostWrite, false) => bench_c_post_write(objs.qp, w, iters),
            (COp::PostWrite, true) => bench_c_post_write_ex(objs.qp_ex, w, iters),
            (COp::PostWriteBatch(n), false) => bench_c_post_write_batch(objs.qp, w, n, iters),
            (COp::PostWriteBatch(n), true) => bench_c_post_write_batch_ex(objs.qp_ex, w, n, iters),
            (COp::PostRecv, _) => bench_c_post_recv(objs.qp, w.sge.as_raw(), iters),
            (COp::PollIter(n), false) => bench_c_poll_iter(objs.cq, n, iters, &mut sum),
            (COp::PollIter(n), true) => bench_c_poll_iter_ex(objs.cq_ex, n, iters, &mut sum),
            (COp::PollBatch(n), false) => bench_c_poll_batch(objs.cq, n, iters, &mut sum),
            (COp::PollBatch(n), true) => bench_c_poll_batch_ex(objs.cq_ex, n, iters, &mut sum),
            (COp::Cycle, false) => bench_c_cycle(objs.qp, objs.cq, w, iters, &mut sum),
            (COp::Cycle, true) => bench_c_cycle_ex(objs.qp_ex, objs.cq_ex, w, iters, &mut sum),
        }
    };
    c_result("the C side", ret)?;
    Ok(sum)
}

/// [`run_c`] over `csrc/data_path_cached.c`.
///
/// # Safety
///
/// As for [`run_c`].
unsafe fn run_c_cached(
    op: COp,
    objs: &RawObjects,
    extended: bool,
    w: &Write,
    iters: u64,
) -> Result<u64, Error> {
    let mut sum = 0;
    // SAFETY: as in run_c_style: objects the caller guarantees live and unshared; w and sum
    // outlive the calls, which only read w and add to sum.
    let ret = unsafe {
        match (op, extended) {
            (COp::PostWrite, false) => bench_cc_post_write(objs.qp, w, iters),
            (COp::PostWrite, true) => bench_cc_post_write_ex(objs.qp_ex, w, iters),
            (COp::PostWriteBatch(n), false) => bench_cc_post_write_batch(objs.qp, w, n, iters),
            (COp::PostWriteBatch(n), true) => bench_cc_post_write_batch_ex(objs.qp_ex, w, n, iters),
            (COp::PostRecv, _) => bench_cc_post_recv(objs.qp, w.sge.as_raw(), iters),
            (COp::PollIter(n), false) => bench_cc_poll_iter(objs.cq, n, iters, &mut sum),
            (COp::PollIter(n), true) => bench_cc_poll_iter_ex(objs.cq_ex, n, iters, &mut sum),
            (COp::PollBatch(n), false) => bench_cc_poll_batch(objs.cq, n, iters, &mut sum),
            (COp::PollBatch(n), true) => bench_cc_poll_batch_ex(objs.cq_ex, n, iters, &mut sum),
            (COp::Cycle, false) => bench_cc_cycle(objs.qp, objs.cq, w, iters, &mut sum),
            (COp::Cycle, true) => bench_cc_cycle_ex(objs.qp_ex, objs.cq_ex, w, iters, &mut sum),
        }
    };
    c_result("the C side (cached pointers)", ret)?;
    Ok(sum)
}

/// Runs `iters` iterations of `op` in Rust on sideway objects (`np` is the null provider
/// behind them, for the poll operations).
pub fn run_rust(
    op: COp,
    qp: &mut QueuePair,
    cq: &Arc<CompletionQueue>,
    np: Option<&NullProvider>,
    w: &Write,
    iters: u64,
) -> Result<u64, Error> {
    let need_np = || np.ok_or("polling benchmarks need the null provider");
    match op {
        COp::PostWrite => post_write(qp, w, iters).map(|()| 0),
        COp::PostWriteBatch(n) => post_write_batch(qp, w, n, iters).map(|()| 0),
        COp::PostRecv => post_recv(qp, w.sge, iters).map(|()| 0),
        COp::PollIter(n) => poll_iter(need_np()?, cq, n, iters),
        COp::PollBatch(n) => poll_batch(need_np()?, cq, n, iters),
        COp::Cycle => cycle(qp, cq, w, iters),
    }
}

/// One benchmarked operation with both its sides, ready to time.
pub struct Pair {
    /// What it is, e.g. `post WRITE (extended)`.
    pub name: String,
    /// Work requests or completions per iteration (per-WR costs divide by this).
    pub per_iter: u64,
    /// Runs `iters` iterations in Rust.
    pub rust: Box<dyn FnMut(u64)>,
    /// Runs `iters` iterations in C.
    pub c: Box<dyn FnMut(u64)>,
}

impl std::fmt::Debug for Pair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pair")
            .field("name", &self.name)
            .field("per_iter", &self.per_iter)
            .finish_non_exhaustive()
    }
}

/// One operation of the tables: its name, which loop runs it, on which kind of objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operation {
    /// What it is, e.g. `post 1 WRITE (extended)`.
    pub name: String,
    /// The loop both sides run.
    pub op: COp,
    /// Extended QP and CQ (else classic).
    pub extended: bool,
    /// Work requests or completions per iteration (per-WR costs divide by this).
    pub per_iter: u64,
}

/// The operations over the null provider, classic and extended: post one WRITE; a batch of
/// 1, 8, 32, 64 WRITEs with one doorbell; one receive; poll 1 and 32 completions through
/// the iterator and into a slice; a post-and-poll cycle. The rows of both tables (time and
/// instructions), in their order.
pub fn null_provider_operations() -> Vec<Operation> {
    let mut ops = Vec::new();
    let mut push = |name: String, op, extended, per_iter| {
        ops.push(Operation {
            name,
            op,
            extended,
            per_iter,
        });
    };
    for extended in [false, true] {
        let kind = if extended { "extended" } else { "classic" };
        push(
            format!("post 1 WRITE ({kind})"),
            COp::PostWrite,
            extended,
            1,
        );
        for n in [1, 8, 32, MAX_BATCH] {
            push(
                format!("post {n} WRITEs, 1 doorbell, per WR ({kind})"),
                COp::PostWriteBatch(n),
                extended,
                u64::from(n),
            );
        }
        if !extended {
            push("post 1 receive".to_owned(), COp::PostRecv, false, 1);
        }
        for n in [1, MAX_POLL] {
            push(
                format!("poll {n}, iterator ({kind})"),
                COp::PollIter(n),
                extended,
                1,
            );
            push(
                format!("poll {n}, into slice ({kind})"),
                COp::PollBatch(n),
                extended,
                1,
            );
        }
        push(
            format!("post WRITE + poll ({kind})"),
            COp::Cycle,
            extended,
            1,
        );
    }
    ops
}

/// [`null_provider_operations`], each ready to time: each side gets its own provider.
pub fn null_provider_pairs() -> Vec<Pair> {
    null_provider_operations()
        .into_iter()
        .map(|o| null_pair(o.name, o.op, o.extended, o.per_iter))
        .collect()
}

fn null_pair(name: String, op: COp, extended: bool, per_iter: u64) -> Pair {
    // SAFETY: both sides post it only to their null providers.
    let w = unsafe { Write::null() };
    let rust_np = NullProvider::new();
    let (mut qp, cq) = rust_np.sideway(extended);
    let c_np = NullProvider::new();
    let objs = RawObjects {
        qp: c_np.qp_raw(),
        qp_ex: c_np.qp_ex_raw(),
        cq: c_np.cq_raw(),
        cq_ex: c_np.cq_ex_raw(),
    };
    let label = name.clone();
    Pair {
        name,
        per_iter,
        rust: Box::new(move |iters| {
            let sum = run_rust(op, &mut qp, &cq, Some(&rust_np), &w, iters)
                .unwrap_or_else(|e| panic!("{label} (Rust): {e}"));
            std::hint::black_box(sum);
        }),
        c: Box::new(move |iters| {
            // SAFETY: objs are c_np's live objects (moved into this closure), used only here.
            let sum = unsafe { run_c(op, &objs, extended, &w, iters) }
                .unwrap_or_else(|e| panic!("C side: {e}"));
            std::hint::black_box((sum, &c_np));
        }),
    }
}
