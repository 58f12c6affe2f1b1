//! `sha256:<hex>`: how the record names a secret or a payload without
//! holding it (invite codes, guests' device keys, tool inputs in the audit
//! log).

use sha2::{Digest, Sha256};

/// `"sha256:<hex>"` of `bytes`.
pub fn sha256(bytes: &[u8]) -> String {
    let hash = Sha256::digest(bytes);
    let mut s = String::with_capacity(7 + 64);
    s.push_str("sha256:");
    for b in hash {
        use std::fmt::Write;
        let _ = write!(s, "{b:02x}");
    }
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_the_sha256_of_the_bytes() {
        assert_eq!(
            super::sha256(b"abc"),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
