//! The server's own records beside the journal: a small map of keys to
//! bytes that is never part of any channel's state, for what no client may
//! read (the Web Push key, people's push subscriptions and their
//! notification choices). SQLite keeps it in a table of the store, a
//! cluster in a JetStream key-value bucket every node shares; without
//! either it lives in memory.

use std::collections::HashMap;

use parking_lot::Mutex;

use super::JournalError;

/// Keys to bytes, stored where the journal is.
pub trait Settings: Send + Sync + 'static {
    /// The value under `key`, if any.
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, JournalError>;
    /// Store `value` under `key`, replacing what was there. Returns once
    /// durable.
    fn put(&self, key: &str, value: &[u8]) -> Result<(), JournalError>;
    /// Forget `key`.
    fn delete(&self, key: &str) -> Result<(), JournalError>;
    /// Every key starting with `prefix`, with its value, in key order.
    fn list(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, JournalError>;
    /// Store `value` under `key` unless a value is there already (another
    /// node may have raced to it); the value kept either way.
    fn create(&self, key: &str, value: &[u8]) -> Result<Vec<u8>, JournalError>;
}

/// Settings kept in memory (a server without a store).
#[derive(Default)]
pub struct MemorySettings(Mutex<HashMap<String, Vec<u8>>>);

impl Settings for MemorySettings {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, JournalError> {
        Ok(self.0.lock().get(key).cloned())
    }

    fn put(&self, key: &str, value: &[u8]) -> Result<(), JournalError> {
        self.0.lock().insert(key.to_owned(), value.to_vec());
        Ok(())
    }

    fn delete(&self, key: &str) -> Result<(), JournalError> {
        self.0.lock().remove(key);
        Ok(())
    }

    fn list(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, JournalError> {
        let mut all: Vec<_> = self
            .0
            .lock()
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        all.sort();
        Ok(all)
    }

    fn create(&self, key: &str, value: &[u8]) -> Result<Vec<u8>, JournalError> {
        Ok(self
            .0
            .lock()
            .entry(key.to_owned())
            .or_insert_with(|| value.to_vec())
            .clone())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// What every backend must do.
    pub(crate) fn behaves(s: &dyn Settings) {
        assert_eq!(s.get("a").expect("get"), None);
        s.put("a", b"1").expect("put");
        assert_eq!(s.get("a").expect("get").as_deref(), Some(&b"1"[..]));
        s.put("a", b"2").expect("put");
        assert_eq!(s.get("a").expect("get").as_deref(), Some(&b"2"[..]));
        assert_eq!(s.create("a", b"3").expect("create"), b"2");
        assert_eq!(s.create("b/x y", b"4").expect("create"), b"4");
        assert_eq!(s.get("b/x y").expect("get").as_deref(), Some(&b"4"[..]));
        s.put("b/z", b"5").expect("put");
        s.put("c", b"6").expect("put");
        let listed = s.list("b/").expect("list");
        assert_eq!(
            listed,
            vec![
                ("b/x y".to_owned(), b"4".to_vec()),
                ("b/z".to_owned(), b"5".to_vec())
            ]
        );
        s.delete("a").expect("delete");
        assert_eq!(s.get("a").expect("get"), None);
        s.delete("a").expect("deleting what is not there");
    }

    #[test]
    fn memory_settings_keep_replace_and_forget() {
        behaves(&MemorySettings::default());
    }
}
