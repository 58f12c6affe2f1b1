//! Several people typing in one text answer at once (`tandem/openText`,
//! `tandem/editText`), against a real server: two editors with the official
//! `ahp` client edit through [`tandem::coedit::TextClient`], a plain AHP
//! client watches and overwrites with the standard action, and everyone
//! ends with the same text holding everyone's words.

use crate::common;

use ahp_types::actions::{ActionEnvelope, StateAction};
use ahp_types::state::{ChatInputAnswer, ChatInputAnswerValue, ChatState, ResponsePart};
use common::provider::{session_with, Provider};
use common::*;
use serde_json::{json, Value};
use tandem::coedit::{Edit, Outgoing, Received, TextClient, TextOp};

/// One editor: an official client, its copy of the text and its caret.
struct Editor {
    c: TestClient,
    mirror: ChatMirror,
    text: TextClient,
    caret: usize,
    chat: String,
    target: Value,
    /// The number of the last edit sent.
    seq: u64,
}

impl Editor {
    async fn open(c: TestClient, chat: &str, target: Value) -> Self {
        let mirror = c.subscribe_chat(chat).await;
        let opened: Value = c
            .client
            .request(
                "tandem/openText",
                json!({"channel": chat, "target": target}),
            )
            .await
            .expect("openText");
        let text = TextClient::new(
            c.id.clone(),
            opened["text"].as_str().expect("text"),
            opened["rev"].as_u64().expect("rev"),
        );
        assert_eq!(opened["taken"], 0);
        Self {
            caret: text.units().len(),
            c,
            mirror,
            text,
            chat: chat.to_owned(),
            target,
            seq: 0,
        }
    }

    async fn send(&mut self, out: Option<Outgoing>) {
        let Some(out) = out else { return };
        self.seq = self.seq.max(out.seq);
        let reply: Value = self
            .c
            .client
            .request(
                "tandem/editText",
                json!({"channel": self.chat, "target": self.target, "base": out.base, "seq": out.seq, "op": out.op}),
            )
            .await
            .expect("editText");
        assert!(reply["rev"].as_u64().is_some(), "{reply}");
    }

    /// Type `s` at the caret.
    async fn type_str(&mut self, s: &str) {
        let len = self.text.units().len();
        let mut op = TextOp::new();
        op.retain(self.caret).insert_str(s).retain(len - self.caret);
        self.caret += s.encode_utf16().count();
        let out = self.text.local(op).expect("local edit");
        self.send(out).await;
    }

    /// Apply one envelope: an edit of the text goes through the editor's
    /// copy (moving the caret with it), everything into the mirror.
    async fn apply(&mut self, env: &ActionEnvelope) {
        self.mirror.apply(env);
        let Some(edit) = edit_of(env, &self.target) else {
            return;
        };
        match self.text.receive(&edit).expect("edit in order") {
            Received::Remote(op) => self.caret = op.transform_index(self.caret, true),
            Received::Acked(next) => self.send(next).await,
            Received::Old => {}
        }
    }

    /// Apply envelopes until `pred` holds.
    async fn until(&mut self, mut pred: impl FnMut(&Self) -> bool) {
        while !pred(self) {
            let env = self.c.next_envelope().await;
            self.apply(&env).await;
        }
    }
}

/// `a` types `wa` and `b` types `wb`, keystroke by keystroke in turn, each
/// typed before the other's edits are seen (with `peek`, `a` catches up on
/// what arrived every fourth keystroke); then both settle on the last
/// revision and must show one text, which is returned.
async fn type_together(a: &mut Editor, b: &mut Editor, wa: &str, wb: &str, peek: bool) -> String {
    let (ca, cb): (Vec<char>, Vec<char>) = (wa.chars().collect(), wb.chars().collect());
    for i in 0..ca.len().max(cb.len()) {
        if let Some(ch) = ca.get(i) {
            a.type_str(&ch.to_string()).await;
        }
        if let Some(ch) = cb.get(i) {
            b.type_str(&ch.to_string()).await;
        }
        if peek && i % 4 == 3 {
            while let Ok(Some(env)) =
                tokio::time::timeout(std::time::Duration::from_millis(20), async {
                    Some(a.c.next_envelope().await)
                })
                .await
            {
                a.apply(&env).await;
            }
        }
    }
    a.until(|e| e.text.settled()).await;
    b.until(|e| e.text.settled()).await;
    let final_rev = a.text.rev().max(b.text.rev());
    a.until(|e| e.text.rev() == final_rev).await;
    b.until(|e| e.text.rev() == final_rev).await;
    let merged = a.text.text();
    assert_eq!(b.text.text(), merged, "both editors converge");
    merged
}

