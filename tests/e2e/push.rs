//! Web Push: a browser registered through `tandem/pushSubscribe` gets, from
//! a push service on loopback, the request encrypted for it (RFC 8291),
//! signed with the server's VAPID key (RFC 8292), and its end; a push
//! service that answers 410 ends the subscription. Only people who may see
//! the session, whose role can answer the request, who want it and who are
//! not looking at the chat are pushed to; one who stops looking is pushed
//! to a quiet delay later.

use crate::common;

use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use common::*;
use serde_json::{json, Value};
use tandem::auth::{now_secs, Authenticator, Claims, Role};
use tandem::notify::{NotifyConfig, Retry};
use tandem::people::Access;
use tandem::Config;
use tokio::sync::mpsc;
use web_push_native::p256;
use web_push_native::p256::elliptic_curve::sec1::ToEncodedPoint;

use super::notify::{ask, next, receiver, Got};
use super::people::{answer, approve, completed, open_call, rpc_refusal, SECRET};

const CONTACT: &str = "mailto:ops@example.com";

/// A browser: its keys, as `PushManager.subscribe` makes them.
struct Browser {
    secret: p256::SecretKey,
    auth: [u8; 16],
    endpoint: String,
}

impl Browser {
    fn new(endpoint: String) -> Self {
        let secret = p256::SecretKey::random(&mut p256::elliptic_curve::rand_core::OsRng);
        let mut auth = [0u8; 16];
        auth.copy_from_slice(&uuid::Uuid::new_v4().as_bytes()[..]);
        Self {
            secret,
            auth,
            endpoint,
        }
    }

    /// Its `PushSubscription.toJSON()`.
    fn subscription(&self) -> Value {
        let public = self.secret.public_key().to_encoded_point(false);
        json!({"endpoint": self.endpoint, "expirationTime": null,
               "keys": {"p256dh": B64.encode(public.as_bytes()), "auth": B64.encode(self.auth)}})
    }

    /// The push's payload, decrypted with the browser's keys.
    fn open(&self, got: &Got) -> Value {
        assert_eq!(got.headers["content-encoding"], "aes128gcm");
        let plain = web_push_native::decrypt(
            got.body.clone(),
            &self.secret,
            &web_push_native::Auth::clone_from_slice(&self.auth),
        )
        .expect("the payload decrypts with the browser's keys");
        serde_json::from_slice(&plain).expect("a JSON payload")
    }
}

fn token(sub: &str, access: Option<(&str, Access)>, sessions: Option<Vec<String>>) -> String {
    Authenticator::new(SECRET)
        .expect("key")
        .mint(&Claims {
            sub: sub.into(),
            role: Role::Client,
            exp: now_secs() + 600,
            name: Some(sub.to_uppercase()),
            access: access.map(|(s, a)| [(s.to_owned(), a)].into()),
            sessions,
        })
        .expect("mint")
}

fn config(quiet: Duration) -> Config {
    Config {
        auth_secret: Some(SECRET.to_vec()),
        notify: NotifyConfig {
            quiet_delay: quiet,
            public_url: Some("https://tandem.example.com".into()),
            push_contact: Some(CONTACT.into()),
            retry: Retry {
                attempts: 2,
                first_backoff: Duration::from_millis(20),
                timeout: Duration::from_secs(2),
            },
            ..NotifyConfig::default()
        },
        ..Config::default()
    }
}

async fn person(server: &TestServer, id: &str, token: &str) -> TestClient {
    TestClient::connect(&format!("{}?token={token}", server.url()), id).await
}

async fn call(c: &TestClient, method: &str, params: Value) -> Value {
    c.client
        .request(method, params)
        .await
        .unwrap_or_else(|e| panic!("{method}: {e:?}"))
}

async fn subscribe(c: &TestClient, b: &Browser) -> Value {
    call(
        c,
        "tandem/pushSubscribe",
        json!({"subscription": b.subscription()}),
    )
    .await
}

