//! TLS without a proxy (`--tls-cert`, `--tls-key`): the official `ahp`
//! client speaks AHP over `wss://` and the web client loads over
//! `https://`, with a certificate made at test time; a bad certificate or
//! key stops the start with a clear reason.

use crate::common;

use std::sync::Arc;

use common::*;
use tandem::config::TlsFiles;
use tandem::Config;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A rustls client trusting only `der`.
fn client_tls(der: &[u8]) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from(der.to_vec()))
        .expect("the test certificate as a root");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_client_speaks_ahp_over_wss_and_the_web_client_loads_over_https() {
    let dir = temp_dir("tls");
    let (files, der) = test_certificate(&dir);
    let server = TestServer::start_with(Config {
        tls: Some(files),
        ..Config::default()
    })
    .await;
    let tls = client_tls(&der);
    let url = format!("wss://localhost:{}/ahp", server.addr.port());
    let (ws, _) = tokio_tungstenite::connect_async_tls_with_config(
        url.as_str(),
        None,
        false,
        Some(tokio_tungstenite::Connector::Rustls(tls.clone())),
    )
    .await
    .expect("wss handshake");
    let client = ahp::Client::connect(ahp_ws::WebSocketTransport::from_stream(ws), client_config())
        .await
        .expect("client");
    let mut c = TestClient::initialized(client, "over-tls").await;
    let (_session, chat) = c.create_session().await;
    let mut m = c.subscribe_chat(&chat).await;
    c.start_turn(&chat, "hello over TLS").await;
    c.wait_state(&mut m, |s| s.active_turn.is_none() && !s.turns.is_empty())
        .await;

    // The web client and /healthz over https.
    let tcp = tokio::net::TcpStream::connect(server.addr)
        .await
        .expect("tcp");
    let connector = tokio_rustls::TlsConnector::from(tls);
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let mut stream = connector.connect(name, tcp).await.expect("https handshake");
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .expect("request");
    let mut body = Vec::new();
    let _ = stream.read_to_end(&mut body).await;
    let text = String::from_utf8_lossy(&body);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains(r#"<script type="module" src="/app.js">"#));

    // Plain HTTP on the TLS port gets no answer but a failed handshake.
    let (status, _, _) = tokio::time::timeout(WAIT, async {
        let mut s = tokio::net::TcpStream::connect(server.addr)
            .await
            .expect("tcp");
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("write");
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf).await;
        (String::from_utf8_lossy(&buf).to_string(), (), ())
    })
    .await
    .expect("the server closes a plain-text connection");
    assert!(!status.contains("200"), "{status}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_certificate_or_key_stops_the_start_with_the_reason() {
    let dir = temp_dir("tls-bad");
    let (good, _) = test_certificate(&dir);
    let other = dir.join("other");
    std::fs::create_dir_all(&other).expect("dir");
    let (mismatched, _) = test_certificate(&other);
    let junk = dir.join("junk.pem");
    std::fs::write(&junk, "-----BEGIN NOTHING-----\n").expect("junk");
    for (files, says) in [
        (
            TlsFiles {
                cert: dir.join("missing.pem"),
                key: good.key.clone(),
            },
            "TLS certificate",
        ),
        (
            TlsFiles {
                cert: good.key.clone(),
                key: good.key.clone(),
            },
            "no `BEGIN CERTIFICATE` block",
        ),
        (
            TlsFiles {
                cert: junk.clone(),
                key: good.key.clone(),
            },
            "a block is not closed (`-----END NOTHING-----` missing)",
        ),
        (
            TlsFiles {
                cert: good.cert.clone(),
                key: junk.clone(),
            },
            "no PEM private key",
        ),
        (
            TlsFiles {
                cert: good.cert.clone(),
                key: mismatched.key.clone(),
            },
            "cannot be used together",
        ),
    ] {
        let config = Config {
            tls: Some(files.clone()),
            ..Config::default()
        };
        let e = tandem::server::check_config(&config, "127.0.0.1:0".parse().expect("addr"))
            .err()
            .unwrap_or_else(|| panic!("{files:?} should be refused"))
            .to_string();
        assert!(e.contains(says), "{files:?}: {e}");
    }
    // The binary says so and exits 1.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args([
            "serve",
            "--in-memory",
            "--bind",
            "127.0.0.1:0",
            "--tls-cert",
        ])
        .arg(&good.cert)
        .arg("--tls-key")
        .arg(&junk)
        .output()
        .expect("run tandem");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no PEM private key") && err.contains("junk.pem"),
        "{err}"
    );
}
