//! One edit of a text as an operation: a walk over the whole old text that
//! retains, inserts and deletes, counted in UTF-16 code units (what a
//! browser's selection counts, and what JSON strings index).
//!
//! On the wire an operation is a JSON array: a positive integer retains that
//! many units, a negative one deletes that many, a string inserts itself —
//! `[5, "ab", -3]` keeps five units, inserts `ab` and deletes the next three.
//! The lengths must cover the old text exactly.
//!
//! [`TextOp::transform`] is the heart of concurrent editing: two operations
//! made on the same text become two that can follow each other, in either
//! order, to the same result; every inserted character survives, and when
//! both insert at one place the first operation's text goes first.

use std::time::{Duration, Instant};

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// One step of an operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Keep this many units of the old text.
    Retain(usize),
    /// Insert these units.
    Insert(Vec<u16>),
    /// Drop this many units of the old text.
    Delete(usize),
}

/// Why an operation cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpError {
    /// It walks a text of another length than the one it is applied to.
    #[error("the edit covers {op} units but the text has {text}")]
    Length {
        /// Units the operation walks.
        op: usize,
        /// Units of the text.
        text: usize,
    },
    /// The result would split a character in two (half a surrogate pair).
    #[error("the edit splits a character in two")]
    SplitsCharacter,
    /// Not an array of non-zero integers and non-empty strings.
    #[error("malformed edit: {0}")]
    Malformed(String),
}

/// An operation over a text of [`TextOp::base_len`] units, giving one of
/// [`TextOp::target_len`]. Kept canonical (no empty steps, neighbours of
/// one kind merged, an insert before a delete at the same place), so equal
/// edits compare equal.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TextOp {
    steps: Vec<Step>,
    base_len: usize,
    target_len: usize,
}

impl TextOp {
    /// The empty operation (over the empty text).
    pub fn new() -> Self {
        Self::default()
    }

    /// Keep `n` units.
    pub fn retain(&mut self, n: usize) -> &mut Self {
        if n == 0 {
            return self;
        }
        self.base_len += n;
        self.target_len += n;
        match self.steps.last_mut() {
            Some(Step::Retain(m)) => *m += n,
            _ => self.steps.push(Step::Retain(n)),
        }
        self
    }

    /// Insert `units`.
    pub fn insert(&mut self, units: &[u16]) -> &mut Self {
        if units.is_empty() {
            return self;
        }
        self.target_len += units.len();
        let n = self.steps.len();
        match self.steps.as_mut_slice() {
            [.., Step::Insert(s)] | [.., Step::Insert(s), Step::Delete(_)] => {
                s.extend_from_slice(units)
            }
            [.., Step::Delete(_)] => self.steps.insert(n - 1, Step::Insert(units.to_vec())),
            _ => self.steps.push(Step::Insert(units.to_vec())),
        }
        self
    }

    /// Insert `text`.
    pub fn insert_str(&mut self, text: &str) -> &mut Self {
        let units: Vec<u16> = text.encode_utf16().collect();
        self.insert(&units)
    }

    /// Drop `n` units.
    pub fn delete(&mut self, n: usize) -> &mut Self {
        if n == 0 {
            return self;
        }
        self.base_len += n;
        match self.steps.last_mut() {
            Some(Step::Delete(m)) => *m += n,
            _ => self.steps.push(Step::Delete(n)),
        }
        self
    }

    /// The steps, canonical.
    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// Units of the text it applies to.
    pub fn base_len(&self) -> usize {
        self.base_len
    }

    /// Units of the text it gives.
    pub fn target_len(&self) -> usize {
        self.target_len
    }

    /// Whether it changes nothing.
    pub fn is_noop(&self) -> bool {
        self.steps.iter().all(|s| matches!(s, Step::Retain(_)))
    }

    /// The operation that keeps a text of `len` units as it is.
    pub fn identity(len: usize) -> Self {
        let mut op = Self::new();
        op.retain(len);
        op
    }

    /// Apply to `text` (UTF-16 units).
    pub fn apply(&self, text: &[u16]) -> Result<Vec<u16>, OpError> {
        if text.len() != self.base_len {
            return Err(OpError::Length {
                op: self.base_len,
                text: text.len(),
            });
        }
        let mut out = Vec::with_capacity(self.target_len);
        let mut at = 0;
        for step in &self.steps {
            match step {
                Step::Retain(n) => {
                    out.extend_from_slice(&text[at..at + n]);
                    at += n;
                }
                Step::Insert(s) => out.extend_from_slice(s),
                Step::Delete(n) => at += n,
            }
        }
        if char::decode_utf16(out.iter().copied()).any(|c| c.is_err()) {
            return Err(OpError::SplitsCharacter);
        }
        Ok(out)
    }

