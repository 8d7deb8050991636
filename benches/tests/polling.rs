//! sideway's polling API over the null provider: classic `poll_into` writes the caller's
//! slice itself, a claimed CQ polls as the unclaimed one does and keeps other pollers out,
//! the completion timestamp is read on the poller, and a provider missing a function that
//! polling needs fails at creation. Needs no device and no rdma-core library.

use benches::null_provider::{NullProvider, TIMESTAMP_BASE};
use sideway::completion_queue::{CompletionQueueError, WcFlagsEx, WcOpcode, WorkCompletion};
use sideway::sys::{ibv_cq_ex, ibv_wc};

/// A completion whose `wr_id` no canned completion has, to see which entries a poll wrote.
fn sentinel() -> WorkCompletion {
    WorkCompletion::from(ibv_wc {
        wr_id: u64::MAX,
        ..Default::default()
    })
}

/// The wr_ids of `wcs`.
fn wr_ids(wcs: &[WorkCompletion]) -> Vec<u64> {
    wcs.iter().map(WorkCompletion::wr_id).collect()
}

#[test]
fn classic_poll_into_hands_the_callers_slice_to_the_provider() {
    for n in [1usize, 2, 32, 33, 100] {
        for claimed in [false, true] {
            let np = NullProvider::new();
            let (_qp, cq) = np.sideway(false);
            np.add_completions(n as u32);
            // Room for three more than are ready: the verb must leave those alone.
            let mut out = vec![sentinel(); n + 3];
            let got = if claimed {
                cq.claim().unwrap().poll_into(&mut out).unwrap()
            } else {
                cq.poll_into(&mut out).unwrap()
            };
            let what = format!("{n} ready (claimed: {claimed})");
            assert_eq!(got, n, "{what}");
            assert_eq!(
                wr_ids(&out[..n]),
                (0..n as u64).collect::<Vec<_>>(),
                "{what}"
            );
            assert!(out[..n].iter().all(|wc| wc.is_success()), "{what}");
            assert_eq!(wr_ids(&out[n..]), [u64::MAX; 3], "{what}");
            assert_eq!(
                np.last_poll_array(),
                out.as_ptr().cast::<ibv_wc>(),
                "{what}: the provider wrote somewhere other than the caller's slice"
            );
            assert_eq!(np.counters().poll_calls, 1, "{what}: one ibv_poll_cq");

            // A slice shorter than what is ready takes only its length.
            np.add_completions(n as u32);
            let mut short = vec![sentinel(); n];
            let mut claim = cq.claim().unwrap();
            assert_eq!(claim.poll_into(&mut short[..n - n / 2]).unwrap(), n - n / 2);
            assert_eq!(short[0].wr_id(), n as u64, "{what}");
        }
    }
}

#[test]
fn claimed_and_unclaimed_polls_see_the_same_completions() {
    for extended in [false, true] {
        let np = NullProvider::new();
        let (_qp, cq) = np.sideway(extended);
        np.add_completions(3);
        let unclaimed: Vec<u64> = cq.poll().unwrap().map(|wc| wc.wr_id()).collect();
        let mut claim = cq.claim().unwrap();
        np.add_completions(3);
        let claimed: Vec<u64> = claim.poll().unwrap().map(|wc| wc.wr_id()).collect();
        assert_eq!((unclaimed, claimed), (vec![0, 1, 2], vec![3, 4, 5]));
        np.add_completions(2);
        let mut out = [sentinel(); 4];
        assert_eq!(claim.poll_into(&mut out).unwrap(), 2);
        assert_eq!(wr_ids(&out[..2]), [6, 7]);
        assert_eq!(claim.poll_into(&mut out).unwrap(), 0, "nothing ready");
        assert!(claim.poll().unwrap().next().is_none(), "nothing ready");
        assert_eq!(claim.poll_into(&mut []).unwrap(), 0);
        let c = np.counters();
        assert_eq!(c.completions, 8);
        if extended {
            // Every ibv_start_poll that found an entry was ended, and only those.
            assert_eq!(c.end_polls, 3);
        }
    }
}

/// Classic CQs too: `ibv_poll_cq` is thread-safe only where the provider locks the CQ (not
/// mlx5's single-threaded mode, not a thread domain's CQ), and a `CompletionQueue` is `Sync`.
#[test]
fn a_claimed_cq_refuses_other_pollers_until_dropped() {
    for extended in [false, true] {
        refuses_other_pollers(extended);
    }
}

