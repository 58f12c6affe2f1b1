//! One editor's side of a shared text: what it shows, the edit it sent and
//! waits to see taken, and what it typed since (sent when that one is
//! taken: one edit in flight at a time). Edits of others are carried over
//! its own before they are shown, so its typing is never undone.
//!
//! The load generator and the tests edit through this; the browser client
//! does the same in JavaScript (`web/`).

use std::sync::Arc;

use super::doc::Edit;
use super::op::{OpError, TextOp};

/// An edit to send to the authority.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outgoing {
    /// This editor's number for it.
    pub seq: u64,
    /// The revision it was made on.
    pub base: u64,
    /// What it does.
    pub op: TextOp,
}

/// What an edit from the authority did here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Received {
    /// Another editor's edit, as applied to what this editor shows (carry
    /// carets over it).
    Remote(TextOp),
    /// This editor's own edit was taken; what it typed since goes next.
    Acked(Option<Outgoing>),
    /// Already seen (an edit the catch-up also carried).
    Old,
}

/// Why an edit from the authority cannot be used here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// Edits were missed: catch up from [`TextClient::rev`] (or re-base).
    #[error("missed edits: at revision {have}, got one making {got}")]
    Gap {
        /// This editor's revision.
        have: u64,
        /// The revision of the edit received.
        got: u64,
    },
    /// The edit does not fit the text.
    #[error(transparent)]
    Op(#[from] OpError),
}

/// One editor of a shared text.
#[derive(Debug, Clone)]
pub struct TextClient {
    author: String,
    rev: u64,
    /// The authority's text at `rev`.
    server: Vec<u16>,
    /// What this editor shows.
    text: Vec<u16>,
    /// Sent, not yet seen taken: its number and the operation, carried
    /// forward to `rev`.
    sent: Option<(u64, TextOp)>,
    /// Typed since `sent` went, composed into one.
    buffer: Option<TextOp>,
    next_seq: u64,
    /// The connection `sent` went over was lost: the catch-up sends it
    /// again (over one connection an edit is in flight once).
    sent_lost: bool,
}

impl TextClient {
    /// Editor `author` of `text` at revision `rev`. `author` must be unique
    /// among the text's editors for as long as it edits.
    pub fn new(author: impl Into<String>, text: &str, rev: u64) -> Self {
        let units: Vec<u16> = text.encode_utf16().collect();
        Self {
            author: author.into(),
            rev,
            server: units.clone(),
            text: units,
            sent: None,
            buffer: None,
            next_seq: 1,
            sent_lost: false,
        }
    }

    /// This editor's name.
    pub fn author(&self) -> &str {
        &self.author
    }

    /// The last revision seen.
    pub fn rev(&self) -> u64 {
        self.rev
    }

    /// What this editor shows.
    pub fn text(&self) -> String {
        String::from_utf16_lossy(&self.text)
    }

    /// What this editor shows, in UTF-16 units.
    pub fn units(&self) -> &[u16] {
        &self.text
    }

    /// Whether everything typed here was taken.
    pub fn settled(&self) -> bool {
        self.sent.is_none() && self.buffer.is_none()
    }

    /// The edit in flight, to send again after a reconnect once the
    /// catch-up is applied (the authority takes it once).
    pub fn in_flight(&self) -> Option<Outgoing> {
        self.sent.as_ref().map(|(seq, op)| Outgoing {
            seq: *seq,
            base: self.rev,
            op: op.clone(),
        })
    }

    /// The person typed `op` (on what this editor shows). Returns the edit
    /// to send now, if none is in flight.
    pub fn local(&mut self, op: TextOp) -> Result<Option<Outgoing>, OpError> {
        self.text = op.apply(&self.text)?;
        if self.sent.is_none() {
            return Ok(Some(self.send(op)));
        }
        self.buffer = Some(match self.buffer.take() {
            Some(b) => b.compose(&op)?,
            None => op,
        });
        Ok(None)
    }

