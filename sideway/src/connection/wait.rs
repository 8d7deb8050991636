//! [`CompletionWaiter`]: wait for the completions of given work requests on a CQ, keeping
//! those of other work requests for the wait that asks for them.
//!
//! A CQ shared by a QP's send and receive queues does not order a SEND's completion before
//! the completion of the receive that holds the peer's reply to it: a program that waits for
//! one `wr_id` at a time must keep what came early. The waiter polls (spinning briefly,
//! then sleeping so an idle wait costs no CPU) or, given the CQ's completion channel, sleeps
//! in the channel's events; every wait is bounded by its timeout.
//!
//! ```no_run
//! use std::time::Duration;
//! use sideway::connection::CompletionWaiter;
//! # fn demo(cq: &std::sync::Arc<sideway::CompletionQueue>) -> Result<(), Box<dyn std::error::Error>> {
//! const SEND: u64 = 1;
//! const RECV: u64 = 2;
//! let mut waiter = CompletionWaiter::new(cq, Duration::from_secs(5));
//! // ... post a receive (wr_id RECV) and a send (wr_id SEND) ...
//! let reply = waiter.wait(RECV)?; // the send's completion, if it came first, is kept
//! let _sent = waiter.wait(SEND)?; // and handed out here
//! println!("{} bytes came back", reply.byte_len());
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::verbs::async_event::EventError;
use crate::verbs::completion_queue::{
    CompletionChannel, CompletionQueue, CompletionQueueError, WorkCompletion, WorkCompletionError,
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

/// Waits for completions of given `wr_id`s on one CQ; see the [module docs](self).
#[derive(Debug)]
pub struct CompletionWaiter {
    cq: Arc<CompletionQueue>,
    channel: Option<Arc<CompletionChannel>>,
    timeout: Duration,
    early: Vec<WorkCompletion>,
}

impl CompletionWaiter {
    /// A waiter on `cq` that polls, each wait lasting at most `timeout`.
    pub fn new(cq: &Arc<CompletionQueue>, timeout: Duration) -> Self {
        CompletionWaiter {
            cq: Arc::clone(cq),
            channel: None,
            timeout,
            early: Vec::new(),
        }
    }

    /// Sleeps in `channel`'s events instead of polling: `channel` must be the one `cq` was
    /// built with ([`CompletionQueueBuilder::channel`](crate::CompletionQueueBuilder::channel)),
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

    /// Sets how long each wait may take.
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

    /// Like [`wait_all`](Self::wait_all), but calls `stop` whenever the CQ is idle (every
    /// few milliseconds at most) and gives up, returning `Ok(None)`, when it says true: for
    /// waits that another event ends, such as the peer disconnecting. Completions polled
    /// meanwhile stay kept.
    pub fn wait_all_unless<E: From<WaitError>>(
        &mut self,
        wr_ids: &[u64],
        mut stop: impl FnMut() -> Result<bool, E>,
    ) -> Result<Option<Vec<WorkCompletion>>, E> {
        let deadline = Instant::now() + self.timeout;
        let mut got: Vec<Option<WorkCompletion>> = vec![None; wr_ids.len()];
        let early = std::mem::take(&mut self.early);
        for wc in early {
            self.claim(wr_ids, &mut got, wc);
        }
        let mut idle_polls = 0u32;
        while got.iter().any(Option::is_none) {
            if self.poll_into(wr_ids, &mut got)? {
                idle_polls = 0;
                continue;
            }
            if stop()? {
                return Ok(None);
            }
            let now = Instant::now();
            if now >= deadline {
                let missing = wr_ids
                    .iter()
                    .zip(&got)
                    .filter(|(_, g)| g.is_none())
                    .map(|(&id, _)| id)
                    .collect();
                return Err(WaitError::Timeout {
                    missing,
                    timeout: self.timeout,
                }
                .into());
            }
            match self.channel.clone() {
                Some(channel) => {
                    self.cq.req_notify(false).map_err(WaitError::from)?;
                    // A completion that came before the CQ was armed raises no event.
                    if self.poll_into(wr_ids, &mut got)? {
                        continue;
                    }
                    // Short slices, so `stop` is asked now and then.
                    let slice = (deadline - now).min(Duration::from_millis(10));
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
        Ok(Some(got.into_iter().flatten().collect()))
    }

    /// Polls what the CQ has, filing each completion; true when there was any.
    fn poll_into(
        &mut self,
        wr_ids: &[u64],
        got: &mut [Option<WorkCompletion>],
    ) -> Result<bool, WaitError> {
        let cq = Arc::clone(&self.cq);
        let mut poller = cq.poll()?;
        let mut any = false;
        while let Some(wc) = poller.next_completion()? {
            any = true;
            wc.ok()?;
            self.claim(wr_ids, got, wc);
        }
        Ok(any)
    }

    /// Files `wc` under the first unfilled work request of `wr_ids` it completes, or with
    /// the early ones.
    fn claim(&mut self, wr_ids: &[u64], got: &mut [Option<WorkCompletion>], wc: WorkCompletion) {
        let slot = wr_ids
            .iter()
            .zip(got.iter_mut())
            .find(|(&id, g)| id == wc.wr_id() && g.is_none());
        match slot {
            Some((_, g)) => *g = Some(wc),
            None => self.early.push(wc),
        }
    }
}
