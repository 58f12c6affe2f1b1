//! TLS (`--tls-cert`, `--tls-key`): `https://` for the web client and
//! `wss://` for AHP, without a proxy in front.
//!
//! TLS ends in the server process, in front of the HTTP server: each
//! connection to the public address is accepted here, its handshake done
//! with rustls, and its plaintext carried to and from the HTTP server on a
//! loopback socket of the server's own. The connection code above stays one
//! for both (its writes go straight to a plain socket from whichever thread
//! publishes, which a TLS session could not share without a lock per
//! write); the cost is one copy each way on the server's loopback.
//!
//! The certificate chain and key are read once at start-up (PEM); a file
//! that is missing, holds no certificate or no key, or a key that does not
//! match the certificate stops the start with the reason.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

/// TLS: the certificate chain and its key, as PEM files
/// (`--tls-cert`, `--tls-key`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain, the server's certificate first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// The pause after an accept that failed (out of descriptors and the like).
const ACCEPT_RETRY: Duration = Duration::from_millis(50);

/// How long a client may take over its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why TLS cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file cannot be read, or holds no usable PEM.
    #[error("TLS {what} `{path}`: {why}")]
    File {
        /// `certificate` or `key`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// rustls refused the pair (e.g. the key is not the certificate's).
    #[error("TLS certificate `{cert}` and key `{key}` cannot be used together: {why}")]
    Pair {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// Why.
        why: String,
    },
}

fn file_error(what: &'static str, path: &Path, why: impl ToString) -> TlsError {
    TlsError::File {
        what,
        path: path.to_owned(),
        why: why.to_string(),
    }
}

/// Read `files` into a rustls server configuration (HTTP/1.1 only: the
/// WebSocket upgrade needs it).
pub fn server_config(files: &TlsFiles) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let pem = std::fs::read(&files.cert).map_err(|e| file_error("certificate", &files.cert, e))?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| file_error("certificate", &files.cert, pem_error(&e)))?;
    if certs.is_empty() {
        return Err(file_error(
            "certificate",
            &files.cert,
            "no `BEGIN CERTIFICATE` block in it",
        ));
    }
    let pem = std::fs::read(&files.key).map_err(|e| file_error("key", &files.key, e))?;
    let key = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        let why = match e {
            rustls::pki_types::pem::Error::NoItemsFound => String::new(),
            e => format!(" ({})", pem_error(&e)),
        };
        file_error(
            "key",
            &files.key,
            format!("no PEM private key (PKCS#8, PKCS#1 or SEC1) in it{why}"),
        )
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| pair_error(files, e))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| pair_error(files, e))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A PEM error in words (the library's names the marker's bytes).
fn pem_error(e: &rustls::pki_types::pem::Error) -> String {
    use rustls::pki_types::pem::Error;
    match e {
        Error::MissingSectionEnd { end_marker } => format!(
            "not PEM: a block is not closed (`-----END {}-----` missing)",
            String::from_utf8_lossy(end_marker)
        ),
        Error::IllegalSectionStart { line } => format!(
            "not PEM: a bad `BEGIN` line (`{}`)",
            String::from_utf8_lossy(line)
        ),
        e => format!("not PEM: {e}"),
    }
}

fn pair_error(files: &TlsFiles, e: rustls::Error) -> TlsError {
    TlsError::Pair {
        cert: files.cert.clone(),
        key: files.key.clone(),
        why: e.to_string(),
    }
}

/// How long one side may go on after the other closed (a client that never
/// closes its end of an evicted or idle connection is let go then).
const LINGER: Duration = Duration::from_secs(5);

/// Accept TLS connections on `public` and carry each one's plaintext to
/// `inner` (the HTTP server's loopback address) and back, until `stop`
/// resolves; at most `max_open` at once (more wait in the listen backlog).
/// Runs on the calling runtime.
pub async fn terminate(
    public: std::net::TcpListener,
    inner: SocketAddr,
    config: Arc<rustls::ServerConfig>,
    max_open: usize,
    stop: impl std::future::Future<Output = ()>,
) {
    public.set_nonblocking(true).ok();
    let listener = match TcpListener::from_std(public) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "the TLS listener cannot be used");
            return;
        }
    };
    let acceptor = TlsAcceptor::from(config);
    let slots = Arc::new(tokio::sync::Semaphore::new(max_open.max(1)));
    tokio::pin!(stop);
    loop {
        let slot = tokio::select! {
            _ = &mut stop => return,
            slot = slots.clone().acquire_owned() => match slot {
                Ok(s) => s,
                Err(_) => return,
            },
        };
        let (tcp, peer) = tokio::select! {
            _ = &mut stop => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors and the like: a pause before the
                    // next accept (a timer, not a wait for an event: the
                    // kernel tells nobody when a descriptor frees up), so
                    // the loop does not spin.
                    tracing::warn!(error = %e, "TLS accept failed");
                    tokio::time::sleep(ACCEPT_RETRY).await;
                    continue;
                }
            },
        };
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let _slot = slot;
            if let Err(why) = carry(acceptor, tcp, inner).await {
                tracing::debug!(%peer, why, "TLS connection ended");
            }
        });
    }
}

/// One connection: the handshake, then bytes both ways until either side
/// closes.
async fn carry(acceptor: TlsAcceptor, tcp: TcpStream, inner: SocketAddr) -> Result<(), String> {
    let _ = tcp.set_nodelay(true);
    let tls = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp))
        .await
        .map_err(|_| "the TLS handshake timed out".to_owned())?
        .map_err(|e| format!("TLS handshake failed: {e}"))?;
    let plain = TcpStream::connect(inner)
        .await
        .map_err(|e| format!("the HTTP server is not reachable: {e}"))?;
    let _ = plain.set_nodelay(true);
    let (mut tls_in, mut tls_out) = tokio::io::split(tls);
    let (mut plain_in, mut plain_out) = plain.into_split();
    let up = async {
        let r = tokio::io::copy(&mut tls_in, &mut plain_out).await;
        let _ = plain_out.shutdown().await;
        r
    };
    let down = async {
        let r = tokio::io::copy(&mut plain_in, &mut tls_out).await;
        let _ = tls_out.shutdown().await;
        r
    };
    tokio::pin!(up, down);
    // When one side is done the other gets `LINGER` to finish (the server's
    // close frame going out, the client's last bytes coming in).
    let first = tokio::select! {
        r = &mut up => { let _ = tokio::time::timeout(LINGER, &mut down).await; r }
        r = &mut down => { let _ = tokio::time::timeout(LINGER, &mut up).await; r }
    };
    first.map(|_| ()).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_files_are_named_with_the_reason() {
        let dir = std::env::temp_dir().join(format!("tandem-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let junk = dir.join("junk.pem");
        std::fs::write(&junk, "not a certificate").expect("write");
        let missing = dir.join("missing.pem");
        for (files, says) in [
            (
                TlsFiles {
                    cert: missing.clone(),
                    key: junk.clone(),
                },
                "TLS certificate",
            ),
            (
                TlsFiles {
                    cert: junk.clone(),
                    key: junk.clone(),
                },
                "no `BEGIN CERTIFICATE` block",
            ),
        ] {
            let e = server_config(&files).expect_err("refused").to_string();
            assert!(e.contains(says), "{e}");
            assert!(e.contains(files.cert.to_str().unwrap()), "{e}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
