//! Lending: the lender's side (a lent message begun, the regions the peer returned) and
//! the fetcher's (the descriptor checked, the RDMA READs named, the fetch finished). The
//! rules are in `docs/trespass-protocol.md` §5.1; the state lives in [`Connection`].

use super::{ConnError, Connection, Transmit, READ_CHUNK};
use crate::wire::Lend;

/// The region being fetched: its descriptor and how far the READs got.
#[derive(Debug, Clone, Copy)]
pub(super) struct Fetch {
    pub(super) lend: Lend,
    /// Bytes whose READ was handed out.
    pub(super) posted: u32,
    /// The last READ's work request (signalled), once handed out.
    pub(super) last_wr: Option<u64>,
}

impl Connection {
    /// Begins a lent message: what is committed up to the commit with `ends_message` must
    /// be a [`Lend`] descriptor ([`LEND_LEN`](crate::wire::LEND_LEN) bytes) naming memory the peer may READ until
    /// it returns it ([`poll_returned`](Self::poll_returned)).
    ///
    /// # Errors
    ///
    /// As [`begin_message`](Self::begin_message); [`ConnError::Local`] when this side or the
    /// peer does not lend ([`can_lend`](Self::can_lend)).
    pub fn begin_lend(&mut self) -> Result<(), ConnError> {
        if !self.can_lend() {
            return Err(ConnError::Local(
                "the peer does not take lent buffers (its hello has no lends flag)".into(),
            ));
        }
        self.begin_message()?;
        self.lend_starts.push_back(self.app_tail);
        self.lends_begun += 1;
        Ok(())
    }

    /// True when both sides said they lend: [`begin_lend`](Self::begin_lend) may be used.
    pub fn can_lend(&self) -> bool {
        self.limits.lends && self.peer.lends
    }

    /// Regions lent (begun with [`begin_lend`](Self::begin_lend)) and not yet returned.
    pub fn lent_outstanding(&self) -> u64 {
        self.lends_begun - self.returned
    }

    /// Lent regions the peer returned so far, in all: a waiter compares it with what it
    /// saw before waiting.
    pub fn returned_total(&self) -> u64 {
        self.returned
    }

    /// How many more lent regions the peer returned since the last call, oldest first: the
    /// driver revokes their keys and gives their memory back.
    pub fn poll_returned(&mut self) -> u64 {
        let n = self.returned - self.returned_taken;
        self.returned_taken = self.returned;
        n
    }

    /// Starts fetching the region whose descriptor the application just consumed (a
    /// [`RecvWindow`](super::RecvWindow) with `lent` set, read whole): [`poll_transmit`](Self::poll_transmit)
    /// then names the RDMA READs that bring it over.
    ///
    /// # Errors
    ///
    /// The connection's error; [`ConnError::Protocol`] when the descriptor is bad (this
    /// fails the connection); [`ConnError::Local`] when a fetch is already running.
    pub fn begin_fetch(&mut self, descriptor: &[u8]) -> Result<(), ConnError> {
        self.check()?;
        if self.fetch.is_some() {
            return Err(ConnError::Local(
                "a fetch begun while another is running".into(),
            ));
        }
        match Lend::decode(descriptor, self.limits.max_message) {
            Ok(lend) => {
                self.fetch = Some(Fetch {
                    lend,
                    posted: 0,
                    last_wr: None,
                });
                Ok(())
            }
            Err(e) => {
                self.protocol(e.to_string());
                Err(ConnError::Protocol(e.to_string()))
            }
        }
    }

    /// The region being fetched, if any.
    pub fn fetching(&self) -> Option<&Lend> {
        self.fetch.as_ref().map(|f| &f.lend)
    }

    /// True once every READ of the region being fetched completed successfully: its bytes
    /// are in the target.
    pub fn fetch_done(&self) -> bool {
        self.fetch.as_ref().is_some_and(|f| {
            f.posted == f.lend.len && f.last_wr.is_some_and(|last| last < self.wr_done)
        })
    }

    /// Ends a fetch that is [done](Self::fetch_done): the region goes back to the peer (a
    /// RETURN is sent). Returns its length; `None` when no fetch is done.
    pub fn finish_fetch(&mut self) -> Option<u32> {
        if !self.fetch_done() {
            return None;
        }
        let f = self.fetch.take()?;
        self.returns_due += 1;
        Some(f.lend.len)
    }

    /// The next RDMA READ of the region being fetched, while the send queue has room.
    pub(super) fn read_transmit(&mut self) -> Option<Transmit> {
        if self.error.is_some() || self.broken.is_some() || self.sq_free() == 0 {
            return None;
        }
        let f = self.fetch?;
        if f.posted == f.lend.len {
            return None;
        }
        let len = (f.lend.len - f.posted).min(READ_CHUNK);
        let last = f.posted + len == f.lend.len;
        // The last is signalled: its completion says every READ before it landed.
        let mut t = self.alloc_wr(last);
        t.read = true;
        t.local_offset = f.posted;
        t.remote_offset = f.posted;
        t.len = len;
        self.read_wrs.push_back(t.wr_id);
        let f = self.fetch.as_mut()?;
        f.posted += len;
        if last {
            f.last_wr = Some(t.wr_id);
        }
        Some(t)
    }
}
