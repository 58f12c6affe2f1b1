//! The server's own records ([`crate::store::settings`]) in the
//! `tandem_settings` bucket, shared by every node: a push subscription made
//! through one node is used by whichever node owns the chat that asks.

use async_nats::jetstream::kv;
use bytes::Bytes;

use super::{token, unavailable, JetStreamJournal};
use crate::store::{JournalError, Settings};

/// The bucket's name.
pub const SETTINGS: &str = "tandem_settings";

/// Settings through the journal's connection.
pub(super) struct KvSettings(pub(super) JetStreamJournal);

impl Settings for KvSettings {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, JournalError> {
        let inner = self.0.inner.clone();
        let key = token(key);
        self.0.block(async move {
            inner
                .nats
                .settings
                .get(key)
                .await
                .map(|v| v.map(|b| b.to_vec()))
                .map_err(|e| unavailable("read a setting", e))
        })
    }

    fn put(&self, key: &str, value: &[u8]) -> Result<(), JournalError> {
        let inner = self.0.inner.clone();
        let (key, value) = (token(key), Bytes::copy_from_slice(value));
        self.0.block(async move {
            inner
                .nats
                .settings
                .put(key, value)
                .await
                .map(drop)
                .map_err(|e| unavailable("store a setting", e))
        })
    }

    fn delete(&self, key: &str) -> Result<(), JournalError> {
        let inner = self.0.inner.clone();
        let key = token(key);
        self.0.block(async move {
            inner
                .nats
                .settings
                .purge(key)
                .await
                .map_err(|e| unavailable("remove a setting", e))
        })
    }

    fn list(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, JournalError> {
        use futures_util::TryStreamExt;
        let inner = self.0.inner.clone();
        // A key's token begins with its prefix's: hex keeps prefixes.
        let prefix = token(prefix);
        self.0.block(async move {
            let kv = &inner.nats.settings;
            let keys: Vec<String> = match kv.keys().await {
                Ok(k) => k
                    .try_collect()
                    .await
                    .map_err(|e| unavailable("list the settings", e))?,
                Err(e) => return Err(unavailable("list the settings", e)),
            };
            let mut out = Vec::new();
            for k in keys.into_iter().filter(|k| k.starts_with(&prefix)) {
                let Some(key) = untoken(&k) else { continue };
                if let Some(v) = kv
                    .get(k)
                    .await
                    .map_err(|e| unavailable("read a setting", e))?
                {
                    out.push((key, v.to_vec()));
                }
            }
            out.sort();
            Ok(out)
        })
    }

    fn create(&self, key: &str, value: &[u8]) -> Result<Vec<u8>, JournalError> {
        let inner = self.0.inner.clone();
        let (key, value) = (token(key), Bytes::copy_from_slice(value));
        self.0.block(async move {
            let kv = &inner.nats.settings;
            match kv.create(key.clone(), value.clone()).await {
                Ok(_) => Ok(value.to_vec()),
                Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => kv
                    .get(key)
                    .await
                    .map_err(|e| unavailable("read a setting", e))?
                    .map(|b| b.to_vec())
                    .ok_or_else(|| unavailable("read a setting", "it vanished")),
                Err(e) => Err(unavailable("store a setting", e)),
            }
        })
    }
}

/// The key a [`token`] was made of.
fn untoken(t: &str) -> Option<String> {
    let bytes: Option<Vec<u8>> = (0..t.len())
        .step_by(2)
        .map(|i| t.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect();
    String::from_utf8(bytes?).ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_token_reads_back_as_its_key() {
        let key = "push/people/invite:ab/cd é";
        assert_eq!(super::untoken(&super::token(key)).as_deref(), Some(key));
        assert!(super::token(key).starts_with(&super::token("push/people/")));
    }
}
