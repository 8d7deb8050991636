//! Thread domains and parent domains against the test provider (the null provider's
//! `verbs_context` ops `alloc_td`, `dealloc_td`, `alloc_parent_domain`, `create_cq_ex`,
//! `create_qp_ex`, reached through verbs.h's inlines): the arguments each verb passes, who
//! holds what, the allocator callbacks (panics contained), and the order things go in.
//! Needs no device and no rdma-core library.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use benches::null_provider::{NullProvider, BUFFER_ALIGN, BUFFER_SIZE, QP_REFUSED, RES_CQ, RES_QP};
use sideway::completion_queue::{CompletionQueueError, WcFlagsEx};
use sideway::parent_domain::{AllocRequest, Allocation, DomainAllocator};
use sideway::queue_pair::QueuePairError;

/// What the test allocator saw, shared with the test.
#[derive(Default)]
struct Seen {
    requests: Mutex<Vec<AllocRequest>>,
    freed: Mutex<Vec<(usize, u64)>>,
    dropped: AtomicBool,
    panic_in_alloc: AtomicBool,
    panic_in_free: AtomicBool,
    default_next: AtomicBool,
    live: AtomicU64,
}

/// Hands out aligned heap buffers and records every call.
struct TestAllocator(Arc<Seen>);

impl Drop for TestAllocator {
    fn drop(&mut self) {
        self.0.dropped.store(true, Ordering::SeqCst);
    }
}

// SAFETY: alloc returns a fresh buffer of the size and alignment asked for, freed only in
// free with the layout it was made with.
unsafe impl DomainAllocator for TestAllocator {
    fn alloc(&self, request: AllocRequest) -> Allocation {
        self.0.requests.lock().unwrap().push(request);
        if self.0.panic_in_alloc.load(Ordering::SeqCst) {
            panic!("the test allocator panics in alloc");
        }
        if self.0.default_next.swap(false, Ordering::SeqCst) {
            return Allocation::ProviderDefault;
        }
        let layout = std::alloc::Layout::from_size_align(request.size, request.alignment).unwrap();
        // SAFETY: the layout has a non-zero size.
        match NonNull::new(unsafe { std::alloc::alloc(layout) }) {
            Some(p) => {
                self.0.live.fetch_add(1, Ordering::SeqCst);
                Allocation::Memory(p.cast::<c_void>())
            }
            None => Allocation::Failed,
        }
    }

    fn free(&self, ptr: NonNull<c_void>, resource_type: u64) {
        self.0
            .freed
            .lock()
            .unwrap()
            .push((ptr.as_ptr() as usize, resource_type));
        if self.0.panic_in_free.load(Ordering::SeqCst) {
            panic!("the test allocator panics in free");
        }
        let layout = std::alloc::Layout::from_size_align(BUFFER_SIZE, BUFFER_ALIGN).unwrap();
        // SAFETY: every buffer the provider asks for has this layout, and ptr came from alloc.
        unsafe { std::alloc::dealloc(ptr.as_ptr().cast(), layout) };
        self.0.live.fetch_sub(1, Ordering::SeqCst);
    }
}

