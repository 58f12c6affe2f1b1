//! The audit log: a scripted run of a session's acts that matter gives
//! exactly those entries, in order, with names and times, a page at a
//! time — the same after a SIGKILL and restart, and from `tandem audit
//! export`. An invite link made before the restart still works after it.

use crate::common;

use common::*;
use serde_json::{json, Value};

use super::people::{answer, completed, open_call, ASK};
use super::security_access::upgrade;

/// The whole audit log of `session`, read `page` entries at a time.
async fn audit_log(c: &TestClient, session: &str, page: u64) -> Vec<Value> {
    let mut entries = Vec::new();
    let mut cursor = Value::Null;
    loop {
        let got: Value = c
            .client
            .request(
                "tandem/auditLog",
                json!({"session": session, "cursor": cursor, "limit": page}),
            )
            .await
            .expect("auditLog");
        let batch = got["entries"].as_array().expect("entries").clone();
        assert!(batch.len() as u64 <= page, "{got}");
        entries.extend(batch);
        cursor = got["cursor"].clone();
        if got["more"] != true {
            return entries;
        }
    }
}

/// Settle the tool call `/tool <name>` opens with `decision`'s fields.
async fn decide(c: &mut TestClient, m: &mut ChatMirror, chat: &str, name: &str, decision: Value) {
    let turns = m.state.turns.len();
    c.start_turn(chat, &format!("/tool {name} {{\"env\":\"prod\"}}"))
        .await;
    c.wait_state(m, |s| open_call(s).is_some()).await;
    let (turn, call) = open_call(&m.state).expect("a call waits");
    let mut confirm = json!({"type": "chat/toolCallConfirmed", "turnId": turn, "toolCallId": call});
    confirm
        .as_object_mut()
        .expect("object")
        .extend(decision.as_object().expect("object").clone());
    c.dispatch(chat, action(confirm)).await;
    c.wait_state(m, |s| s.active_turn.is_none() && s.turns.len() == turns + 1)
        .await;
}

/// A guest's `/ahp` URL for invite `code`.
fn through(server: &ServerProcess, code: &str, device: &str, name: &str) -> String {
    format!("{}?invite={code}&guest={device}&name={name}", server.url())
}

