//! Device tests: thread domains and parent domains. Providers without them (rxe, siw) must
//! refuse both with a typed "not supported by this device" error (`EOPNOTSUPP` from verbs.h's
//! inlines); providers with them (mlx5) must make a QP on a thread-domain-bound parent
//! domain, whose buffers come from its allocator (or the provider's, as it answers here).

mod common;

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use sideway::parent_domain::{AllocRequest, Allocation, DomainAllocator};

/// Counts the calls and lets the provider allocate every buffer itself.
struct Counting(Arc<AtomicU64>);

// SAFETY: alloc never hands out memory (ProviderDefault), so there is nothing to keep valid.
unsafe impl DomainAllocator for Counting {
    fn alloc(&self, _request: AllocRequest) -> Allocation {
        self.0.fetch_add(1, Ordering::SeqCst);
        Allocation::ProviderDefault
    }

    fn free(&self, _ptr: NonNull<c_void>, _resource_type: u64) {}
}

#[test]
fn thread_and_parent_domains_work_or_are_refused_as_not_supported() {
    let Some(ctx) =
        common::device_or_skip("thread_and_parent_domains_work_or_are_refused_as_not_supported")
    else {
        return;
    };
    let pd = ctx.alloc_pd().unwrap();
    let td = match ctx.alloc_td() {
        Ok(td) => td,
        Err(e) => {
            assert!(e.is_not_supported(), "ibv_alloc_td failed otherwise: {e}");
            assert_eq!(e.call, "ibv_alloc_td");
            assert_eq!(e.device, ctx.name());
            let text = e.to_string();
            assert!(text.contains("not supported by this device"), "{text}");
            // Without thread domains, a provider has no parent domains either.
            let e = pd
                .create_parent_domain_builder()
                .build()
                .expect_err("a provider without thread domains made a parent domain");
            assert!(e.is_not_supported(), "ibv_alloc_parent_domain: {e}");
            assert_eq!(e.call, "ibv_alloc_parent_domain");
            println!("{}: {text}", ctx.name());
            return;
        }
    };
    let calls = Arc::new(AtomicU64::new(0));
    let parent = pd
        .create_parent_domain_builder()
        .thread_domain(&td)
        .allocator(Counting(Arc::clone(&calls)))
        .build()
        .expect("a provider with thread domains makes parent domains");
    // CQs on a thread-bound parent domain are not offered (no provider CQ lock there);
    // its QPs use an ordinary CQ.
    let refused = ctx.create_cq_builder().parent_domain(&parent).build_ex();
    assert!(
        matches!(
            refused,
            Err(sideway::completion_queue::CompletionQueueError::ThreadBoundPd { .. })
        ),
        "{refused:?}"
    );
    let cq = ctx.create_cq_builder().build_ex().unwrap();
    let qp = parent
        .create_qp_builder()
        .send_cq(&cq)
        .recv_cq(&cq)
        .build_ex()
        .expect("a QP on the parent domain");
    assert_eq!(qp.pd().as_raw(), parent.as_raw());
    // Its PD's own builder would make a Send QP on the thread domain: refused.
    let refused = parent
        .as_pd()
        .create_qp_builder()
        .send_cq(&cq)
        .recv_cq(&cq)
        .build_ex();
    assert!(
        matches!(
            refused,
            Err(sideway::queue_pair::QueuePairError::ThreadBoundPd { .. })
        ),
        "{refused:?}"
    );
    println!(
        "{}: thread and parent domains work; the allocator was asked {} times",
        ctx.name(),
        calls.load(Ordering::SeqCst)
    );
    drop(qp);
    drop(cq);
}
