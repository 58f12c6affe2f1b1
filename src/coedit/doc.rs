//! The authority's copy of one shared text: its current text and revision,
//! the latest edits (to carry an edit made on an older revision forward),
//! and the last edit taken from each editor (so an edit sent twice, as after
//! a reconnect, is taken once).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use serde::Serialize;

use super::op::{OpError, TextOp};

/// One edit the authority took: the revision it made (its base is the one
/// before), who made it and their number for it, and the operation as
/// carried forward onto the revision before.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Edit {
    /// The revision this edit made.
    pub rev: u64,
    /// The editor that made it (`""` for a whole-text change).
    pub author: String,
    /// The editor's own number for it (0 for a whole-text change).
    pub seq: u64,
    /// What it did to the text at `rev - 1`.
    pub op: TextOp,
}

/// What became of an edit offered to [`TextDoc::edit`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Taken {
    /// Applied as this edit (to publish to every editor).
    Applied(Arc<Edit>),
    /// Taken before (the same editor and number): nothing changed.
    Duplicate,
}

/// Why an edit was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EditError {
    /// Its base revision is newer than the text's.
    #[error("the edit is based on revision {base}, but the text is at revision {rev}")]
    Ahead {
        /// The edit's base.
        base: u64,
        /// The text's revision.
        rev: u64,
    },
    /// Its base revision is older than the edits kept: the editor must
    /// re-base on the current text.
    #[error("the edit is based on revision {base}, older than the edits kept (from {oldest}); re-base on the current text")]
    Behind {
        /// The edit's base.
        base: u64,
        /// The oldest base an edit may have.
        oldest: u64,
    },
    /// The text would pass its length limit.
    #[error("the text would be {len} UTF-16 units long, over the limit of {max}")]
    TooLong {
        /// Units the text would have.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The operation does not fit the text.
    #[error(transparent)]
    Op(#[from] OpError),
}

/// One shared text as the authority keeps it.
#[derive(Debug, Clone)]
pub struct TextDoc {
    text: Vec<u16>,
    rev: u64,
    /// The latest edits, oldest first; the last one made `rev`.
    history: VecDeque<Arc<Edit>>,
    keep: usize,
    max_len: usize,
    /// Each editor's last number taken.
    taken: HashMap<String, u64>,
}

impl TextDoc {
    /// `text` at revision `rev`, keeping the latest `keep` edits and at most
    /// `max_len` UTF-16 units.
    pub fn new(text: &str, rev: u64, keep: usize, max_len: usize) -> Self {
        Self {
            text: text.encode_utf16().collect(),
            rev,
            history: VecDeque::new(),
            keep: keep.max(1),
            max_len,
            taken: HashMap::new(),
        }
    }

    /// The same text as restored from the store: each editor's last number
    /// taken comes with it, so an edit sent again after a restart is still
    /// taken once.
    pub fn restored(
        text: &str,
        rev: u64,
        taken: HashMap<String, u64>,
        keep: usize,
        max_len: usize,
    ) -> Self {
        Self {
            taken,
            ..Self::new(text, rev, keep, max_len)
        }
    }

    /// The current text.
    pub fn text(&self) -> String {
        String::from_utf16_lossy(&self.text)
    }

    /// The current text in UTF-16 units.
    pub fn units(&self) -> &[u16] {
        &self.text
    }

    /// The current revision.
    pub fn rev(&self) -> u64 {
        self.rev
    }

    /// The last number taken from `author` (0: none).
    pub fn taken_from(&self, author: &str) -> u64 {
        self.taken.get(author).copied().unwrap_or(0)
    }

    /// Every editor's last number taken.
    pub fn taken(&self) -> &HashMap<String, u64> {
        &self.taken
    }

    /// The edits after revision `base`, oldest first; `None` when they are
    /// no longer all kept (the editor re-bases on the current text).
    pub fn since(&self, base: u64) -> Option<Vec<Arc<Edit>>> {
        if base > self.rev {
            return None;
        }
        let behind = (self.rev - base) as usize;
        (behind <= self.history.len()).then(|| {
            self.history
                .iter()
                .skip(self.history.len() - behind)
                .cloned()
                .collect()
        })
    }

    /// Take `author`'s edit number `seq`, made on revision `base`: carried
    /// forward over the edits since, applied, and kept.
    pub fn edit(
        &mut self,
        author: &str,
        seq: u64,
        base: u64,
        op: &TextOp,
    ) -> Result<Taken, EditError> {
        if seq != 0 && seq <= self.taken_from(author) {
            return Ok(Taken::Duplicate);
        }
        let Some(concurrent) = self.since(base) else {
            return Err(if base > self.rev {
                EditError::Ahead {
                    base,
                    rev: self.rev,
                }
            } else {
                EditError::Behind {
                    base,
                    oldest: self.rev - self.history.len() as u64,
                }
            });
        };
        let mut op = op.clone();
        for e in &concurrent {
            op = TextOp::transform(&op, &e.op)?.0;
        }
        let edit = self.apply(author, seq, op)?;
        Ok(Taken::Applied(edit))
    }

    /// Make the text `text` (a client that sends whole texts): the change
    /// becomes an edit like any other, so editors carry theirs over it.
    /// `None` when nothing changed.
    pub fn replace(&mut self, text: &str) -> Result<Option<Arc<Edit>>, EditError> {
        let new: Vec<u16> = text.encode_utf16().collect();
        if new == self.text {
            return Ok(None);
        }
        let op = TextOp::diff(&self.text, &new);
        self.apply("", 0, op).map(Some)
    }

    fn apply(&mut self, author: &str, seq: u64, op: TextOp) -> Result<Arc<Edit>, EditError> {
        if op.target_len() > self.max_len && op.target_len() > self.text.len() {
            return Err(EditError::TooLong {
                len: op.target_len(),
                max: self.max_len,
            });
        }
        self.text = op.apply(&self.text)?;
        self.rev += 1;
        if seq != 0 {
            self.taken.insert(author.to_owned(), seq);
        }
        let edit = Arc::new(Edit {
            rev: self.rev,
            author: author.to_owned(),
            seq,
            op,
        });
        self.history.push_back(edit.clone());
        while self.history.len() > self.keep {
            self.history.pop_front();
        }
        Ok(edit)
    }
}