fn kinds(entries: &[Value]) -> Vec<&str> {
    entries
        .iter()
        .map(|e| e["kind"].as_str().unwrap_or("?"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_act_that_matters_is_logged_in_order_and_survives_sigkill() {
    let dir = temp_dir("audit-kill");
    let data = dir.join("data");
    let mut server = ServerProcess::spawn(&data, &[]);
    let mut c = server.client("ann-laptop").await;
    let _: Value = c
        .client
        .request("tandem/setName", json!({"name": "Ann"}))
        .await
        .expect("setName");
    let (session, chat) = c.create_session().await;
    let mut m = c.subscribe_chat(&chat).await;

    // answer
    c.start_turn(&chat, ASK).await;
    c.wait_state(&mut m, |s| open_request_id(s).is_some()).await;
    let rid = open_request_id(&m.state).expect("open");
    c.dispatch(&chat, answer(&rid, "submitted", "Tandem")).await;
    c.dispatch(&chat, completed(&rid)).await;
    c.wait_state(&mut m, |s| s.active_turn.is_none()).await;
    // approve, deny with a reason, always allow
    decide(&mut c, &mut m, &chat, "deploy", json!({"approved": true})).await;
    decide(
        &mut c,
        &mut m,
        &chat,
        "rollout",
        json!({"approved": false, "reasonMessage": "not on a Friday"}),
    )
    .await;
    decide(
        &mut c,
        &mut m,
        &chat,
        "ship",
        json!({"approved": true, "selectedOptionId": "approve-session"}),
    )
    .await;
    // mode change
    let mode = action(
        json!({"type": "session/configChanged", "config": {"approvalMode": "always-allow"}}),
    );
    let seq = c.dispatch(&session, mode).await;
    let echo = c.wait_echo(None, seq).await;
    assert_eq!(echo.rejection_reason, None, "the owner changes the mode");
    // invite, its use, revoke; and a link that stays
    let link: Value = c
        .client
        .request(
            "tandem/createInvite",
            json!({"channel": session, "access": "viewer", "ttlSecs": 600}),
        )
        .await
        .expect("createInvite");
    assert!(
        link["note"]
            .as_str()
            .is_some_and(|n| n.contains("without authentication")),
        "a server without auth says what a link means there: {link}"
    );
    let code = link["code"].as_str().expect("code").to_owned();
    let vic = TestClient::connect(&through(&server, &code, "vic-device", "Vic"), "vic-phone").await;
    let me: Value = vic
        .client
        .request("tandem/access", json!({"channel": session}))
        .await
        .expect("access");
    assert_eq!(
        me["access"], "viewer",
        "a guest is not the local owner: {me}"
    );
    let _: Value = c
        .client
        .request(
            "tandem/revokeInvite",
            json!({"channel": session, "id": link["id"]}),
        )
        .await
        .expect("revoke");
    let kept: Value = c
        .client
        .request(
            "tandem/createInvite",
            json!({"channel": session, "access": "participant", "ttlSecs": 600}),
        )
        .await
        .expect("createInvite");
    let kept_code = kept["code"].as_str().expect("code").to_owned();

    let expected = [
        "answered",
        "approved",
        "denied",
        "granted",
        "configChanged",
        "inviteCreated",
        "inviteUsed",
        "inviteRevoked",
        "inviteCreated",
    ];
    let before = audit_log(&c, &session, 4).await;
    assert_eq!(kinds(&before), expected);
    for e in &before {
        let who = if e["kind"] == "inviteUsed" {
            "Vic"
        } else {
            "Ann"
        };
        assert_eq!(e["by"]["name"], who, "{e}");
        assert_eq!(e["session"], session.as_str(), "{e}");
        assert!(e["at"].as_str().is_some_and(|t| t.ends_with('Z')), "{e}");
    }
    let times: Vec<&str> = before.iter().filter_map(|e| e["at"].as_str()).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    assert_eq!(before[0]["answeredBy"]["q"], "Ann");
    assert_eq!(before[0]["response"], "accept");
    for (i, tool) in [(1, "deploy"), (2, "rollout"), (3, "ship")] {
        assert_eq!(before[i]["toolName"], tool);
        assert_eq!(before[i]["chat"], chat.as_str());
        let digest = before[i]["inputDigest"].as_str().unwrap_or_default();
        assert!(
            digest.starts_with("sha256:") && digest.len() == 71,
            "{}",
            before[i]
        );
    }
    assert_eq!(before[2]["reason"], "not on a Friday");
    assert_eq!(before[4]["config"]["approvalMode"], "always-allow");
    assert_eq!(before[5]["access"], "viewer");
    assert_eq!(before[6]["inviteId"], link["id"]);
    let log = before.iter().map(Value::to_string).collect::<String>();
    assert!(
        !log.contains(&code[13..]) && !log.contains(&kept_code[13..]),
        "no secret in the log"
    );

    server.kill();
    let server = ServerProcess::spawn(&data, &[]);
    let c = server.client("ann-laptop-2").await;
    assert_eq!(
        audit_log(&c, &session, 2).await,
        before,
        "the same log after SIGKILL"
    );
    // The link from before the restart lets a guest in; the revoked one not.
    let pam = TestClient::connect(&through(&server, &kept_code, "pam-device", "Pam"), "pam").await;
    let me: Value = pam
        .client
        .request("tandem/access", json!({"channel": session}))
        .await
        .expect("access");
    assert_eq!(me["access"], "participant");
    let again = upgrade(&through(&server, &code, "vic-device", "Vic"), &[]).await;
    assert_eq!(again.0, 403, "{}", again.1);

    // `tandem audit export` reads the same log from the store.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["audit", "export", "--session", &session, "--data-dir"])
        .arg(&data)
        .output()
        .expect("run tandem audit export");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines[..before.len()], before[..]);
    assert_eq!(
        kinds(&lines[before.len()..]),
        ["inviteUsed"],
        "Pam's arrival"
    );
    drop(server);
}