#[test]
fn a_thread_bound_parent_domain_passes_its_arguments_and_keeps_its_parts_for_its_qps() {
    let np = NullProvider::new();
    let ctx = np.sideway_context();
    let pd = np.sideway_pd(&ctx);
    let td = ctx
        .alloc_td()
        .expect("the test provider has thread domains");
    assert_eq!(np.domains().alloc_td_calls, 1);
    assert_eq!(np.domains().td_live, 1);
    let seen = Arc::new(Seen::default());
    let parent = pd
        .create_parent_domain_builder()
        .thread_domain(&td)
        .allocator(TestAllocator(Arc::clone(&seen)))
        .build()
        .expect("the test provider has parent domains");
    assert_eq!(np.domains().alloc_parent_domain_calls, 1);
    assert!(parent.as_pd().is_thread_bound());
    assert!(!pd.is_thread_bound());
    assert!(Arc::ptr_eq(parent.protection_domain(), &pd));
    assert!(Arc::ptr_eq(parent.thread_domain().unwrap(), &td));
    assert_eq!(
        Arc::strong_count(&pd),
        3,
        "the parent domain holds its PD twice"
    );

    // No CQ on a thread-bound parent domain (refused before the provider is called); its
    // QPs use an ordinary CQ.
    assert!(matches!(
        ctx.create_cq_builder().parent_domain(&parent).build_ex(),
        Err(CompletionQueueError::ThreadBoundPd { .. })
    ));
    assert_eq!(np.domains().create_cq_ex_calls, 0);
    let cq = np.cq(true, WcFlagsEx::default_ex()).unwrap();

    // A QP on it: create_qp_ex gets the parent domain as its PD, and the provider takes the
    // QP's buffer from the allocator (then refuses the QP, as it must: the rest of a QP's
    // creation is libibverbs', and gives the buffer back).
    let err = parent
        .create_qp_builder()
        .send_cq(&cq)
        .recv_cq(&cq)
        .build_ex()
        .expect_err("the test provider refuses QPs after checking them");
    match err {
        QueuePairError::Create { call, source, .. } => {
            assert_eq!(call, "ibv_create_qp_ex");
            assert_eq!(source.raw_os_error(), Some(QP_REFUSED));
        }
        other => panic!("unexpected error {other}"),
    }
    let d = np.domains();
    assert_eq!(d.create_qp_ex_calls, 1);
    assert_eq!(d.last_qp_pd, parent.as_raw());
    assert_eq!(d.last_qp_send_cq, cq.as_raw());
    assert_eq!(d.last_qp_comp_mask & 1, 1, "IBV_QP_INIT_ATTR_PD");
    {
        let requests = seen.requests.lock().unwrap();
        assert_eq!(requests.len(), 1);
        let r = requests[0];
        assert_eq!(
            (r.size, r.alignment, r.resource_type),
            (BUFFER_SIZE, BUFFER_ALIGN, RES_QP)
        );
    }
    let freed = seen.freed.lock().unwrap().clone();
    assert_eq!(freed.len(), 1, "the refused QP's buffer");
    assert_eq!(freed[0].1, RES_QP);
    assert_eq!(seen.live.load(Ordering::SeqCst), 0);

    // A QP wrapped on the parent domain (a QueuePair<OneThread>) holds it like any PD.
    let qp = np.sideway_qp_on(&mut parent.create_qp_builder(), &cq);
    assert!(Arc::ptr_eq(qp.pd(), parent.as_pd()));
    // The PD's own builder (or one reached through the QP) would make a Send QP on the
    // thread domain: refused before any provider call, however it is reached; so is an SRQ.
    let calls = np.domains().create_qp_ex_calls;
    for mut builder in [
        parent.as_pd().create_qp_builder(),
        qp.pd().create_qp_builder(),
    ] {
        builder.send_cq(&cq).recv_cq(&cq);
        for result in [builder.build_ex(), builder.build()] {
            assert!(
                matches!(result, Err(QueuePairError::ThreadBoundPd { .. })),
                "{result:?}"
            );
        }
    }
    assert_eq!(np.domains().create_qp_ex_calls, calls);
    assert!(matches!(
        parent.as_pd().create_srq_builder().build(),
        Err(sideway::shared_receive_queue::SharedReceiveQueueError::ThreadBoundPd { .. })
    ));

    // Drop every handle the test has: the QP keeps the parent domain, and with it the PD,
    // the TD and the allocator.
    drop(parent);
    drop(td);
    assert_eq!(np.domains().dealloc_td_calls, 0);
    assert!(!seen.dropped.load(Ordering::SeqCst));
    assert_eq!(
        Arc::strong_count(&pd),
        2,
        "the parent domain's PD still holds it"
    );
    drop(qp);
    let d = np.domains();
    assert_eq!(
        d.dealloc_td_calls, 1,
        "the TD goes with the last object on it"
    );
    assert_eq!(d.td_live, 0);
    assert_eq!(d.order_errors, 0);
    assert!(seen.dropped.load(Ordering::SeqCst), "and the allocator");
    assert_eq!(Arc::strong_count(&pd), 1);
}

