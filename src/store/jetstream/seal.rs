//! What cluster nodes tell each other over core NATS — forwarded requests,
//! their answers, announcements — is sealed: an HMAC-SHA256 tag under a
//! key drawn from the server's auth secret, which every node holds and
//! NATS does not. A node drops whatever does not carry a valid tag for the
//! purpose it arrives for, so someone who can publish on NATS but is not
//! a node (no auth secret) cannot make an owner act for a forged person.
//!
//! The owner then authorises the request again from the principal it
//! carries, as it would its own client's. A node is trusted as far as the
//! auth secret goes: whoever holds it can mint any token anyway.
//!
//! Without an auth secret (a loopback-only server) nothing is sealed.

use bytes::Bytes;
use hmac::{Hmac, KeyInit, Mac};

type HmacSha256 = Hmac<sha2::Sha256>;

/// Length of the tag in front of a sealed body.
const TAG: usize = 32;

/// What a sealed message is for: a tag made for one never opens another.
#[derive(Debug, Clone, Copy)]
pub enum Purpose {
    /// A request forwarded to a channel's owner (`tandem.node.<node>`).
    Forward,
    /// The owner's answer to one.
    Answer,
    /// An announcement to every node (`tandem.announce`).
    Announce,
}

impl Purpose {
    fn label(self) -> &'static [u8] {
        match self {
            Self::Forward => b"forward",
            Self::Answer => b"answer",
            Self::Announce => b"announce",
        }
    }
}

/// The link's key, if the server has an auth secret.
#[derive(Clone)]
pub struct Seal {
    key: Option<[u8; 32]>,
}

/// Why a message was not opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unsealed {
    /// Shorter than a tag.
    #[error("too short to carry a tag")]
    Short,
    /// The tag does not match (not made by a node of this cluster, or
    /// made for another purpose).
    #[error("its tag is not one of this cluster's nodes")]
    Forged,
}

impl Seal {
    /// The seal of a cluster whose nodes share `secret` (`None`: open).
    pub fn new(secret: Option<&[u8]>) -> Self {
        let key = secret.map(|s| {
            let mut mac =
                <HmacSha256 as KeyInit>::new_from_slice(s).expect("HMAC takes a key of any length");
            mac.update(b"tandem cluster link v1");
            mac.finalize().into_bytes().into()
        });
        Self { key }
    }

    fn tag(key: &[u8; 32], purpose: Purpose, body: &[u8]) -> HmacSha256 {
        let mut mac =
            <HmacSha256 as KeyInit>::new_from_slice(key).expect("HMAC takes a key of any length");
        mac.update(purpose.label());
        mac.update(&[0]);
        mac.update(body);
        mac
    }

    /// `body` with its tag in front (as it is without a key).
    pub fn seal(&self, purpose: Purpose, body: Vec<u8>) -> Bytes {
        let Some(key) = &self.key else {
            return Bytes::from(body);
        };
        let tag = Self::tag(key, purpose, &body).finalize().into_bytes();
        let mut out = Vec::with_capacity(TAG + body.len());
        out.extend_from_slice(&tag);
        out.extend_from_slice(&body);
        Bytes::from(out)
    }

    /// The body of `msg` if its tag is this cluster's for `purpose`.
    pub fn open<'a>(&self, purpose: Purpose, msg: &'a [u8]) -> Result<&'a [u8], Unsealed> {
        let Some(key) = &self.key else {
            return Ok(msg);
        };
        if msg.len() < TAG {
            return Err(Unsealed::Short);
        }
        let (tag, body) = msg.split_at(TAG);
        Self::tag(key, purpose, body)
            .verify_slice(tag)
            .map_err(|_| Unsealed::Forged)?;
        Ok(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_body_opens_for_its_purpose_only_and_only_with_the_same_secret() {
        let seal = Seal::new(Some(b"a-secret-of-at-least-32-bytes-0123456789"));
        let sealed = seal.seal(Purpose::Forward, b"{\"op\":\"dispatch\"}".to_vec());
        assert_eq!(
            seal.open(Purpose::Forward, &sealed),
            Ok(&b"{\"op\":\"dispatch\"}"[..])
        );
        assert_eq!(seal.open(Purpose::Answer, &sealed), Err(Unsealed::Forged));
        let other = Seal::new(Some(b"another-secret-of-at-least-32-bytes-xx"));
        assert_eq!(other.open(Purpose::Forward, &sealed), Err(Unsealed::Forged));
        let mut tampered = sealed.to_vec();
        *tampered.last_mut().expect("a body") ^= 1;
        assert_eq!(
            seal.open(Purpose::Forward, &tampered),
            Err(Unsealed::Forged)
        );
        assert_eq!(
            seal.open(
                Purpose::Forward,
                b"{\"op\":\"dispatch\",\"channel\":\"ahp-session:/s\"}"
            ),
            Err(Unsealed::Forged),
            "an unsealed request is refused"
        );
        assert_eq!(seal.open(Purpose::Forward, b"short"), Err(Unsealed::Short));
    }

    #[test]
    fn without_a_secret_nothing_is_sealed() {
        let open = Seal::new(None);
        let body = open.seal(Purpose::Announce, b"hello".to_vec());
        assert_eq!(&body[..], b"hello");
        assert_eq!(open.open(Purpose::Announce, b"hello"), Ok(&b"hello"[..]));
    }
}