    /// Apply to `text`.
    pub fn apply_str(&self, text: &str) -> Result<String, OpError> {
        let units: Vec<u16> = text.encode_utf16().collect();
        let out = self.apply(&units)?;
        String::from_utf16(&out).map_err(|_| OpError::SplitsCharacter)
    }

    /// This operation followed by `next`, as one.
    pub fn compose(&self, next: &TextOp) -> Result<TextOp, OpError> {
        if self.target_len != next.base_len {
            return Err(OpError::Length {
                op: next.base_len,
                text: self.target_len,
            });
        }
        let mut out = TextOp::new();
        let (mut a, mut b) = (Cursor::new(&self.steps), Cursor::new(&next.steps));
        loop {
            match (a.peek(), b.peek()) {
                (None, None) => return Ok(out),
                (Some(Part::Delete(n)), _) => {
                    out.delete(n);
                    a.advance(n);
                }
                (_, Some(Part::Insert(s))) => {
                    out.insert(s);
                    b.advance(s.len());
                }
                (None, _) | (_, None) => return Err(malformed("compose: lengths differ")),
                (Some(Part::Retain(x)), Some(Part::Retain(y))) => {
                    let n = x.min(y);
                    out.retain(n);
                    a.advance(n);
                    b.advance(n);
                }
                (Some(Part::Insert(s)), Some(Part::Delete(y))) => {
                    let n = s.len().min(y);
                    a.advance(n);
                    b.advance(n);
                }
                (Some(Part::Insert(s)), Some(Part::Retain(y))) => {
                    let n = s.len().min(y);
                    out.insert(&s[..n]);
                    a.advance(n);
                    b.advance(n);
                }
                (Some(Part::Retain(x)), Some(Part::Delete(y))) => {
                    let n = x.min(y);
                    out.delete(n);
                    a.advance(n);
                    b.advance(n);
                }
            }
        }
    }

    /// `a` and `b` were made on the same text; returns `(a', b')` such that
    /// `b` then `a'` and `a` then `b'` give the same text. What both insert
    /// at one place comes out with `a`'s text first; what both delete is
    /// deleted once.
    pub fn transform(a: &TextOp, b: &TextOp) -> Result<(TextOp, TextOp), OpError> {
        if a.base_len != b.base_len {
            return Err(OpError::Length {
                op: a.base_len,
                text: b.base_len,
            });
        }
        let (mut a2, mut b2) = (TextOp::new(), TextOp::new());
        let (mut x, mut y) = (Cursor::new(&a.steps), Cursor::new(&b.steps));
        loop {
            match (x.peek(), y.peek()) {
                (None, None) => return Ok((a2, b2)),
                (Some(Part::Insert(s)), _) => {
                    a2.insert(s);
                    b2.retain(s.len());
                    x.advance(s.len());
                }
                (_, Some(Part::Insert(s))) => {
                    a2.retain(s.len());
                    b2.insert(s);
                    y.advance(s.len());
                }
                (None, _) | (_, None) => return Err(malformed("transform: lengths differ")),
                (Some(Part::Retain(m)), Some(Part::Retain(n))) => {
                    let k = m.min(n);
                    a2.retain(k);
                    b2.retain(k);
                    x.advance(k);
                    y.advance(k);
                }
                (Some(Part::Delete(m)), Some(Part::Delete(n))) => {
                    let k = m.min(n);
                    x.advance(k);
                    y.advance(k);
                }
                (Some(Part::Delete(m)), Some(Part::Retain(n))) => {
                    let k = m.min(n);
                    a2.delete(k);
                    x.advance(k);
                    y.advance(k);
                }
                (Some(Part::Retain(m)), Some(Part::Delete(n))) => {
                    let k = m.min(n);
                    b2.delete(k);
                    x.advance(k);
                    y.advance(k);
                }
            }
        }
    }

    /// Where a caret at `index` (in the old text) is after this operation:
    /// text inserted before it pushes it on, a deleted range around it pulls
    /// it to the range's start. Text inserted exactly at the caret goes
    /// after an `own` caret (the person typing there goes on typing their
    /// word) and before anyone else's.
    pub fn transform_index(&self, index: usize, own: bool) -> usize {
        let mut left = index;
        let mut moved = index;
        for step in &self.steps {
            match step {
                Step::Retain(n) if *n > left => break,
                Step::Retain(n) => left -= n,
                Step::Insert(_) if own && left == 0 => break,
                Step::Insert(s) => moved += s.len(),
                Step::Delete(n) => {
                    moved -= left.min(*n);
                    if *n > left {
                        break;
                    }
                    left -= n;
                }
            }
        }
        moved
    }