/// The edit a `tandem/textEdited` envelope carries for `target`.
fn edit_of(env: &ActionEnvelope, target: &Value) -> Option<Edit> {
    let StateAction::Unknown(v) = &env.action else {
        return None;
    };
    if v["type"] != "tandem/textEdited" || &v["target"] != target {
        return None;
    }
    Some(Edit {
        rev: v["rev"].as_u64()?,
        author: v["author"].as_str()?.to_owned(),
        seq: v["seq"].as_u64()?,
        op: serde_json::from_value(v["op"].clone()).ok()?,
    })
}

/// The text answer to `question` in the active turn's input request.
fn answer(state: &ChatState, question: &str) -> Option<String> {
    state
        .active_turn
        .as_ref()?
        .response_parts
        .iter()
        .find_map(|p| match p {
            ResponsePart::InputRequest(i) => i.request.answers.as_ref()?.get(question).cloned(),
            _ => None,
        })
        .and_then(|a| match a {
            ChatInputAnswer::Draft(v) | ChatInputAnswer::Submitted(v) => match v.value {
                ChatInputAnswerValue::Text(t) => Some(t.value),
                _ => None,
            },
            ChatInputAnswer::Skipped(_) => None,
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_editors_type_into_one_answer_and_a_plain_client_sees_and_overwrites_the_same_text() {
    let server = TestServer::start().await;
    let a = server.client("editor-a").await;
    let b = server.client("editor-b").await;
    let mut plain = server.client("plain").await;
    let (_session, chat) = a.create_session().await;
    let mut pm = plain.subscribe_chat(&chat).await;
    let spec = json!({"questions": [{"kind": "text", "id": "q", "message": "Release notes?"}]});
    a.start_turn(&chat, &format!("/ask {spec}")).await;
    plain
        .wait_state(&mut pm, |s| open_request_id(s).is_some())
        .await;
    let request = open_request_id(&pm.state).expect("request");
    let target = json!({"requestId": request, "questionId": "q"});
    let mut a = Editor::open(a, &chat, target.clone()).await;
    let mut b = Editor::open(b, &chat, target.clone()).await;

    // Interleaved keystrokes, each typed before the other's edits are seen:
    // every edit after the first is made on a revision the server has moved
    // past, and is carried over what came between.
    let (wa, wb) = ("fixes the login loop ", "adds dark mode ");
    let merged = type_together(&mut a, &mut b, wa, wb, true).await;
    assert!(
        merged.contains(wa.trim_end()),
        "A's words kept whole: {merged:?}"
    );
    assert!(
        merged.contains(wb.trim_end()),
        "B's words kept whole: {merged:?}"
    );
    assert_eq!(
        merged.chars().count(),
        wa.chars().count() + wb.chars().count()
    );

    // The plain client's state holds the same text (from the standard
    // actions alone), as do the editors' mirrors.
    plain
        .wait_state(&mut pm, |s| {
            answer(s, "q").as_deref() == Some(merged.as_str())
        })
        .await;
    for e in [&a, &b] {
        assert_eq!(
            answer(&e.mirror.state, "q").as_deref(),
            Some(merged.as_str())
        );
    }

    // The plain client overwrites the whole text, as any AHP client may;
    // the editors get it as an edit and type on over it.
    let overwritten = format!("{merged}— reviewed");
    plain
        .dispatch(
            &chat,
            action(
                json!({"type": "chat/inputAnswerChanged", "requestId": request, "questionId": "q",
                "answer": {"state": "draft", "value": {"kind": "text", "value": overwritten}}}),
            ),
        )
        .await;
    a.until(|e| e.text.text() == overwritten).await;
    b.until(|e| e.text.text() == overwritten).await;
    a.caret = 0;
    a.type_str("v2: ").await;
    a.until(|e| e.text.settled()).await;
    let expected = format!("v2: {overwritten}");
    b.until(|e| e.text.text() == expected).await;
    plain
        .wait_state(&mut pm, |s| {
            answer(s, "q").as_deref() == Some(expected.as_str())
        })
        .await;

    // An edit from a revision older than the server keeps is answered with
    // the text to re-base on.
    let stale: Result<Value, _> =
        b.c.client
            .request(
                "tandem/editText",
                json!({"channel": chat, "target": target, "base": 1, "seq": 99, "op": ["x"]}),
            )
            .await;
    let err = format!("{:?}", stale.expect_err("stale base"));
    assert!(err.contains("-32011") && err.contains("re-base"), "{err}");

    // Settled by one completion: the merged answer is what the agent gets,
    // and the text takes no more edits.
    a.c.dispatch(
        &chat,
        action(json!({"type": "chat/inputCompleted", "requestId": request, "response": "accept"})),
    )
    .await;
    plain
        .wait_state(&mut pm, |s| {
            last_turn_markdown(s).iter().any(|m| m.contains(&expected))
        })
        .await;
    let late: Result<Value, _> = a
        .c
        .client
        .request(
            "tandem/editText",
            json!({"channel": chat, "target": target, "base": a.text.rev(), "seq": 50, "op": [1, "x", expected.encode_utf16().count() - 1]}),
        )
        .await;
    let err = format!("{:?}", late.expect_err("settled"));
    assert!(err.contains("settled"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chat_draft_is_edited_together_and_agents_may_not_type() {
    let server = TestServer::start().await;
    let agent = Provider::connect(&server.url(), "typist-agent").await;
    let a = server.client("draft-a").await;
    let b = server.client("draft-b").await;
    let (_session, chat) = session_with(&a, "typist-agent").await;
    let target = json!({"draft": true});
    let mut a = Editor::open(a, &chat, target.clone()).await;
    let mut b = Editor::open(b, &chat, target.clone()).await;
    a.type_str("deploy ").await;
    b.type_str("tonight").await;
    a.until(|e| e.text.settled() && e.text.text().chars().count() == 14)
        .await;
    b.until(|e| e.text.settled() && e.text.text() == e.mirror_draft())
        .await;
    assert_eq!(a.text.text(), b.text.text());
    assert_eq!(a.mirror_draft(), a.text.text());
    let t = a.text.text();
    assert!(t.contains("deploy ") && t.contains("tonight"), "{t:?}");

    // Bad input is refused with the reason.
    for (params, says) in [
        (
            json!({"channel": chat, "target": {"draft": true}, "base": a.text.rev(), "seq": 0, "op": ["x"]}),
            "seq",
        ),
        (
            json!({"channel": chat, "target": {"draft": true}, "base": a.text.rev(), "seq": 7, "op": [0]}),
            "zero",
        ),
        (
            json!({"channel": chat, "target": {"requestId": "nope", "questionId": "q"}, "base": 0, "seq": 7, "op": ["x"]}),
            "no input request",
        ),
        (
            json!({"channel": chat, "target": {"draft": true}, "base": a.text.rev(), "seq": 7, "op": [999]}),
            "covers",
        ),
    ] {
        let r: Result<Value, _> = a.c.client.request("tandem/editText", params.clone()).await;
        let err = format!("{:?}", r.expect_err("refused"));
        assert!(err.contains(says), "{params}: {err}");
    }

    // The agent's connection may not type into a person's text.
    for (method, params) in [
        (
            "tandem/openText",
            json!({"channel": chat, "target": {"draft": true}}),
        ),
        (
            "tandem/editText",
            json!({"channel": chat, "target": {"draft": true}, "base": a.text.rev(), "seq": 1, "op": ["x", 14]}),
        ),
    ] {
        let r: Result<Value, _> = agent.client.request(method, params).await;
        let err = format!("{:?}", r.expect_err("an agent"));
        assert!(
            err.contains("-32009") && err.contains("person's act"),
            "{method}: {err}"
        );
    }
}

impl Editor {
    fn mirror_draft(&self) -> String {
        self.mirror
            .state
            .draft
            .as_ref()
            .map(|m| m.text.clone())
            .unwrap_or_default()
    }
}

/// After a restart the texts' revisions and each editor's last edit number
/// come back from the store (from the snapshot's marks, or from the
/// journaled edits after it), so an editor that never saw its last edit
/// taken re-bases without typing it twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_an_editor_rebases_knowing_which_of_its_edits_were_taken() {
    let dir = temp_dir("coedit-restart");
    // Snapshots every 3 actions (the marks ride in the snapshot), and
    // never (they come from the journaled edits).
    for every in [3u64, 1_000] {
        let config = tandem::Config {
            data_dir: Some(dir.join(format!("data-{every}"))),
            snapshot_every: every,
            ..tandem::Config::default()
        };
        let server = TestServer::start_with(config.clone()).await;
        let c = server.client("restarting-editor").await;
        let (_session, chat) = c.create_session().await;
        let target = json!({"draft": true});
        let mut ed = Editor::open(c, &chat, target.clone()).await;
        ed.type_str("abc").await;
        ed.until(|e| e.text.settled()).await;
        // Edit 2 is taken (its reply came: it is durable), but the editor
        // goes away before its copy of the text sees it published.
        let mut op = TextOp::new();
        op.retain(3).insert_str("def");
        let out = ed.text.local(op).expect("local").expect("sent at once");
        assert_eq!(out.seq, 2);
        ed.send(Some(out)).await;
        let before = ed.text.rev();
        drop(ed.c);
        server.stop().await;

        let server = TestServer::start_with(config).await;
        let c = server.client("restarting-editor").await;
        let opened: Value = c
            .client
            .request(
                "tandem/openText",
                json!({"channel": chat, "target": target}),
            )
            .await
            .expect("openText");
        assert_eq!(opened["text"], "abcdef", "every={every}");
        assert_eq!(opened["taken"], 2, "edit 2 is known taken (every={every})");
        let rev = opened["rev"].as_u64().expect("rev");
        assert!(rev > before, "revisions go on from where they were");
        // Its next edit, on the revision it knew, is sent back to re-base.
        let stale: Result<Value, _> = c
            .client
            .request(
                "tandem/editText",
                json!({"channel": chat, "target": target, "base": before, "seq": 3, "op": [3, "!"]}),
            )
            .await;
        let err = format!("{:?}", stale.expect_err("re-base"));
        assert!(err.contains("-32011"), "{err}");
        let (shown, resend) = ed.text.rebase("abcdef", rev, 2).expect("rebase");
        assert_eq!(ed.text.text(), "abcdef", "nothing typed twice");
        assert!(resend.is_none() && ed.text.settled());
        assert!(
            shown.is_noop(),
            "what it shows was right already: {shown:?}"
        );
        let reply: Value = c
            .client
            .request(
                "tandem/editText",
                json!({"channel": chat, "target": target, "base": rev, "seq": 3, "op": [6, "!"]}),
            )
            .await
            .expect("edits go on");
        assert_eq!(reply["rev"], rev + 1);
        server.stop().await;
    }
}

/// The next `tandem/presence` notification's params.
async fn next_presence(p: &mut Provider) -> Value {
    loop {
        let note = tokio::time::timeout(WAIT, p.notes.recv())
            .await
            .expect("timed out waiting for presence")
            .expect("connection gone");
        if note["method"] == "tandem/presence" {
            return note["params"].clone();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everyone_on_a_chat_sees_who_is_where_and_who_left() {
    let server = TestServer::start().await;
    let owner = server.client("presence-owner").await;
    let (_session, chat) = owner.create_session().await;
    let mut a = Provider::open(&server.url(), "presence-a").await;
    let mut b = Provider::open(&server.url(), "presence-b").await;
    let subscribe = json!({"channel": chat});
    for p in [&a, &b] {
        let _: Value = p
            .client
            .request("subscribe", subscribe.clone())
            .await
            .expect("subscribe");
    }
    let here = json!({"channel": chat, "target": {"draft": true}, "caret": {"anchor": 2, "head": 5}, "rev": 7, "state": "active"});
    let _: Value = a
        .client
        .request("tandem/setPresence", here.clone())
        .await
        .expect("setPresence");
    for p in [&mut a, &mut b] {
        let seen = next_presence(p).await;
        assert_eq!(seen["clientId"], "presence-a");
        assert_eq!(seen["target"], json!({"draft": true}));
        assert_eq!(seen["caret"], json!({"anchor": 2, "head": 5}));
        assert_eq!(
            (seen["rev"].clone(), seen["state"].clone()),
            (json!(7), json!("active"))
        );
    }
    // Someone who comes later asks who is there.
    let listed: Value = owner
        .client
        .request("tandem/listPresence", json!({"channel": chat}))
        .await
        .expect("listPresence");
    let list = listed["presence"].as_array().expect("a list");
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["clientId"], "presence-a");

    // Idle, then gone when its connection closes.
    let idle = json!({"channel": chat, "state": "idle"});
    let _: Value = a
        .client
        .request("tandem/setPresence", idle)
        .await
        .expect("idle");
    assert_eq!(next_presence(&mut b).await["state"], "idle");
    drop(a);
    let gone = next_presence(&mut b).await;
    assert_eq!(
        (gone["clientId"].clone(), gone["state"].clone()),
        (json!("presence-a"), json!("gone"))
    );
    let listed: Value = owner
        .client
        .request("tandem/listPresence", json!({"channel": chat}))
        .await
        .expect("listPresence");
    assert_eq!(listed["presence"], json!([]));

    // Presence needs a subscription, and a known state.
    let r: Result<Value, _> = owner.client.request("tandem/setPresence", here).await;
    let err = format!("{:?}", r.expect_err("not subscribed"));
    assert!(err.contains("needs a subscription"), "{err}");
    let r: Result<Value, _> = b
        .client
        .request(
            "tandem/setPresence",
            json!({"channel": chat, "state": "asleep"}),
        )
        .await;
    let err = format!("{:?}", r.expect_err("unknown state"));
    assert!(err.contains("-32602"), "{err}");
}

/// On a cluster, an editor connected to a node that follows the chat types
/// through the node that runs it (its requests are forwarded, its edits
/// come back as the chat's other batches do); when that node dies, the node
/// that takes the chat over carries the text on from the revision and the
/// editors' last edit numbers the store holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn editors_on_two_cluster_nodes_type_together_and_go_on_after_the_owner_dies() {
    let nats = common::nats::NatsServer::start();
    let dir = temp_dir("coedit-cluster");
    let mut na = common::nats::node(&dir, &nats, "a");
    let nb = common::nats::node(&dir, &nats, "b");
    let a = na.client("ann").await;
    let b = nb.client("bob").await;
    let (_session, chat) = a.create_session().await;
    eventually("node b knows the chat", || async {
        let r: Result<Value, _> = b
            .client
            .request("subscribe", json!({"channel": chat}))
            .await;
        r.ok()
    })
    .await;
    let target = json!({"draft": true});
    let mut a = Editor::open(a, &chat, target.clone()).await;
    let mut b = Editor::open(b, &chat, target.clone()).await;

    let (wa, wb) = ("ship it ", "after lunch ");
    let merged = type_together(&mut a, &mut b, wa, wb, false).await;
    assert!(
        merged.contains(wa.trim_end()) && merged.contains(wb.trim_end()),
        "{merged:?}"
    );
    assert_eq!(
        b.mirror_draft(),
        merged,
        "b's subscribers see the merged draft"
    );

    // A stale base through the follower: the owner's answer comes back
    // with its data, the text to re-base on.
    let stale: Result<Value, _> =
        b.c.client
            .request(
                "tandem/editText",
                json!({"channel": chat, "target": target, "base": 1, "seq": 99, "op": ["x"]}),
            )
            .await;
    let err = format!("{:?}", stale.expect_err("stale base"));
    assert!(err.contains("-32011") && err.contains("re-base"), "{err}");
    assert!(
        err.contains(merged.trim_end()),
        "the error carries the text: {err}"
    );

    // Presence crosses nodes: Bob (on b) is seen from a; Cat, also on b,
    // is seen and then gone once she unsubscribes.
    let here = |who: &'static str| {
        let chat = chat.clone();
        let c = &a.c;
        async move {
            let r: Value = c
                .client
                .request("tandem/listPresence", json!({"channel": chat}))
                .await
                .expect("listPresence");
            r["presence"]
                .as_array()
                .is_some_and(|l| l.iter().any(|p| p["clientId"] == who))
        }
    };
    let _: Value = b
        .c
        .client
        .request(
            "tandem/setPresence",
            json!({"channel": chat, "target": target, "caret": {"anchor": 0, "head": 0}, "rev": b.text.rev(), "state": "active"}),
        )
        .await
        .expect("setPresence");
    eventually("a hears of Bob on b", || async {
        here("bob").await.then_some(())
    })
    .await;
    let cat = nb.client("cat").await;
    cat.subscribe_chat(&chat).await;
    let _: Value = cat
        .client
        .request(
            "tandem/setPresence",
            json!({"channel": chat, "target": target, "state": "idle"}),
        )
        .await
        .expect("setPresence");
    eventually("a hears of Cat on b", || async {
        here("cat").await.then_some(())
    })
    .await;
    let _: Value = cat
        .client
        .request("unsubscribe", json!({"channel": chat}))
        .await
        .expect("unsubscribe");
    eventually("a hears Cat left", || async {
        (!here("cat").await).then_some(())
    })
    .await;
    assert!(here("bob").await, "Bob is still there");

    // The owner dies; b takes the chat over and its texts go on from the
    // revision and edit numbers the store holds.
    na.kill();
    let opened: Value = eventually("node b runs the chat", || async {
        let r: Result<Value, _> =
            b.c.client
                .request(
                    "tandem/openText",
                    json!({"channel": chat, "target": target}),
                )
                .await;
        r.ok()
    })
    .await;
    assert_eq!(opened["text"], merged);
    assert_eq!(
        opened["rev"].as_u64(),
        Some(b.text.rev()),
        "the revision goes on where it was"
    );
    assert_eq!(opened["taken"], b.seq, "b's last edit is known taken");
    b.caret = b.text.units().len();
    b.type_str("!").await;
    b.until(|e| e.text.settled()).await;
    let expected = format!("{merged}!");
    assert_eq!(b.text.text(), expected);
    b.until(|e| e.mirror_draft() == expected).await;
}
