//! The ids and positions every layer passes around, as small newtypes so a
//! channel URI cannot be handed where a client id is expected, nor a
//! channel's journal length where a `serverSeq` is.
//!
//! On the wire each is exactly its inner value (a string, a number);
//! the string ones deref to `str`, so maps keyed by them are looked up with
//! a plain `&str`, and they print with `Display` (`channel = %uri`).

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// A string id, cheap to clone (an `Arc<str>`): one allocation however many
/// maps and messages hold it.
macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(Arc<str>);

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                String::deserialize(d).map(Self::from)
            }
        }

        impl $name {
            /// The id as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&*self.0, f)
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                Self(s.into())
            }
        }

        impl From<String> for $name {
            fn from(s: String) -> Self {
                Self(s.into())
            }
        }

        impl From<&String> for $name {
            fn from(s: &String) -> Self {
                Self(s.as_str().into())
            }
        }

        impl From<Arc<str>> for $name {
            fn from(s: Arc<str>) -> Self {
                Self(s)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0.to_string()
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                &*self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                &*self.0 == *other
            }
        }

        impl PartialEq<String> for $name {
            fn eq(&self, other: &String) -> bool {
                *self.0 == **other
            }
        }
    };
}

string_id! {
    /// A channel's URI: `ahp-root://`, `ahp-session:/…` or `ahp-chat:/…`.
    ChannelUri
}

string_id! {
    /// The `clientId` a connection gave in `initialize` or `reconnect`.
    ClientId
}

/// A count-like position: a `u64` that only moves forward.
macro_rules! position {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(u64);

        impl $name {
            /// The very start, before anything.
            pub const ZERO: $name = $name(0);

            /// The position `n` (as read from the wire or the store).
            pub const fn new(n: u64) -> Self {
                $name(n)
            }

            /// The number itself (for the store and the wire).
            pub const fn get(self) -> u64 {
                self.0
            }

            /// The position `n` further on.
            pub fn plus(self, n: u64) -> Self {
                $name(self.0 + n)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

position! {
    /// A position in the server-wide action order (`serverSeq`).
    ServerSeq
}

impl ServerSeq {
    /// The position right after this one.
    pub fn next(self) -> Self {
        self.plus(1)
    }
}

position! {
    /// A position in one channel's journal: how many of the channel's
    /// records come before it. Not a [`ServerSeq`]: every channel counts its
    /// own.
    JournalPos
}

/// Identifies one WebSocket connection for the life of the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(u64);

impl ConnId {
    /// A fresh id, never handed out before in this process.
    pub fn next() -> Self {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT_CONN: AtomicU64 = AtomicU64::new(1);
        ConnId(NEXT_CONN.fetch_add(1, Ordering::Relaxed))
    }

    /// Which of `slices` even shares of the connections this one is in.
    pub fn slot(self, slices: u64) -> u64 {
        self.0 % slices.max(1)
    }
}

impl fmt::Display for ConnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_fall_evenly_into_slots() {
        let mut per_slot = [0u32; 200];
        for n in 1..=10_000 {
            per_slot[ConnId(n).slot(200) as usize] += 1;
        }
        assert!(per_slot.iter().all(|n| *n == 50), "{per_slot:?}");
        assert_eq!(ConnId(7).slot(0), 0, "no slices: one slot");
    }

    #[test]
    fn ids_are_their_inner_value_on_the_wire() {
        let uri = ChannelUri::from("ahp-chat:/x");
        assert_eq!(serde_json::to_string(&uri).unwrap(), "\"ahp-chat:/x\"");
        assert_eq!(
            serde_json::from_str::<ChannelUri>("\"ahp-chat:/x\"").unwrap(),
            uri
        );
        let seq = ServerSeq::new(7);
        assert_eq!(serde_json::to_string(&seq).unwrap(), "7");
        assert_eq!(seq.next(), ServerSeq::new(8));
        assert_eq!(format!("{uri} {seq}"), "ahp-chat:/x 7");
    }

    #[test]
    fn a_map_keyed_by_uri_is_looked_up_with_a_str() {
        let mut m = std::collections::HashMap::new();
        m.insert(ChannelUri::from("ahp-session:/s"), 1);
        assert_eq!(m.get("ahp-session:/s"), Some(&1));
    }
}