fn refuses_other_pollers(extended: bool) {
    let np = NullProvider::new();
    let (_qp, cq) = np.sideway(extended);
    let mut claim = cq.claim().unwrap();
    assert!(matches!(cq.claim(), Err(CompletionQueueError::Busy)));
    assert!(matches!(cq.poll(), Err(CompletionQueueError::Busy)));
    let mut out = [sentinel(); 1];
    assert!(matches!(
        cq.poll_into(&mut out),
        Err(CompletionQueueError::Busy)
    ));
    // The claim polls again and again without claiming anew.
    for i in 0..3 {
        np.add_completions(1);
        assert_eq!(claim.poll().unwrap().next().map(|wc| wc.wr_id()), Some(i));
    }
    assert!(std::sync::Arc::ptr_eq(claim.cq(), &cq));
    drop(claim);
    assert!(cq.poll().is_ok(), "dropping the claim releases the CQ");

    // A live poller keeps a claim out, too.
    let poller = cq.poll().unwrap();
    assert!(matches!(cq.claim(), Err(CompletionQueueError::Busy)));
    drop(poller);
    assert!(cq.claim().is_ok());
}

/// Two threads polling one classic CQ never reach the provider at once: while one holds it
/// (a live poller), the other's polls are refused, and the provider sees one poll at a time.
#[test]
fn threads_sharing_a_classic_cq_poll_it_one_at_a_time() {
    let np = NullProvider::new();
    let (_qp, cq) = np.sideway(false);
    let poller = cq.poll().unwrap();
    let busy = std::thread::scope(|s| {
        s.spawn(|| {
            let mut out = [sentinel(); 4];
            (
                matches!(cq.poll(), Err(CompletionQueueError::Busy)),
                matches!(cq.poll_into(&mut out), Err(CompletionQueueError::Busy)),
                matches!(cq.claim(), Err(CompletionQueueError::Busy)),
            )
        })
        .join()
        .unwrap()
    });
    assert_eq!(busy, (true, true, true), "another thread polled a held CQ");
    drop(poller);
    np.add_completions(1);
    let got = std::thread::scope(|s| {
        s.spawn(|| cq.poll().unwrap().next().map(|wc| wc.wr_id()))
            .join()
            .unwrap()
    });
    assert_eq!(got, Some(0), "released, the CQ polls from any thread");
}

#[test]
fn the_poller_reads_the_timestamp_of_the_completion_it_returned_last() {
    let np = NullProvider::new();
    let cq = np
        .cq(
            true,
            WcFlagsEx::default_ex() | WcFlagsEx::COMPLETION_TIMESTAMP,
        )
        .unwrap();
    let mut claim = cq.claim().unwrap();
    np.add_completions(3);
    let mut poller = claim.poll().unwrap();
    assert_eq!(poller.completion_timestamp(), None, "none returned yet");
    let mut seen = Vec::new();
    while let Some(wc) = poller.next() {
        assert_eq!(
            poller.completion_timestamp(),
            Some(TIMESTAMP_BASE + wc.wr_id()),
            "read on the entry just returned"
        );
        // Reading it twice reads the same entry.
        assert_eq!(
            poller.completion_timestamp(),
            Some(TIMESTAMP_BASE + wc.wr_id())
        );
        seen.push(wc.wr_id());
    }
    assert_eq!(seen, [0, 1, 2]);
    assert_eq!(poller.completion_timestamp(), None, "the poller ran out");
    drop(poller);

    // Not asked for: None, even positioned on an entry.
    let np = NullProvider::new();
    let cq = np.cq(true, WcFlagsEx::default_ex()).unwrap();
    np.add_completions(1);
    let mut poller = cq.poll().unwrap();
    assert!(poller.next().is_some());
    assert_eq!(poller.completion_timestamp(), None);
    drop(poller);

    // Classic CQs have none.
    let np = NullProvider::new();
    let cq = np
        .cq(
            false,
            WcFlagsEx::default_ex() | WcFlagsEx::COMPLETION_TIMESTAMP,
        )
        .unwrap();
    np.add_completions(1);
    let mut poller = cq.poll().unwrap();
    assert!(poller.next().is_some());
    assert_eq!(poller.completion_timestamp(), None);
}

#[test]
fn only_the_fields_asked_for_are_read() {
    // The standard set (every classic field) and a smaller set take different paths.
    let np = NullProvider::new();
    let all = np.cq(true, WcFlagsEx::default_ex()).unwrap();
    np.add_completions(1);
    let wc = all.poll().unwrap().next().unwrap();
    assert_eq!(
        (wc.opcode(), wc.byte_len(), wc.qp_num()),
        (WcOpcode::RdmaWrite, 64, 0x11)
    );
    drop(all);

    let np = NullProvider::new();
    let some = np.cq(true, WcFlagsEx::QP_NUM).unwrap();
    assert_eq!(some.wc_flags(), WcFlagsEx::QP_NUM);
    np.add_completions(2);
    let mut out = [sentinel(); 2];
    assert_eq!(some.poll_into(&mut out).unwrap(), 2);
    for (i, wc) in out.iter().enumerate() {
        assert_eq!(wc.wr_id(), i as u64);
        assert_eq!(wc.qp_num(), 0x11, "asked for");
        assert_eq!(wc.byte_len(), 0, "not asked for: left zero");
        assert_eq!(wc.opcode(), WcOpcode::RdmaWrite, "always read");
    }
}

