use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::verbs::async_event::EventError;
use crate::verbs::completion_channel::CompletionChannel;
use crate::verbs::completion_queue::{
    CompletionQueue, CompletionQueueError, WorkCompletion, WorkCompletionError,
};

/// Why a wait for completions ended without them.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WaitError {
    /// Polling the CQ failed.
    #[error(transparent)]
    Poll(#[from] CompletionQueueError),
    /// Arming the CQ or reading its channel failed.
    #[error(transparent)]
    Event(#[from] EventError),
    /// A work request completed with an error (any work request: after an error the QP is
    /// in the error state and nothing else it has posted will succeed).
    #[error(transparent)]
    Failed(#[from] WorkCompletionError),
    /// The completions did not all come in time.
    #[error(
        "no completion of work request(s) {missing:?} within {timeout:?} (is the peer still \
         there, and did it post what this side waits for?)"
    )]
    Timeout {
        /// The `wr_id`s still missing.
        missing: Vec<u64>,
        /// How long was waited.
        timeout: Duration,
    },
}

/// Waits for the completions of given work requests on a CQ, keeping
/// those of other work requests for the wait that asks for them.
///
/// A CQ shared by a QP's send and receive queues does not order a SEND's completion before
/// the completion of the receive that holds the peer's reply to it: a program that waits for
/// one `wr_id` at a time must keep what came early. The waiter polls (spinning briefly,
/// then sleeping so an idle wait costs no CPU) or, given the CQ's completion channel, sleeps
/// in the channel's events; every wait is bounded by its timeout, unless that is
/// [`CompletionWaiter::NO_TIMEOUT`].
///
/// [`wait`](CompletionWaiter::wait) and [`wait_all`](CompletionWaiter::wait_all) wait for
/// given work requests; [`wait_any`](CompletionWaiter::wait_any) for whichever of several
/// completes first (a receive or the send, say).
///
/// ```no_run
/// use std::time::Duration;
/// use sideway::connection::CompletionWaiter;
/// # fn demo(cq: &std::sync::Arc<sideway::completion_queue::CompletionQueue>) -> Result<(), Box<dyn std::error::Error>> {
/// const SEND: u64 = 1;
/// const RECV: u64 = 2;
/// let mut waiter = CompletionWaiter::new(cq, Duration::from_secs(5));
/// // ... post a receive (wr_id RECV) and a send (wr_id SEND) ...
/// let reply = waiter.wait(RECV)?; // the send's completion, if it came first, is kept
/// let _sent = waiter.wait(SEND)?; // and handed out here
/// println!("{} bytes came back", reply.byte_len());
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct CompletionWaiter {
    cq: Arc<CompletionQueue>,
    channel: Option<Arc<CompletionChannel>>,
    timeout: Duration,
    early: Vec<WorkCompletion>,
}

impl CompletionWaiter {
    /// The timeout of a waiter whose waits have no deadline: pass it to [`new`](Self::new)
    /// or [`set_timeout`](Self::set_timeout). (Any timeout too long to add to the current
    /// time means the same.) Such a wait ends only with its completions, an error, or its
    /// `stop` ([`wait_all_unless`](Self::wait_all_unless)); a wait for a peer that left
    /// needs a `stop` that watches for it (see the [connection docs](super)).
    pub const NO_TIMEOUT: Duration = Duration::MAX;

    /// A waiter on `cq` that polls, each wait lasting at most `timeout`
    /// ([`NO_TIMEOUT`](Self::NO_TIMEOUT): as long as it takes).
    pub fn new(cq: &Arc<CompletionQueue>, timeout: Duration) -> Self {
        CompletionWaiter {
            cq: Arc::clone(cq),
            channel: None,
            timeout,
            early: Vec::new(),
        }
    }

    /// Sleeps in `channel`'s events instead of polling: `channel` must be the one `cq` was
    /// built with
    /// ([`CompletionQueueBuilder::channel`](crate::completion_queue::CompletionQueueBuilder::channel)),
    /// and no one else may read it while this waiter waits. Each wait arms the CQ
    /// (`ibv_req_notify_cq`), polls once more, and then sleeps in `ibv_get_cq_event`.
    pub fn with_channel(mut self, channel: &Arc<CompletionChannel>) -> Self {
        self.channel = Some(Arc::clone(channel));
        self
    }

    /// The CQ waited on.
    pub fn cq(&self) -> &Arc<CompletionQueue> {
        &self.cq
    }

