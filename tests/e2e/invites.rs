//! Invite links: an owner lets a guest in with a role, for a time and a
//! number of people; revoking or expiring the link closes the guests'
//! sockets with a reason and lets nobody back in.

use crate::common;

use std::time::Duration;

use common::*;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tandem::auth::now_secs;
use tandem::Config;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;

use super::people::{rpc_refusal, token, viewer_cannot_start_a_turn, SECRET};
use super::security_access::upgrade;

/// `tandem/createInvite` for `session`.
async fn invite(c: &TestClient, session: &str, access: &str, ttl: u64, uses: Option<u32>) -> Value {
    c.client
        .request(
            "tandem/createInvite",
            json!({"channel": session, "access": access, "ttlSecs": ttl, "uses": uses}),
        )
        .await
        .expect("createInvite")
}

/// The `/ahp` URL a guest's page opens for `code`.
fn guest_url(server: &TestServer, code: &str, device: &str, name: &str) -> String {
    format!("{}?invite={code}&guest={device}&name={name}", server.url())
}

/// A raw socket through the link, initialized; its close frame once the
/// server closes it.
async fn guest_socket(url: &str) -> impl std::future::Future<Output = (CloseCode, String)> {
    let (mut ws, _) = tokio_tungstenite::connect_async(url)
        .await
        .expect("the link lets the guest in");
    ws.send(Message::text(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"channel": "ahp-root://", "protocolVersions": ["1.0.0"], "clientId": "raw-guest"}}).to_string(),
    ))
    .await
    .expect("send");
    async move {
        while let Some(msg) = ws.next().await {
            if let Ok(Message::Close(Some(frame))) = msg {
                return (frame.code, frame.reason.to_string());
            }
        }
        panic!("the socket ended without a close frame");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_watches_through_a_link_until_it_is_revoked() {
    let server = TestServer::start_with(Config {
        auth_secret: Some(SECRET.to_vec()),
        ..Config::default()
    })
    .await;
    let at = |t: &str| format!("{}?token={t}", server.url());
    let ann = TestClient::connect(&at(&token("ann", "Ann", None)), "ann-laptop").await;
    let (session, chat) = ann.create_session().await;
    let (other, _) = ann.create_session().await;
    let pat = TestClient::connect(&at(&token("pat", "Pat", None)), "pat-web").await;

    // Only an owner makes links, within the bounds.
    let (code, why) = rpc_refusal(
        pat.client
            .request(
                "tandem/createInvite",
                json!({"channel": session, "access": "viewer", "ttlSecs": 60}),
            )
            .await,
    );
    assert_eq!(code, -32009);
    assert!(why.contains("owner role"), "{why}");
    let (code, _) = rpc_refusal(
        ann.client
            .request(
                "tandem/createInvite",
                json!({"channel": session, "access": "viewer", "ttlSecs": 0}),
            )
            .await,
    );
    assert_eq!(code, -32602);

    let link = invite(&ann, &session, "viewer", 60, None).await;
    let secret = link["code"].as_str().expect("a code").to_owned();
    assert_eq!(link["access"], "viewer");
    assert_eq!(link["state"], "open");
    assert!(
        link.get("note").is_none(),
        "with auth there is nothing to warn of"
    );

    // Vic comes in through the link with a name: a viewer of that session only.
    let mut vic = TestClient::connect(
        &guest_url(&server, &secret, "vic-device-1", "Vic"),
        "vic-phone",
    )
    .await;
    let me: Value = vic
        .client
        .request("tandem/access", json!({"channel": session}))
        .await
        .expect("access");
    assert_eq!(me["access"], "viewer", "{me}");
    assert_eq!(me["name"], "Vic");
    let mut mv = vic.subscribe_chat(&chat).await;
    viewer_cannot_start_a_turn(&mut vic, &mut mv, &chat).await;
    let r: Result<Value, _> = vic
        .client
        .request("subscribe", json!({"channel": other}))
        .await;
    assert_eq!(rpc_refusal(r).0, -32009, "the link opens one session");
    let (code, _) = rpc_refusal(
        vic.client
            .request(
                "tandem/createInvite",
                json!({"channel": session, "access": "owner", "ttlSecs": 60}),
            )
            .await,
    );
    assert_eq!(code, -32009, "a viewer makes no links");

    // The admin view shows the guest by name and link, and the session's
    // roles and open links.
    let admin = tandem::auth::Authenticator::new(SECRET)
        .expect("key")
        .mint(&tandem::auth::Claims {
            sub: "ops".into(),
            role: tandem::auth::Role::Admin,
            exp: now_secs() + 600,
            ..Default::default()
        })
        .expect("mint");
    let bearer = format!("Bearer {admin}");
    let headers = [("Authorization", bearer.as_str())];
    let (status, _, body) = http_with(server.addr, "GET", "/admin/overview", &headers).await;
    assert!(status.contains("200"), "{status}");
    let overview: Value = serde_json::from_slice(&body).expect("JSON");
    let conns = overview["connections"].as_array().expect("connections");
    let guest = conns
        .iter()
        .find(|c| c["clientId"] == "vic-phone")
        .unwrap_or_else(|| panic!("the guest is listed: {overview}"));
    assert_eq!(guest["name"], "Vic", "{guest}");
    assert_eq!(guest["invite"], link["id"], "{guest}");
    let listed = overview["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .find(|s| s["session"] == session.as_str())
        .unwrap_or_else(|| panic!("the session is listed: {overview}"));
    assert_eq!(listed["members"]["ann"], "owner", "{listed}");
    assert_eq!(listed["openInvites"], 1, "{listed}");

    // A second socket through the same link; the owner lists and revokes.
    let closed = guest_socket(&guest_url(&server, &secret, "vic-device-2", "Val")).await;
    let listed: Value = ann
        .client
        .request("tandem/listInvites", json!({"channel": session}))
        .await
        .expect("listInvites");
    let invites = listed["invites"].as_array().expect("invites");
    assert_eq!(invites.len(), 1, "{listed}");
    assert_eq!(invites[0]["used"], 2, "two devices came in: {listed}");
    assert!(
        !listed.to_string().contains(&secret[13..]),
        "the secret is not listed"
    );
    let id = link["id"].as_str().expect("an id");
    let revoked: Value = ann
        .client
        .request("tandem/revokeInvite", json!({"channel": session, "id": id}))
        .await
        .expect("revokeInvite");
    assert_eq!(revoked["state"], "revoked");
    let (code, reason) = tokio::time::timeout(Duration::from_secs(5), closed)
        .await
        .expect("the guest's socket closes within 5 s");
    assert_eq!(code, CloseCode::from(4403));
    assert_eq!(reason, "this invite link was revoked");
    eventually("the official client's socket closes too", || async {
        vic.client.ping().await.is_err().then_some(())
    })
    .await;
    // Nobody comes back through it.
    let again = upgrade(&guest_url(&server, &secret, "vic-device-1", "Vic"), &[]).await;
    assert_eq!(again.0, 403, "{}", again.1);
    assert_eq!(again.1["error"]["message"], "this invite link was revoked");

    // A link for one person lets one device in; a short one expires.
    let once = invite(&ann, &session, "participant", 60, Some(1)).await;
    let once = once["code"].as_str().expect("code").to_owned();
    let first = TestClient::connect(&guest_url(&server, &once, "first-device", "Fay"), "fay").await;
    let second = upgrade(&guest_url(&server, &once, "second-device", "Sam"), &[]).await;
    assert_eq!(second.0, 403);
    assert!(
        second.1["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("used as many times")),
        "{}",
        second.1
    );
    first.client.ping().await.expect("the first guest stays");
    let brief = invite(&ann, &session, "viewer", 1, None).await;
    let brief = brief["code"].as_str().expect("code").to_owned();
    let expires = now_secs() + 1;
    let refused = eventually("the brief link expires", || async {
        let got = upgrade(&guest_url(&server, &brief, "late-device", "Lee"), &[]).await;
        (got.0 == 403).then_some(got.1)
    })
    .await;
    assert!(now_secs() >= expires);
    assert_eq!(refused["error"]["message"], "this invite link has expired");
    let forged = format!("{}.{}", &once[..12], "0".repeat(32));
    let got = upgrade(&guest_url(&server, &forged, "forger-device", "Mal"), &[]).await;
    assert_eq!(got.0, 403);
    assert_eq!(got.1["error"]["message"], "no such invite link");
    server.stop().await;
}