/// Clears one provider function of `np`'s extended CQ.
fn clear(np: &NullProvider, f: impl FnOnce(&mut ibv_cq_ex)) {
    // SAFETY: the provider's CQ is plain memory that nothing else uses meanwhile (no
    // sideway CQ around it is alive in the callers).
    f(unsafe { &mut *np.cq_ex_raw() })
}

#[test]
fn a_provider_missing_a_function_polling_needs_fails_at_creation() {
    let with_ts = WcFlagsEx::default_ex() | WcFlagsEx::COMPLETION_TIMESTAMP;

    let np = NullProvider::new();
    clear(&np, |cq| cq.read_completion_ts = None);
    match np.cq(true, with_ts) {
        Err(e @ CompletionQueueError::MissingFunction { function, .. }) => {
            assert_eq!(function, "read_completion_ts");
            let text = e.to_string();
            assert!(
                text.contains("null") && text.contains("cq_ex->read_completion_ts"),
                "{text}"
            );
        }
        other => panic!("expected MissingFunction, got {other:?}"),
    }
    // Without the flag, the reader is never called and need not be there.
    assert!(np.cq(true, WcFlagsEx::default_ex()).is_ok());
    // A classic CQ uses none of them.
    assert!(np.cq(false, with_ts).is_ok());

    let np = NullProvider::new();
    clear(&np, |cq| cq.start_poll = None);
    assert!(matches!(
        np.cq(true, WcFlagsEx::empty()),
        Err(CompletionQueueError::MissingFunction {
            function: "start_poll",
            ..
        })
    ));

    let np = NullProvider::new();
    clear(&np, |cq| cq.read_byte_len = None);
    assert!(matches!(
        np.cq(true, WcFlagsEx::default_ex()),
        Err(CompletionQueueError::MissingFunction {
            function: "read_byte_len",
            ..
        })
    ));
    assert!(np.cq(true, WcFlagsEx::QP_NUM).is_ok());
}

/// Every field a safe caller can read, to compare two completions.
type Fields = (
    u64,
    String,
    WcOpcode,
    u32,
    u32,
    u32,
    Option<u32>,
    Option<u32>,
);
fn fields(wc: &WorkCompletion) -> (Fields, (u32, u32, u16, u16, u8, u8)) {
    (
        (
            wc.wr_id(),
            format!("{:?}", wc.status()),
            wc.opcode(),
            wc.vendor_err(),
            wc.byte_len(),
            wc.wc_flags().bits(),
            wc.imm_data(),
            wc.invalidated_rkey(),
        ),
        (
            wc.qp_num(),
            wc.src_qp(),
            wc.pkey_index(),
            wc.slid(),
            wc.sl(),
            wc.dlid_path_bits(),
        ),
    )
}

/// An extended CQ's `poll_into` writes each field into the caller's entry as it reads it
/// (no value built first): whatever the entry held before, it then holds what the
/// iterator returns for the same completion, for the standard field set and a smaller one,
/// and the entries past the completions ready are left alone.
#[test]
fn extended_poll_into_leaves_each_entry_as_the_iterator_returns_it() {
    let garbage = WorkCompletion::from(ibv_wc {
        wr_id: u64::MAX,
        status: 7,
        opcode: 0xff,
        vendor_err: 0xdead,
        byte_len: 0xffff_ffff,
        qp_num: 0xbeef,
        src_qp: 0xbeef,
        wc_flags: 0,
        pkey_index: 0xffff,
        slid: 0xffff,
        sl: 0xff,
        dlid_path_bits: 0xff,
        ..Default::default()
    });
    for flags in [WcFlagsEx::default_ex(), WcFlagsEx::QP_NUM | WcFlagsEx::SL] {
        for (ready, room) in [(1usize, 1usize), (3, 5), (32, 32), (40, 32)] {
            let what = format!("{flags:?}: {ready} ready, room for {room}");
            let iterated = NullProvider::new();
            let cq = iterated.cq(true, flags).unwrap();
            iterated.add_completions(ready as u32);
            let expected: Vec<_> = cq
                .poll()
                .unwrap()
                .take(room)
                .map(|wc| fields(&wc))
                .collect();
            let np = NullProvider::new();
            let cq = np.cq(true, flags).unwrap();
            np.add_completions(ready as u32);
            let mut out = vec![garbage; room];
            let got = cq.claim().unwrap().poll_into(&mut out).unwrap();
            assert_eq!(got, ready.min(room), "{what}");
            let polled: Vec<_> = out[..got].iter().map(fields).collect();
            assert_eq!(polled, expected, "{what}");
            assert!(
                out[got..].iter().all(|wc| fields(wc) == fields(&garbage)),
                "{what}: an entry past the completions was written"
            );
        }
    }
}