    /// How long each wait may take.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sets how long each wait may take ([`NO_TIMEOUT`](Self::NO_TIMEOUT): as long as it
    /// takes).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Completions polled that no wait has asked for yet, oldest first.
    pub fn early(&self) -> &[WorkCompletion] {
        &self.early
    }

    /// Waits for the successful completion of work request `wr_id`.
    pub fn wait(&mut self, wr_id: u64) -> Result<WorkCompletion, WaitError> {
        let mut got = self.wait_all(&[wr_id])?;
        // One id was asked for, so exactly one completion is there.
        Ok(got.remove(0))
    }

    /// Waits for the successful completions of all of `wr_ids`, returned in the order of
    /// `wr_ids`. A `wr_id` named twice takes two completions.
    pub fn wait_all(&mut self, wr_ids: &[u64]) -> Result<Vec<WorkCompletion>, WaitError> {
        match self.wait_all_unless(wr_ids, || Ok::<bool, WaitError>(false))? {
            Some(wcs) => Ok(wcs),
            // `stop` never says stop.
            None => Err(WaitError::Timeout {
                missing: wr_ids.to_vec(),
                timeout: self.timeout,
            }),
        }
    }

    /// Waits for the successful completion of whichever of `wr_ids` completes first (the
    /// oldest kept one, if one was polled already) and returns it; completions of the others
    /// stay kept for later waits.
    pub fn wait_any(&mut self, wr_ids: &[u64]) -> Result<WorkCompletion, WaitError> {
        let mut want = Any { wr_ids, got: None };
        if self.run(&mut want, || Ok::<bool, WaitError>(false))? {
            if let Some(wc) = want.got {
                return Ok(wc);
            }
        }
        // `stop` never says stop, and a finished wait holds its completion.
        Err(WaitError::Timeout {
            missing: wr_ids.to_vec(),
            timeout: self.timeout,
        })
    }

    /// Like [`wait_all`](Self::wait_all), but calls `stop` whenever the CQ is idle (every
    /// few milliseconds at most) and gives up, returning `Ok(None)`, when it says true: for
    /// waits that another event ends, such as the peer disconnecting. Completions polled
    /// meanwhile stay kept.
    pub fn wait_all_unless<E: From<WaitError>>(
        &mut self,
        wr_ids: &[u64],
        stop: impl FnMut() -> Result<bool, E>,
    ) -> Result<Option<Vec<WorkCompletion>>, E> {
        let mut want = All {
            wr_ids,
            got: vec![None; wr_ids.len()],
        };
        if !self.run(&mut want, stop)? {
            return Ok(None);
        }
        Ok(Some(want.got.into_iter().flatten().collect()))
    }

    /// Polls until `want` is satisfied (true) or `stop` says stop (false); fails on a failed
    /// completion or at the deadline.
    fn run<E: From<WaitError>>(
        &mut self,
        want: &mut impl Want,
        mut stop: impl FnMut() -> Result<bool, E>,
    ) -> Result<bool, E> {
        let deadline = deadline(Instant::now(), self.timeout);
        let early = std::mem::take(&mut self.early);
        for wc in early {
            self.file(want, wc);
        }
        let mut idle_polls = 0u32;
        while !want.done() {
            if self.poll_into(want)? {
                idle_polls = 0;
                continue;
            }
            if stop()? {
                return Ok(false);
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Err(WaitError::Timeout {
                    missing: want.missing(),
                    timeout: self.timeout,
                }
                .into());
            }
            match self.channel.clone() {
                Some(channel) => {
                    self.cq.req_notify(false).map_err(WaitError::from)?;
                    // A completion that came before the CQ was armed raises no event.
                    if self.poll_into(want)? {
                        continue;
                    }
                    // Short slices, so `stop` is asked now and then.
                    let slice = deadline
                        .map_or(Duration::MAX, |d| d - now)
                        .min(Duration::from_millis(10));
                    match channel.get_cq_event(Some(slice)) {
                        Ok(_) | Err(EventError::Timeout { .. }) => {}
                        Err(e) => return Err(WaitError::from(e).into()),
                    }
                }
                None => {
                    // Spin briefly for latency, then sleep so an idle wait costs no CPU.
                    idle_polls += 1;
                    if idle_polls < 2000 {
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                }
            }
        }
        Ok(true)
    }

    /// Polls what the CQ has, filing each completion; true when there was any.
    fn poll_into(&mut self, want: &mut impl Want) -> Result<bool, WaitError> {
        let cq = Arc::clone(&self.cq);
        let mut poller = cq.poll()?;
        let mut any = false;
        while let Some(wc) = poller.next_completion()? {
            any = true;
            wc.ok()?;
            self.file(want, wc);
        }
        Ok(any)
    }

    /// Gives `wc` to `want`, or keeps it with the early ones.
    fn file(&mut self, want: &mut impl Want, wc: WorkCompletion) {
        if let Some(wc) = want.offer(wc) {
            self.early.push(wc);
        }
    }
}

/// When a wait of `timeout` that starts at `now` ends; `None`: never
/// ([`CompletionWaiter::NO_TIMEOUT`], or any timeout past what an `Instant` can hold).
fn deadline(now: Instant, timeout: Duration) -> Option<Instant> {
    now.checked_add(timeout)
}

/// What a wait is for: the completions it takes, and when it has them all.
trait Want {
    /// Takes `wc` if this wait wants it; gives it back otherwise.
    fn offer(&mut self, wc: WorkCompletion) -> Option<WorkCompletion>;
    /// Whether the wait has what it waits for.
    fn done(&self) -> bool;
    /// The `wr_id`s still missing, for the timeout's error.
    fn missing(&self) -> Vec<u64>;
}

/// Every one of `wr_ids`, in their order; an id named twice takes two completions.
struct All<'a> {
    wr_ids: &'a [u64],
    got: Vec<Option<WorkCompletion>>,
}