/// The VAPID `Authorization` checks out: `vapid t=<JWT>, k=<key>`, the key
/// the server publishes, the JWT ES256 over it, for the push service's
/// origin, naming the contact, expiring within a day.
fn verify_vapid(got: &Got, public: &str, endpoint: &str) {
    let auth = &got.headers["authorization"];
    let rest = auth.strip_prefix("vapid ").expect("the vapid scheme");
    let mut t = None;
    let mut k = None;
    for part in rest.split(',').map(str::trim) {
        if let Some(v) = part.strip_prefix("t=") {
            t = Some(v);
        } else if let Some(v) = part.strip_prefix("k=") {
            k = Some(v);
        }
    }
    let (t, k) = (t.expect("t="), k.expect("k="));
    assert_eq!(k, public, "signed with the key the server publishes");
    let point = B64.decode(k).expect("base64url");
    assert_eq!(
        (point.len(), point[0]),
        (65, 4),
        "an uncompressed P-256 point"
    );
    let key = jsonwebtoken::DecodingKey::from_ec_components(
        &B64.encode(&point[1..33]),
        &B64.encode(&point[33..]),
    )
    .expect("a key");
    let mut v = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::ES256);
    let url = url::Url::parse(endpoint).expect("url");
    // The push service's scheme and host (the signing crate leaves the
    // port out; push services listen on the default one).
    let aud = format!("{}://{}", url.scheme(), url.host_str().expect("host"));
    v.set_audience(&[aud]);
    v.set_required_spec_claims(&["exp", "aud", "sub"]);
    let claims = jsonwebtoken::decode::<Value>(t, &key, &v)
        .expect("the JWT verifies")
        .claims;
    assert_eq!(claims["sub"], CONTACT);
    let exp = claims["exp"].as_u64().expect("exp");
    assert!(
        exp > now_secs() && exp <= now_secs() + 24 * 3600 + 60,
        "{claims}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_arrives_encrypted_and_signed_then_its_end_and_a_410_forgets_the_browser() {
    let (url, mut rx) = receiver(vec![201, 201, 410]).await;
    let server = TestServer::start_with(config(Duration::from_millis(100))).await;
    let mut ann = person(&server, "ann-laptop", &token("ann", None, None)).await;
    let (session, chat) = ann.create_session().await;
    let mut m = ann.subscribe_chat(&chat).await;

    let settings = call(&ann, "tandem/notifySettings", json!({"channel": session})).await;
    let public = settings["publicKey"].as_str().expect("a key").to_owned();
    assert_eq!(settings["devices"], 0);
    assert_eq!(settings["mode"], "all");
    let browser = Browser::new(format!("{url}/ann"));
    assert_eq!(subscribe(&ann, &browser).await["devices"], 1);
    // The same endpoint again is the same browser.
    assert_eq!(subscribe(&ann, &browser).await["devices"], 1);
    let (_, _, body) = admin_get(&server, "/admin/overview").await;
    let o: Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(
        o["notify"]["webPush"],
        json!({"on": true, "people": 1, "devices": 1})
    );

    // A question while Ann's page says nothing of looking: one push.
    let rid = ask(&mut ann, &chat, &mut m).await;
    let got = next(&mut rx).await;
    assert_eq!(got.path, "/hook/ann");
    verify_vapid(&got, &public, &browser.endpoint);
    assert_eq!(got.headers["urgency"], "high");
    assert_eq!(got.headers["ttl"], "86400");
    let topic = got.headers["topic"].clone();
    assert!(topic.len() <= 32 && topic.bytes().all(|b| b.is_ascii_alphanumeric()));
    let v = browser.open(&got);
    assert_eq!(v["type"], "opened", "{v}");
    assert_eq!(v["session"], session.as_str());
    assert_eq!(v["chat"], chat.as_str());
    assert_eq!(v["id"], rid.as_str());
    assert_eq!(v["kind"], "input");
    assert_eq!(v["body"], "Name?");
    assert_eq!(v["tag"], format!("{chat}#{rid}"));
    let tail = |u: &str| u.rsplit('/').next().unwrap_or_default().to_owned();
    assert_eq!(
        v["url"],
        format!(
            "https://tandem.example.com/#/s/{}/{}",
            tail(&session),
            tail(&chat)
        )
    );

    // Answered: its end, under the same topic, so it replaces the start.
    ann.dispatch(&chat, answer(&rid, "submitted", "Tandem"))
        .await;
    ann.dispatch(&chat, completed(&rid)).await;
    let got = next(&mut rx).await;
    assert_eq!(got.headers["urgency"], "normal");
    assert_eq!(got.headers["topic"], topic);
    let v = browser.open(&got);
    assert_eq!(v["type"], "settled", "{v}");
    assert_eq!(v["outcome"], "answered");
    assert_eq!(v["tag"], format!("{chat}#{rid}"));
    assert_eq!(v["settledBy"], "ANN", "who settled it, by name");
    ann.wait_state(&mut m, |s| s.active_turn.is_none()).await;

    // The push service says the subscription is gone: it is forgotten.
    ask(&mut ann, &chat, &mut m).await;
    assert_eq!(next(&mut rx).await.status, 410);
    let ann = &ann;
    eventually("the ended subscription is forgotten", || async move {
        let s = call(ann, "tandem/notifySettings", json!({})).await;
        (s["devices"] == 0).then_some(())
    })
    .await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_is_checked_and_web_push_can_be_off() {
    let server = TestServer::start_with(config(Duration::from_millis(100))).await;
    let ann = person(&server, "ann-laptop", &token("ann", None, None)).await;
    let mut b = Browser::new("ftp://push.example.com/x".into()).subscription();
    let (code, why) = rpc_refusal(
        ann.client
            .request("tandem/pushSubscribe", json!({"subscription": b.clone()}))
            .await,
    );
    assert_eq!(code, -32602, "{why}");
    b["endpoint"] = "https://push.example.com/x".into();
    b["keys"]["auth"] = B64.encode([1u8; 4]).into();
    let (code, why) = rpc_refusal(
        ann.client
            .request("tandem/pushSubscribe", json!({"subscription": b}))
            .await,
    );
    assert_eq!(code, -32602);
    assert!(why.contains("16 bytes"), "{why}");
    let (code, _) = rpc_refusal(
        ann.client
            .request(
                "tandem/setNotify",
                json!({"channel": "ahp-session:/nope", "mode": "off"}),
            )
            .await,
    );
    assert_eq!(code, -32001);
    server.stop().await;

    let mut off = config(Duration::from_millis(100));
    off.notify.web_push = false;
    let server = TestServer::start_with(off).await;
    let ann = person(&server, "ann-laptop", &token("ann", None, None)).await;
    let s = call(&ann, "tandem/notifySettings", json!({})).await;
    assert_eq!(s["publicKey"], Value::Null);
    let b = Browser::new("https://push.example.com/x".into()).subscription();
    let (code, why) = rpc_refusal(
        ann.client
            .request("tandem/pushSubscribe", json!({"subscription": b}))
            .await,
    );
    assert_eq!(code, -32600);
    assert!(why.contains("off"), "{why}");
    server.stop().await;
}

/// Pushes by who got them (the endpoint's last path segment), in order.
async fn next_for(rx: &mut mpsc::UnboundedReceiver<Got>, who: &str, b: &Browser) -> Value {
    let got = next(rx).await;
    assert_eq!(
        got.path,
        format!("/hook/{who}"),
        "the next push goes to {who}"
    );
    b.open(&got)
}

async fn presence(c: &TestClient, chat: &str, focused: bool) {
    call(
        c,
        "tandem/setPresence",
        json!({"channel": chat, "state": "active", "focused": focused}),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_those_who_may_answer_want_it_and_are_not_looking_are_pushed_to() {
    // Each person's browser has an endpoint of its own on one push service,
    // and each browser's pushes go out in order: a push to someone who
    // should not have had one would come before the one the test waits
    // for next at that browser.
    let (url, mut rx) = receiver(vec![]).await;
    let server = TestServer::start_with(config(Duration::from_millis(150))).await;
    let mut ann = person(&server, "ann-laptop", &token("ann", None, None)).await;
    let (session, chat) = ann.create_session().await;
    let s = session.as_str();
    let mut m = ann.subscribe_chat(&chat).await;
    let others = format!("ahp-session:/{}", uuid::Uuid::new_v4());
    let people = [
        ("bob", token("bob", None, None)),
        ("vic", token("vic", Some((s, Access::Viewer)), None)),
        ("pat", token("pat", Some((s, Access::Approver)), None)),
        ("sam", token("sam", None, Some(vec![others.clone()]))),
    ];
    let mut clients = Vec::new();
    let mut browsers = std::collections::HashMap::new();
    for (who, t) in &people {
        let c = person(&server, &format!("{who}-phone"), t).await;
        let b = Browser::new(format!("{url}/{who}"));
        assert_eq!(subscribe(&c, &b).await["devices"], 1, "{who}");
        browsers.insert(*who, b);
        clients.push((*who, c));
    }
    let annb = Browser::new(format!("{url}/ann"));
    subscribe(&ann, &annb).await;
    let client = |who: &str| &clients.iter().find(|(w, _)| *w == who).expect("a person").1;
    // Sam's token cannot open the session at all.
    let (code, _) = rpc_refusal(
        client("sam")
            .client
            .request("tandem/setNotify", json!({"channel": s, "mode": "all"}))
            .await,
    );
    assert_eq!(code, -32009);
    // Pat wants approvals only.
    let set = call(
        client("pat"),
        "tandem/setNotify",
        json!({"channel": s, "mode": "approvals"}),
    )
    .await;
    assert_eq!(set["mode"], "approvals");
    // Ann looks at the chat; Bob has it open in a page that is hidden.
    presence(&ann, &chat, true).await;
    client("bob").subscribe_chat(&chat).await;
    presence(client("bob"), &chat, false).await;

    // A question: Bob only (Ann looks, Vic cannot answer, Pat wants
    // approvals, Sam may not see the session).
    let rid = ask(&mut ann, &chat, &mut m).await;
    let v = next_for(&mut rx, "bob", &browsers["bob"]).await;
    assert_eq!(
        (v["type"].as_str(), v["id"].as_str()),
        (Some("opened"), Some(rid.as_str()))
    );

    // Ann's page is hidden now: she is told a quiet delay later.
    presence(&ann, &chat, false).await;
    let v = next_for(&mut rx, "ann", &annb).await;
    assert_eq!(
        (v["type"].as_str(), v["id"].as_str()),
        (Some("opened"), Some(rid.as_str()))
    );

    // Settled: Bob and Ann, who were told, hear its end.
    ann.dispatch(&chat, answer(&rid, "submitted", "x")).await;
    ann.dispatch(&chat, completed(&rid)).await;
    let mut ends = [next(&mut rx).await, next(&mut rx).await];
    ends.sort_by(|a, b| a.path.cmp(&b.path));
    assert_eq!(ends[0].path, "/hook/ann");
    assert_eq!(annb.open(&ends[0])["type"], "settled");
    assert_eq!(ends[1].path, "/hook/bob");
    assert_eq!(browsers["bob"].open(&ends[1])["type"], "settled");
    ann.wait_state(&mut m, |s| s.active_turn.is_none()).await;

    // A tool approval: Pat (an approver who wants approvals), and Ann (an
    // owner, not looking); not Bob (a participant) nor Vic.
    ann.start_turn(&chat, "/tool deploy {\"env\":\"prod\"}")
        .await;
    ann.wait_state(&mut m, |s| open_call(s).is_some()).await;
    let (turn, call_id) = open_call(&m.state).expect("a call waits");
    let mut opened = [next(&mut rx).await, next(&mut rx).await];
    opened.sort_by(|a, b| a.path.cmp(&b.path));
    assert_eq!(opened[0].path, "/hook/ann");
    let v = browsers["pat"].open(&opened[1]);
    assert_eq!(opened[1].path, "/hook/pat");
    assert_eq!(
        (v["kind"].as_str(), v["id"].as_str()),
        (Some("tool"), Some(call_id.as_str()))
    );
    assert_eq!(v["title"], "Approval needed");
    ann.dispatch(&chat, approve(&turn, &call_id)).await;
    let mut ends = [next(&mut rx).await, next(&mut rx).await];
    ends.sort_by(|a, b| a.path.cmp(&b.path));
    assert_eq!(
        (ends[0].path.as_str(), ends[1].path.as_str()),
        ("/hook/ann", "/hook/pat")
    );
    ann.wait_state(&mut m, |s| s.active_turn.is_none()).await;

    // Now Vic may answer (made a participant) and Sam's token still may
    // not see the session: the next question reaches Vic, and Vic's
    // browser had nothing before it.
    call(
        &ann,
        "tandem/setAccess",
        json!({"channel": s, "subject": "vic", "access": "participant"}),
    )
    .await;
    presence(&ann, &chat, true).await;
    presence(client("bob"), &chat, true).await;
    let rid = ask(&mut ann, &chat, &mut m).await;
    let v = next_for(&mut rx, "vic", &browsers["vic"]).await;
    assert_eq!(
        (v["type"].as_str(), v["id"].as_str()),
        (Some("opened"), Some(rid.as_str()))
    );
    // Every push the server delivered is one seen above (Bob 2, Ann 4,
    // Pat 2, Vic 1): none went to Sam, nor to Pat for a question.
    let server = &server;
    let sent = eventually("every push is counted", || async move {
        let n = server_push_count(server).await;
        (n >= 9).then_some(n)
    })
    .await;
    assert_eq!(sent, 9);
    assert!(rx.try_recv().is_err(), "no other push arrived");
}

/// Pushes the server delivered, from `/metrics`.
async fn server_push_count(server: &TestServer) -> u64 {
    let (_, _, body) = admin_get(server, "/metrics").await;
    let text = String::from_utf8_lossy(&body).into_owned();
    text.lines()
        .filter(|l| {
            l.starts_with("tandem_notifications_total{")
                && l.contains("channel=\"push\"")
                && l.contains("outcome=\"sent\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// `GET path` with an admin token.
async fn admin_get(server: &TestServer, path: &str) -> (String, String, Vec<u8>) {
    let admin = Authenticator::new(SECRET)
        .expect("key")
        .mint(&Claims {
            sub: "ops".into(),
            role: Role::Admin,
            exp: now_secs() + 600,
            ..Default::default()
        })
        .expect("mint");
    let auth = format!("Bearer {admin}");
    http_with(server.addr, "GET", path, &[("Authorization", &auth)]).await
}