#[test]
fn a_parent_domain_without_a_thread_domain_serves_cqs_from_its_allocator() {
    let np = NullProvider::new();
    let ctx = np.sideway_context();
    let pd = np.sideway_pd(&ctx);
    let seen = Arc::new(Seen::default());
    let parent = pd
        .create_parent_domain_builder()
        .allocator(TestAllocator(Arc::clone(&seen)))
        .build()
        .unwrap();
    let as_pd = parent.as_pd();
    assert!(!as_pd.is_thread_bound());
    assert_eq!(
        as_pd.handle(),
        pd.handle(),
        "the parent domain speaks for its PD"
    );
    assert!(parent.thread_domain().is_none());

    // A CQ on it: create_cq_ex gets it with IBV_CQ_INIT_ATTR_MASK_PD, and the provider takes
    // the CQ's buffer from the allocator.
    let cq = ctx
        .create_cq_builder()
        .parent_domain(&parent)
        .build_ex()
        .expect("the CQ is made");
    let d = np.domains();
    assert_eq!(d.create_cq_ex_calls, 1);
    assert_eq!(d.last_cq_comp_mask & 2, 2, "IBV_CQ_INIT_ATTR_MASK_PD");
    assert_eq!(d.last_cq_parent_domain, parent.as_raw());
    {
        let requests = seen.requests.lock().unwrap();
        assert_eq!(requests.len(), 1);
        let r = requests[0];
        assert_eq!(
            (r.size, r.alignment, r.resource_type),
            (BUFFER_SIZE, BUFFER_ALIGN, RES_CQ)
        );
    }
    assert_eq!(d.live_buffers, 1);
    assert!(matches!(
        ctx.create_cq_builder().parent_domain(&parent).build(),
        Err(CompletionQueueError::ParentDomainNeedsEx)
    ));

    // Ordinary QPs through its PD.
    let qp: sideway::queue_pair::QueuePair = np.sideway_qp_on(&mut as_pd.create_qp_builder(), &cq);
    assert!(Arc::ptr_eq(qp.pd(), as_pd));

    // The CQ keeps the parent domain, its PD and its allocator, which the provider still
    // calls: it frees the CQ's buffer when it destroys the CQ (a libibverbs verb, so the
    // test does what it would), after which the CQ goes, and the parent domain's parts.
    drop(qp);
    drop(parent);
    assert!(!seen.dropped.load(Ordering::SeqCst));
    assert_eq!(
        Arc::strong_count(&pd),
        2,
        "the parent domain's PD still holds it"
    );
    np.release_domain_buffers();
    let freed = seen.freed.lock().unwrap().clone();
    assert_eq!(freed.len(), 1);
    assert_eq!(freed[0].1, RES_CQ);
    assert_eq!(seen.live.load(Ordering::SeqCst), 0);
    drop(cq);
    assert!(seen.dropped.load(Ordering::SeqCst));
    assert_eq!(Arc::strong_count(&pd), 1);
    assert_eq!(np.domains().alloc_td_calls, 0);
    assert_eq!(np.domains().dealloc_td_calls, 0);
}

#[test]
fn allocator_panics_stay_on_the_rust_side() {
    let np = NullProvider::new();
    let ctx = np.sideway_context();
    let pd = np.sideway_pd(&ctx);
    let seen = Arc::new(Seen::default());
    let parent = pd
        .create_parent_domain_builder()
        .allocator(TestAllocator(Arc::clone(&seen)))
        .build()
        .unwrap();

    // A panic in alloc is an allocation failure: the CQ is not made, nothing unwinds into C.
    seen.panic_in_alloc.store(true, Ordering::SeqCst);
    let err = ctx
        .create_cq_builder()
        .parent_domain(&parent)
        .build_ex()
        .expect_err("the allocation failed");
    match err {
        CompletionQueueError::Create { call, source, .. } => {
            assert_eq!(call, "ibv_create_cq_ex");
            assert_eq!(source.raw_os_error(), Some(libc_enomem()));
        }
        other => panic!("unexpected error {other}"),
    }
    seen.panic_in_alloc.store(false, Ordering::SeqCst);

    // "Use the default" reaches the provider as IBV_ALLOCATOR_USE_DEFAULT.
    seen.default_next.store(true, Ordering::SeqCst);
    let cq = ctx
        .create_cq_builder()
        .parent_domain(&parent)
        .build_ex()
        .unwrap();
    assert_eq!(np.domains().default_allocs, 1);
    assert_eq!(np.domains().live_buffers, 0);
    drop(cq);

    // A panic in free leaks the buffer and goes no further.
    let cq = ctx
        .create_cq_builder()
        .parent_domain(&parent)
        .build_ex()
        .unwrap();
    assert_eq!(np.domains().live_buffers, 1);
    seen.panic_in_free.store(true, Ordering::SeqCst);
    np.release_domain_buffers();
    assert_eq!(np.domains().free_calls, 1);
    assert_eq!(seen.freed.lock().unwrap().len(), 1);
    assert_eq!(seen.live.load(Ordering::SeqCst), 1, "the buffer leaked");
    drop(cq);
    drop(parent);
    assert!(seen.dropped.load(Ordering::SeqCst));
}

#[test]
fn a_provider_without_domains_says_so() {
    let np = NullProvider::new();
    np.disable_domains();
    let ctx = np.sideway_context();
    let pd = np.sideway_pd(&ctx);
    let err = ctx.alloc_td().expect_err("no alloc_td");
    assert!(err.is_not_supported(), "{err}");
    assert_eq!(err.call, "ibv_alloc_td");
    assert!(
        err.to_string().contains("not supported by this device"),
        "{err}"
    );
    let err = pd
        .create_parent_domain_builder()
        .build()
        .expect_err("no alloc_parent_domain");
    assert!(err.is_not_supported(), "{err}");
    assert_eq!(err.call, "ibv_alloc_parent_domain");
    assert_eq!(np.domains().alloc_td_calls, 0);
}

fn libc_enomem() -> i32 {
    12 // ENOMEM on Linux
}