    /// The connection dropped: the edit in flight may never have arrived,
    /// so the next catch-up sends it again.
    pub fn connection_lost(&mut self) {
        self.sent_lost = self.sent.is_some();
    }

    fn send(&mut self, op: TextOp) -> Outgoing {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.sent_lost = false;
        self.sent = Some((seq, op.clone()));
        Outgoing {
            seq,
            base: self.rev,
            op,
        }
    }

    /// An edit the authority published (in revision order).
    pub fn receive(&mut self, edit: &Edit) -> Result<Received, ClientError> {
        if edit.rev <= self.rev {
            return Ok(Received::Old);
        }
        if edit.rev != self.rev + 1 {
            return Err(ClientError::Gap {
                have: self.rev,
                got: edit.rev,
            });
        }
        self.server = edit.op.apply(&self.server)?;
        self.rev = edit.rev;
        let own = edit.author == self.author
            && self.sent.as_ref().is_some_and(|(seq, _)| *seq == edit.seq);
        if own {
            self.sent = None;
            let next = self.buffer.take().map(|b| self.send(b));
            return Ok(Received::Acked(next));
        }
        let mut op = edit.op.clone();
        if let Some((seq, sent)) = self.sent.take() {
            let (sent2, op2) = TextOp::transform(&sent, &op)?;
            self.sent = Some((seq, sent2));
            op = op2;
        }
        if let Some(buffer) = self.buffer.take() {
            let (buffer2, op2) = TextOp::transform(&buffer, &op)?;
            self.buffer = Some(buffer2);
            op = op2;
        }
        self.text = op.apply(&self.text)?;
        Ok(Received::Remote(op))
    }

    /// Edits the authority published since [`TextClient::rev`] (a
    /// catch-up), in order; then the edit in flight, if still untaken and
    /// sent over a connection that was lost, is sent again (one sent over
    /// the live connection is still on its way: sending it twice there
    /// could have an answer about one copy arrive after the other copy
    /// was taken).
    pub fn catch_up(&mut self, edits: &[Arc<Edit>]) -> Result<Option<Outgoing>, ClientError> {
        let mut next = None;
        for e in edits {
            if let Received::Acked(n) = self.receive(e)? {
                next = n;
            }
        }
        if next.is_none() && std::mem::take(&mut self.sent_lost) {
            next = self.in_flight();
        }
        Ok(next)
    }

    /// Re-base on the authority's current `text` at `rev` when the edits
    /// since this editor's revision are no longer kept. `taken` is the last
    /// number the authority took from this editor. What this editor typed
    /// and the authority does not have yet is carried over the difference
    /// between the text it knew and `text`, and sent as one edit. Returns
    /// what changed in what this editor shows, and the edit to send.
    pub fn rebase(
        &mut self,
        text: &str,
        rev: u64,
        taken: u64,
    ) -> Result<(TextOp, Option<Outgoing>), OpError> {
        let latest: Vec<u16> = text.encode_utf16().collect();
        // The text the authority had when it took what it took from here,
        // as far as this editor can tell, and what it has not taken.
        let (known, mine) = match self.sent.take() {
            Some((seq, sent)) if seq <= taken => (sent.apply(&self.server)?, self.buffer.take()),
            Some((_, sent)) => {
                let pending = match self.buffer.take() {
                    Some(b) => sent.compose(&b)?,
                    None => sent,
                };
                (self.server.clone(), Some(pending))
            }
            None => (self.server.clone(), self.buffer.take()),
        };
        let theirs = TextOp::diff(&known, &latest);
        let before = std::mem::take(&mut self.text);
        self.server = latest.clone();
        self.rev = rev;
        let out = match mine {
            Some(mine) => {
                let (mine2, _) = TextOp::transform(&mine, &theirs)?;
                self.text = mine2.apply(&latest)?;
                (!mine2.is_noop()).then(|| self.send(mine2))
            }
            None => {
                self.text = latest;
                None
            }
        };
        Ok((TextOp::diff(&before, &self.text), out))
    }
}