    /// The operation from `old` to `new` (character by character, Myers;
    /// a diff that would take longer than a few milliseconds settles for a
    /// coarser one). Both must be valid UTF-16.
    pub fn diff(old: &[u16], new: &[u16]) -> TextOp {
        let chars = |t: &[u16]| -> Vec<char> {
            char::decode_utf16(t.iter().copied())
                .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
                .collect()
        };
        let (a, b) = (chars(old), chars(new));
        let units = |cs: &[char]| -> usize { cs.iter().map(|c| c.len_utf16()).sum() };
        let deadline = Instant::now() + Duration::from_millis(20);
        let ops = similar::capture_diff_slices_deadline(
            similar::Algorithm::Myers,
            &a,
            &b,
            Some(deadline),
        );
        let mut op = TextOp::new();
        let mut buf = [0u16; 2];
        let mut insert = |op: &mut TextOp, cs: &[char]| {
            for c in cs {
                op.insert(c.encode_utf16(&mut buf));
            }
        };
        for d in ops {
            match d {
                similar::DiffOp::Equal { old_index, len, .. } => {
                    op.retain(units(&a[old_index..old_index + len]));
                }
                similar::DiffOp::Delete {
                    old_index, old_len, ..
                } => {
                    op.delete(units(&a[old_index..old_index + old_len]));
                }
                similar::DiffOp::Insert {
                    new_index, new_len, ..
                } => insert(&mut op, &b[new_index..new_index + new_len]),
                similar::DiffOp::Replace {
                    old_index,
                    old_len,
                    new_index,
                    new_len,
                } => {
                    insert(&mut op, &b[new_index..new_index + new_len]);
                    op.delete(units(&a[old_index..old_index + old_len]));
                }
            }
        }
        op
    }
}

fn malformed(why: &str) -> OpError {
    OpError::Malformed(why.to_owned())
}

/// What is left of the current step.
#[derive(Clone, Copy)]
enum Part<'a> {
    Retain(usize),
    Insert(&'a [u16]),
    Delete(usize),
}

/// A walk over steps that can stop inside one.
struct Cursor<'a> {
    steps: &'a [Step],
    i: usize,
    off: usize,
}

impl<'a> Cursor<'a> {
    fn new(steps: &'a [Step]) -> Self {
        Self {
            steps,
            i: 0,
            off: 0,
        }
    }

    fn peek(&self) -> Option<Part<'a>> {
        Some(match self.steps.get(self.i)? {
            Step::Retain(n) => Part::Retain(n - self.off),
            Step::Insert(s) => Part::Insert(&s[self.off..]),
            Step::Delete(n) => Part::Delete(n - self.off),
        })
    }

    fn advance(&mut self, n: usize) {
        self.off += n;
        let len = match &self.steps[self.i] {
            Step::Retain(n) | Step::Delete(n) => *n,
            Step::Insert(s) => s.len(),
        };
        if self.off >= len {
            self.i += 1;
            self.off = 0;
        }
    }
}

impl Serialize for TextOp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = s.serialize_seq(Some(self.steps.len()))?;
        for step in &self.steps {
            match step {
                Step::Retain(n) => seq.serialize_element(&(*n as i64))?,
                Step::Delete(n) => seq.serialize_element(&-(*n as i64))?,
                Step::Insert(units) => {
                    let text = String::from_utf16(units).map_err(serde::ser::Error::custom)?;
                    seq.serialize_element(&text)?
                }
            }
        }
        seq.end()
    }
}

impl<'de> Deserialize<'de> for TextOp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Wire {
            Count(i64),
            Text(String),
        }
        let parts = Vec::<Wire>::deserialize(d)?;
        let mut op = TextOp::new();
        for part in parts {
            match part {
                Wire::Count(0) => return Err(D::Error::custom("a zero count")),
                Wire::Count(n) if n > 0 => op.retain(n as usize),
                Wire::Count(n) => op.delete(n.unsigned_abs() as usize),
                Wire::Text(t) if t.is_empty() => return Err(D::Error::custom("an empty insert")),
                Wire::Text(t) => op.insert_str(&t),
            };
        }
        Ok(op)
    }
}