impl Want for All<'_> {
    fn offer(&mut self, wc: WorkCompletion) -> Option<WorkCompletion> {
        let slot = self
            .wr_ids
            .iter()
            .zip(self.got.iter_mut())
            .find(|(&id, g)| id == wc.wr_id() && g.is_none());
        match slot {
            Some((_, g)) => {
                *g = Some(wc);
                None
            }
            None => Some(wc),
        }
    }

    fn done(&self) -> bool {
        self.got.iter().all(Option::is_some)
    }

    fn missing(&self) -> Vec<u64> {
        self.wr_ids
            .iter()
            .zip(&self.got)
            .filter(|(_, g)| g.is_none())
            .map(|(&id, _)| id)
            .collect()
    }
}

/// The first completion of any of `wr_ids`.
struct Any<'a> {
    wr_ids: &'a [u64],
    got: Option<WorkCompletion>,
}

impl Want for Any<'_> {
    fn offer(&mut self, wc: WorkCompletion) -> Option<WorkCompletion> {
        if self.got.is_none() && self.wr_ids.contains(&wc.wr_id()) {
            self.got = Some(wc);
            None
        } else {
            Some(wc)
        }
    }

    fn done(&self) -> bool {
        self.got.is_some()
    }

    fn missing(&self) -> Vec<u64> {
        self.wr_ids.to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wc(wr_id: u64) -> WorkCompletion {
        WorkCompletion::from(rdma_mummy_sys::ibv_wc {
            wr_id,
            ..Default::default()
        })
    }

    #[test]
    fn any_takes_the_first_of_its_ids_and_leaves_the_rest() {
        let mut want = Any {
            wr_ids: &[2, 3],
            got: None,
        };
        assert!(!want.done());
        assert_eq!(want.offer(wc(1)).map(|w| w.wr_id()), Some(1));
        assert!(want.offer(wc(3)).is_none());
        assert!(want.done());
        // Once it has one, the others are kept for later waits.
        assert_eq!(want.offer(wc(2)).map(|w| w.wr_id()), Some(2));
        assert_eq!(want.got.map(|w| w.wr_id()), Some(3));
        assert_eq!(want.missing(), [2, 3]);
    }

    #[test]
    fn all_fills_each_id_once_in_order() {
        let mut want = All {
            wr_ids: &[5, 5, 6],
            got: vec![None; 3],
        };
        assert!(want.offer(wc(6)).is_none());
        assert!(want.offer(wc(5)).is_none());
        assert_eq!(want.missing(), [5]);
        assert_eq!(want.offer(wc(7)).map(|w| w.wr_id()), Some(7));
        assert!(want.offer(wc(5)).is_none());
        assert!(want.done());
        assert_eq!(want.offer(wc(5)).map(|w| w.wr_id()), Some(5));
    }

    #[test]
    fn no_timeout_means_no_deadline() {
        let now = Instant::now();
        assert_eq!(deadline(now, CompletionWaiter::NO_TIMEOUT), None);
        assert_eq!(
            deadline(now, Duration::from_secs(5)),
            Some(now + Duration::from_secs(5))
        );
    }
}
