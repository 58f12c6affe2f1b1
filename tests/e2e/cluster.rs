//! A node whose journal is in NATS JetStream (`--cluster`), against a real
//! `nats-server -js` on loopback and the real binary: it recovers from the
//! stream after SIGKILL, a second node cannot write channels a live node
//! owns, a paused owner that lost its lease cannot append after a takeover,
//! and losing NATS refuses writes until NATS is back.

use std::time::Duration;

use serde_json::{json, Value};

use crate::common::nats::{node, signal, NatsServer};
use crate::common::{
    action, eventually, healthz, last_turn_markdown, temp_dir, ServerProcess, TestClient,
};

async fn title(c: &mut TestClient, session: &str, text: &str) -> Option<String> {
    let seq = c
        .dispatch(
            session,
            action(json!({"type": "session/titleChanged", "title": text})),
        )
        .await;
    c.wait_echo(None, seq).await.rejection_reason
}

async fn session_title(server: &ServerProcess, session: &str) -> String {
    let c = server
        .client(&format!("check-{}", uuid::Uuid::new_v4()))
        .await;
    let s = c.subscribe_session(session).await;
    c.client.shutdown().await;
    s.title
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_keeps_its_journal_in_jetstream_and_comes_back_from_it_after_sigkill() {
    let nats = NatsServer::start();
    let dir = temp_dir("cluster");
    let mut a = node(&dir, &nats, "a");
    let mut c = a.client("ann").await;
    let (session, chat) = c.create_session().await;
    let mut m = c.subscribe_chat(&chat).await;
    for i in 0..70 {
        // Past one snapshot (every 64 actions).
        assert_eq!(title(&mut c, &session, &format!("title {i}")).await, None);
    }
    c.start_turn(&chat, "hello cluster").await;
    c.wait_state(&mut m, |s| s.active_turn.is_none() && !s.turns.is_empty())
        .await;
    let before = m.state.clone();
    let health = healthz(a.addr).await;
    assert_eq!(health["cluster"]["node"], "a", "{health}");
    assert_eq!(health["cluster"]["nats"], "connected", "{health}");
    assert_eq!(health["cluster"]["channelsOwned"], 2, "{health}");
    a.kill();

    let a = node(&dir, &nats, "a");
    let c = a.client("ann-2").await;
    let after = c.subscribe_chat(&chat).await.state;
    assert_eq!(after, before, "the chat as it was");
    assert!(last_turn_markdown(&after)
        .join("")
        .contains("hello cluster"));
    assert_eq!(session_title(&a, &session).await, "title 69");
    // And it goes on writing where it stopped.
    let mut c = a.client("ann-3").await;
    assert_eq!(title(&mut c, &session, "after the crash").await, None);
    assert_eq!(session_title(&a, &session).await, "after the crash");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_owner_keeps_its_channels_and_a_paused_one_cannot_append_after_a_takeover() {
    let nats = NatsServer::start();
    let dir = temp_dir("cluster");
    let a = node(&dir, &nats, "a");
    let mut ca = a.client("amy").await;
    let (session, _chat) = ca.create_session().await;
    assert_eq!(title(&mut ca, &session, "by a").await, None);
    let seen_on_a = healthz(a.addr).await["serverSeq"]
        .as_u64()
        .expect("serverSeq");

    // While a renews its leases, b follows a's channels: it serves them,
    // and its clients' writes go to a.
    let b = node(&dir, &nats, "b");
    assert_eq!(session_title(&b, &session).await, "by a");
    let mut cb = b.client("bob").await;
    assert_eq!(title(&mut cb, &session, "by b, through a").await, None);
    assert_eq!(session_title(&a, &session).await, "by b, through a");
    assert_eq!(healthz(a.addr).await["cluster"]["channelsOwned"], 2);
    assert_eq!(healthz(b.addr).await["cluster"]["channelsOwned"], 0);

    // a is paused past its lease: b takes its channels over.
    signal(a.pid(), "-STOP");
    eventually("b owns the session and its chat", || async {
        (healthz(b.addr).await["cluster"]["channelsOwned"] == 2).then_some(())
    })
    .await;
    // A client of a reconnects to b with what it saw there: b numbers above
    // everything a handed out, so it answers with snapshots, not a replay.
    let back = TestClient::raw_connect(&b.url()).await;
    let res = back
        .reconnect("amy".into(), seen_on_a as i64, vec![session.clone()])
        .await
        .expect("reconnect");
    let ahp_types::commands::ReconnectResult::Snapshot(s) = res else {
        panic!("expected snapshots, got {res:?}");
    };
    assert!(
        s.snapshots[0].from_seq as u64 > seen_on_a,
        "b numbers above a"
    );
    back.shutdown().await;
    assert_eq!(title(&mut cb, &session, "by b").await, None);

    // a wakes up believing it still owns the session. Its write is refused
    // or, once a has heard of the take-over, forwarded to b: a itself never
    // appends again.
    signal(a.pid(), "-CONT");
    let mut ca = a.client("amy-2").await;
    let outcome = title(&mut ca, &session, "by a again").await;
    assert!(
        outcome
            .as_deref()
            .is_none_or(|r| r.contains("no longer this node's")),
        "{outcome:?}"
    );
    let expected = if outcome.is_none() {
        "by a again"
    } else {
        "by b"
    };
    assert_eq!(session_title(&b, &session).await, expected);
    eventually("a follows b", || async {
        (session_title(&a, &session).await == expected).then_some(())
    })
    .await;
    let writers = crate::common::nats::writers(&nats, &session).await;
    let fence = writers
        .iter()
        .rposition(|w| w == "fence by b")
        .expect("b fenced the session");
    assert!(
        writers[fence + 1..].iter().all(|w| w == "b"),
        "after b's fence only b wrote: {writers:?}"
    );
    assert!(writers[..fence].iter().any(|w| w == "a"), "{writers:?}");
    let health = healthz(b.addr).await;
    assert_eq!(health["cluster"]["channelsOwned"], 2, "{health}");
    assert_eq!(healthz(a.addr).await["cluster"]["channelsOwned"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_nats_writes_are_refused_reads_go_on_and_service_resumes_by_itself() {
    let mut nats = NatsServer::start();
    let dir = temp_dir("cluster");
    let a = node(&dir, &nats, "a");
    let mut c = a.client("cat").await;
    let (session, _chat) = c.create_session().await;
    assert_eq!(title(&mut c, &session, "before").await, None);

    nats.stop();
    let h: Value = eventually("healthz says NATS is away", || async {
        let h = healthz(a.addr).await;
        (h["cluster"]["nats"] != "connected").then_some(h)
    })
    .await;
    assert!(
        h["cluster"]["nats"]
            .as_str()
            .unwrap_or("")
            .contains("disconnected"),
        "{h}"
    );
    // Known to be away, the store is not asked: the write is refused up
    // front and reads are served from memory meanwhile. (A write that
    // races the news is refused by the store, and its channel is not
    // served until the store can be read again: see the invariants test
    // `a_channel_the_store_cannot_read_back_refuses_subscriptions_with_why_until_it_can`.)
    let refused = title(&mut c, &session, "while away").await;
    assert!(
        refused.as_deref().is_some_and(|r| r.contains("NATS")),
        "{refused:?}"
    );
    assert_eq!(session_title(&a, &session).await, "before");

    nats.restart();
    eventually("NATS is back", || async {
        (healthz(a.addr).await["cluster"]["nats"] == "connected").then_some(())
    })
    .await;
    let client = tokio::sync::Mutex::new(&mut c);
    eventually("writes resume", || async {
        let mut c = client.lock().await;
        title(&mut c, &session, "after")
            .await
            .is_none()
            .then_some(())
    })
    .await;
    drop(c);
    drop(a);
    // Everything acknowledged is in the stream: a fresh node start reads it.
    let a = node(&dir, &nats, "a");
    assert_eq!(session_title(&a, &session).await, "after");
}

/// A chat of `ahp-session:/s` on the `scripted` agent, for the journal tests.
fn chat_info(uri: &tandem::ids::ChannelUri) -> tandem::store::ChannelInfo {
    tandem::store::ChannelInfo {
        uri: uri.clone(),
        kind: tandem::store::ChannelKind::Chat,
        session: Some("ahp-session:/s".into()),
        provider: "scripted".into(),
        title: "Chat".into(),
        created_at: "2026-01-01T00:00:00.000Z".into(),
        owner: None,
    }
}

/// A node that takes over a session whose lease ran out (its holder gone,
/// or NATS away longer than the lease) asks for the session's chats too;
/// a chat among them that this node still writes must be left alone. Its
/// fence would refuse the node's own append in flight and leave the chat
/// written by nobody (seen after a NATS restart: an accepted turn that was
/// never ended).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_over_leaves_a_channel_this_node_writes_as_it_is() {
    use tandem::ids::{ChannelUri, JournalPos};
    use tandem::store::{Batch, ClusterConfig, ClusterLink, JetStreamJournal, Journal};
    let nats = NatsServer::start();
    let cfg = ClusterConfig::parse(&nats.url(), "j1").expect("config");
    let j = JetStreamJournal::connect(&cfg).await.expect("connect");
    let chat = ChannelUri::from("ahp-chat:/kept");
    j.create_channel(chat_info(&chat)).await.expect("create");
    j.append(
        &chat,
        JournalPos::new(0),
        Batch::of(vec!["{\"n\":1}".into()]),
    )
    .await
    .expect("append");
    let before = crate::common::nats::writers(&nats, chat.as_str()).await;
    assert!(
        j.take_over(vec![chat.clone()]).await.expect("take over"),
        "the chat is this node's"
    );
    assert_eq!(
        crate::common::nats::writers(&nats, chat.as_str()).await,
        before,
        "nothing written: no fence of this node's own chat"
    );
    assert!(j.owns(&chat));
    j.append(
        &chat,
        JournalPos::new(1),
        Batch::of(vec!["{\"n\":2}".into()]),
    )
    .await
    .expect("the next append goes on");
}

/// A channel whose appends are refused here (a fence moved it on) while
/// this node still holds its lease has the lease given up at the next
/// renewal, so a take-over can end what was open in it: renewed, the
/// channel would stay written by nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_this_node_cannot_write_under_is_given_up() {
    use tandem::ids::ChannelUri;
    use tandem::store::{ClusterConfig, JetStreamJournal, Journal};
    let nats = NatsServer::start();
    let mut cfg = ClusterConfig::parse(&nats.url(), "j1").expect("config");
    cfg.lease = Duration::from_millis(1500);
    let j = JetStreamJournal::connect(&cfg).await.expect("connect");
    let (refused, kept) = (
        ChannelUri::from("ahp-chat:/refused"),
        ChannelUri::from("ahp-chat:/kept"),
    );
    j.create_channel(chat_info(&refused)).await.expect("create");
    j.create_channel(chat_info(&kept)).await.expect("create");
    assert_eq!(j.owned(), 2);
    j.lost(&refused, "refused by a fence");
    eventually("the refused chat's lease is given up", || async {
        (j.leases()
            .holder(refused.as_str())
            .await
            .expect("holder")
            .is_none())
        .then_some(())
    })
    .await;
    assert_eq!(j.owned(), 1);
    use futures_util::StreamExt;
    // Renewals go on for the other chat, well past its lease time: four
    // renewals, a third of a lease apart, outlast an unrenewed lease.
    let client = async_nats::connect(nats.url())
        .await
        .expect("connect to NATS");
    let leases = async_nats::jetstream::new(client)
        .get_key_value(tandem::store::jetstream::LEASES)
        .await
        .expect("the lease bucket");
    let mut renewals = leases
        .watch(tandem::store::jetstream::token(kept.as_str()))
        .await
        .expect("watch the kept lease");
    for n in 1..=4 {
        let entry = tokio::time::timeout(crate::common::WAIT, renewals.next())
            .await
            .unwrap_or_else(|_| panic!("renewal {n} in time"))
            .expect("the watch goes on")
            .expect("a renewal");
        assert_eq!(entry.operation, async_nats::jetstream::kv::Operation::Put);
    }
    assert_eq!(
        j.leases()
            .holder(kept.as_str())
            .await
            .expect("holder")
            .as_deref(),
        Some("j1")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_jetstream_journal_keeps_what_the_sqlite_journal_keeps() {
    use tandem::ids::{ChannelUri, JournalPos};
    use tandem::store::{
        Batch, ClusterConfig, JetStreamJournal, Journal, JournalError, SnapshotRecord, TurnRecord,
    };
    let nats = NatsServer::start();
    let cfg = ClusterConfig::parse(&nats.url(), "j1").expect("config");
    let j = JetStreamJournal::connect(&cfg).await.expect("connect");
    let chat = ChannelUri::from("ahp-chat:/journal-test");
    j.create_channel(chat_info(&chat)).await.expect("create");
    // Appends are fenced by position, and several in flight go out together.
    let a1 = j.append(
        &chat,
        JournalPos::new(0),
        Batch::of(vec!["{\"n\":1}".into()]),
    );
    let a2 = j.append(
        &chat,
        JournalPos::new(1),
        Batch::of(vec!["{\"n\":2}".into()]),
    );
    let stale = j
        .append(
            &chat,
            JournalPos::new(0),
            Batch::of(vec!["{\"n\":0}".into()]),
        )
        .await;
    assert!(
        matches!(stale, Err(JournalError::Conflict { .. })),
        "{stale:?}"
    );
    a1.await.expect("first");
    a2.await.expect("second");
    let bob = ahp_types::actions::ActionOrigin {
        client_id: "bob".into(),
        client_seq: 7,
    };
    let turns = (0..5)
        .map(|i| TurnRecord {
            index: i,
            json: format!("{{\"turn\":{i}}}").into(),
        })
        .collect();
    j.append(
        &chat,
        JournalPos::new(2),
        Batch {
            records: vec!["{\"n\":3}".into(), "{\"n\":4}".into()],
            turns,
            truncate_turns_from: None,
            snapshot: Some(SnapshotRecord {
                at_seq: JournalPos::new(3),
                state: "{\"state\":3}".into(),
            }),
            // Who dispatched each record: kept, so a node reading the
            // channel again can still echo an action to its dispatcher.
            origins: vec![None, Some(bob.clone())],
            // Audit entries go to the audit stream once the batch is stored.
            audit: ["{\"a\":1}", "{\"a\":2}", "{\"a\":3}"]
                .map(|e| tandem::store::AuditRecord {
                    session: "ahp-session:/journal-test".into(),
                    entry: e.into(),
                })
                .to_vec(),
        },
    )
    .await
    .expect("third");
    assert_eq!(j.len(&chat), JournalPos::new(4));
    assert_eq!(j.bind_provider("p", "alice").await, Ok("alice".into()));
    drop(j);

    // Another connection (the same node after a restart) reads it all back.
    let j = JetStreamJournal::connect(&cfg)
        .await
        .expect("connect again");
    let j2 = j.clone();
    let r = tokio::task::spawn_blocking(move || j2.recover())
        .await
        .expect("task")
        .expect("recover");
    assert_eq!(r.channels.len(), 1);
    let c = &r.channels[0];
    assert_eq!(c.len, JournalPos::new(4));
    assert_eq!(
        c.snapshot.as_ref().map(|s| s.at_seq),
        Some(JournalPos::new(3))
    );
    assert_eq!(
        c.tail.iter().map(|t| t.to_string()).collect::<Vec<_>>(),
        ["{\"n\":4}"]
    );
    assert_eq!(c.tail_origins, [Some(bob)]);
    assert_eq!(c.turn_count, 5);
    assert_eq!(
        r.provider_owners.get("p").map(String::as_str),
        Some("alice")
    );
    assert_eq!(j.bind_provider("p", "mallory").await, Ok("alice".into()));
    let j2 = j.clone();
    let chat2 = chat.clone();
    let page = tokio::task::spawn_blocking(move || j2.turns_before(&chat2, 4, 2))
        .await
        .expect("task")
        .expect("page");
    assert_eq!(
        page.iter().map(|t| t.to_string()).collect::<Vec<_>>(),
        ["{\"turn\":2}", "{\"turn\":3}"]
    );
    // The audit log reads back a page at a time, after the last cursor.
    let j2 = j.clone();
    let audit = tokio::task::spawn_blocking(move || {
        let session = ChannelUri::from("ahp-session:/journal-test");
        let first = j2.audit_page(&session, 0, 2)?;
        let rest = j2.audit_page(&session, first.last().map_or(0, |(c, _)| *c), 2)?;
        Ok::<_, JournalError>((first, rest))
    })
    .await
    .expect("task")
    .expect("audit pages");
    let text =
        |p: &[(u64, std::sync::Arc<str>)]| p.iter().map(|(_, e)| e.to_string()).collect::<Vec<_>>();
    assert_eq!(text(&audit.0), ["{\"a\":1}", "{\"a\":2}"]);
    assert_eq!(text(&audit.1), ["{\"a\":3}"]);
    j.append(
        &chat,
        JournalPos::new(4),
        Batch::of(vec!["{\"n\":5}".into()]),
    )
    .await
    .expect("appends go on after recovery");

    // A disposed channel is gone from the stream and the buckets.
    j.remove(&chat);
    let j2 = j.clone();
    let gone = eventually("the channel is purged", || {
        let j2 = j2.clone();
        async move {
            let r = tokio::task::spawn_blocking(move || j2.recover())
                .await
                .expect("task")
                .expect("recover");
            r.channels.is_empty().then_some(())
        }
    })
    .await;
    assert_eq!(gone, ());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_config_files_cluster_table_starts_a_node_on_jetstream() {
    let nats = NatsServer::start();
    let dir = temp_dir("cluster");
    let file = dir.join("tandem.toml");
    std::fs::write(
        &file,
        format!(
            "[cluster]\nurls = [\"{}\"]\nnode_id = \"from-file\"\nlease_secs = 3\n",
            nats.url()
        ),
    )
    .expect("config file");
    let n = ServerProcess::spawn_with(
        &dir.join("n.log"),
        &["--config", file.to_str().expect("utf-8")],
    );
    let h: Value = eventually("the node answers", || async {
        let h = healthz(n.addr).await;
        h["cluster"].is_object().then_some(h)
    })
    .await;
    assert_eq!(h["cluster"]["node"], "from-file", "{h}");
    assert_eq!(h["cluster"]["nats"], "connected", "{h}");
}

/// The server's own records (the Web Push key, push subscriptions,
/// notification choices) are one set for the whole cluster: what one node
/// stores another reads, lists and cannot make twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_stored_by_one_node_are_read_by_another() {
    use tandem::store::{ClusterConfig, JetStreamJournal, Journal};
    let nats = NatsServer::start();
    let a = JetStreamJournal::connect(&ClusterConfig::parse(&nats.url(), "n1").expect("config"))
        .await
        .expect("connect");
    let b = JetStreamJournal::connect(&ClusterConfig::parse(&nats.url(), "n2").expect("config"))
        .await
        .expect("connect");
    let (sa, sb) = (a.settings().expect("kept"), b.settings().expect("kept"));
    tokio::task::spawn_blocking(move || {
        assert_eq!(sa.create("push/vapid", b"k1").expect("create"), b"k1");
        assert_eq!(
            sb.create("push/vapid", b"k2").expect("create"),
            b"k1",
            "made once"
        );
        sa.put("push/people/invite:ab/cd", b"{}").expect("put");
        sa.put("push/people/ann", b"[1]").expect("put");
        sa.put("notify/modes/ann", b"{}").expect("put");
        let listed = sb.list("push/people/").expect("list");
        let keys: Vec<&str> = listed.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["push/people/ann", "push/people/invite:ab/cd"]);
        sb.delete("push/people/ann").expect("delete");
        assert_eq!(sa.get("push/people/ann").expect("get"), None);
        assert_eq!(sa.list("push/people/").expect("list").len(), 1);
    })
    .await
    .expect("the checks ran");
}

/// A NATS that wants a user and password: a node given them (from a file)
/// works; one without is refused at start, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_logs_in_to_a_nats_that_wants_a_password() {
    const PASSWORD: &str = "s3cret-nats-password";
    let nats = NatsServer::start_with(&["--user", "tandem", "--pass", PASSWORD]);
    let dir = temp_dir("cluster-auth");
    let password = dir.join("nats-password");
    std::fs::write(&password, format!("{PASSWORD}\n")).expect("write");

    let url = nats.url();
    let refused = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_tandem"))
            .args([
                "serve",
                "--bind",
                "127.0.0.1:0",
                "--cluster",
                &url,
                "--node-id",
                "x",
            ])
            .output()
            .expect("run tandem")
    })
    .await
    .expect("ran");
    assert!(!refused.status.success(), "started without credentials");
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.to_lowercase().contains("authorization"), "{err}");

    let a = ServerProcess::spawn_with(
        &dir.join("a.log"),
        &[
            "--cluster",
            &nats.url(),
            "--node-id",
            "a",
            "--nats-user",
            "tandem",
            "--nats-password-file",
            password.to_str().expect("utf-8"),
        ],
    );
    let mut c = a.client("ann").await;
    let (session, _) = c.create_session().await;
    assert_eq!(
        title(&mut c, &session, "through a secured NATS").await,
        None
    );
    assert_eq!(session_title(&a, &session).await, "through a secured NATS");
    let log = std::fs::read_to_string(dir.join("a.log")).unwrap_or_default();
    assert!(!log.contains(PASSWORD), "the password is never logged");
}

/// Read-your-writes across nodes: a session created on one node, and its
/// default chat, can be subscribed on another node right away, every time
/// (the other node reads what it has not heard of yet from the store).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_made_on_one_node_opens_on_another_at_once() {
    let nats = NatsServer::start();
    let dir = temp_dir("cluster-ryw");
    let a = node(&dir, &nats, "a");
    let b = node(&dir, &nats, "b");
    let on_a = a.client("ann").await;
    let on_b = b.client("bob").await;
    for i in 0..100 {
        let (session, chat) = on_a.create_session().await;
        on_b.client
            .subscribe(session.clone())
            .await
            .unwrap_or_else(|e| panic!("try {i}: subscribe to {session} on b: {e:?}"));
        on_b.client
            .subscribe(chat.clone())
            .await
            .unwrap_or_else(|e| panic!("try {i}: subscribe to {chat} on b: {e:?}"));
    }
}

/// Following by interest: a node applies a chat another node owns only
/// while one of its own connections watches it. Nobody on b watches: a's
/// batches pass b by. Bob subscribes on b: the chat is read from the store
/// and is live from then on. Bob leaves: after the grace b lets it pass
/// again, and the next subscriber there reads it from the store, current.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_applies_another_nodes_chat_only_while_someone_there_watches_it() {
    let nats = NatsServer::start();
    let dir = temp_dir("cluster-interest");
    let a = node(&dir, &nats, "a");
    let b = ServerProcess::spawn_with(
        &dir.join("b.log"),
        &[
            "--cluster",
            &nats.url(),
            "--node-id",
            "b",
            "--lease-secs",
            "2",
            "--follow-grace-secs",
            "1",
        ],
    );
    let mut ca = a.client("ann").await;
    let (_session, chat) = ca.create_session().await;
    let draft = |text: &str| {
        action(
            json!({"type": "chat/draftChanged", "draft": {"text": text, "origin": {"kind": "user"}}}),
        )
    };
    let text = |m: &crate::common::ChatMirror| m.state.draft.as_ref().map(|d| d.text.clone());
    let watched = |v: &Value| v["cluster"]["chatsWatched"].as_u64().expect("a count");

    let seq = ca.dispatch(&chat, draft("one")).await;
    ca.wait_echo(None, seq).await;
    eventually("b lets a's batch pass", || async {
        (healthz(b.addr).await["cluster"]["batchesPassed"].as_u64() >= Some(1)).then_some(())
    })
    .await;
    assert_eq!(watched(&healthz(b.addr).await), 0);

    let mut cb = b.client("bob").await;
    let mut m = cb.subscribe_chat(&chat).await;
    assert_eq!(text(&m).as_deref(), Some("one"), "read from the store");
    assert_eq!(watched(&healthz(b.addr).await), 1);
    let passed = healthz(b.addr).await["cluster"]["batchesPassed"].clone();
    let seq = ca.dispatch(&chat, draft("two")).await;
    ca.wait_echo(None, seq).await;
    cb.wait_for(Some(&mut m), |e| {
        e.origin.as_ref().is_some_and(|o| o.client_seq == seq)
    })
    .await;
    assert_eq!(text(&m).as_deref(), Some("two"), "applied live");
    assert_eq!(healthz(b.addr).await["cluster"]["batchesPassed"], passed);

    cb.client.shutdown().await;
    eventually("b lets the chat go after the grace", || async {
        (watched(&healthz(b.addr).await) == 0).then_some(())
    })
    .await;
    let seq = ca.dispatch(&chat, draft("three")).await;
    ca.wait_echo(None, seq).await;
    eventually("b lets the next batch pass", || async {
        (healthz(b.addr).await["cluster"]["batchesPassed"] != passed).then_some(())
    })
    .await;
    let later = b.client("bob-later").await;
    let m = later.subscribe_chat(&chat).await;
    assert_eq!(
        text(&m).as_deref(),
        Some("three"),
        "read from the store again"
    );
}

/// NATS as an operator runs it: TLS, users with passwords, and Tandem's
/// own account limited to the subjects `docs/operating.md` lists. Two nodes
/// work through it together (a session made on one is written from the
/// other); a client without credentials is not let in, and one of another
/// account cannot reach the nodes' subjects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_work_through_a_nats_account_limited_to_their_subjects_over_tls() {
    use futures_util::StreamExt;
    let dir = temp_dir("cluster-secured");
    let (tls, _) = crate::common::test_certificate(&dir);
    let conf = dir.join("nats.conf");
    std::fs::write(
        &conf,
        crate::common::nats::secured_config(&tls.cert, &tls.key, "tandem-pass"),
    )
    .expect("nats.conf");
    let nats = NatsServer::start_with(&["-c", conf.to_str().expect("utf-8")]);
    let password = dir.join("password");
    std::fs::write(&password, "tandem-pass").expect("password");
    let url = nats.url().replace("nats://", "tls://");
    let node_on = |id: &str| {
        ServerProcess::spawn_with(
            &dir.join(format!("{id}.log")),
            &[
                "--cluster",
                &url,
                "--node-id",
                id,
                "--lease-secs",
                "2",
                "--nats-user",
                "tandem",
                "--nats-password-file",
                password.to_str().expect("utf-8"),
                "--nats-ca",
                tls.cert.to_str().expect("utf-8"),
            ],
        )
    };
    let tls_opts = || {
        async_nats::ConnectOptions::new()
            .add_root_certificates(tls.cert.clone())
            .require_tls(true)
    };
    // Another account, listening from the start.
    let other = tls_opts()
        .user_and_password("other".into(), "other".into())
        .connect(&url)
        .await
        .expect("the other account's user");
    let mut heard = other
        .subscribe("tandem.journal.>")
        .await
        .expect("subscribe in its own account");
    let (a, b) = (node_on("a"), node_on("b"));
    let ca = a.client("ann").await;
    let (session, chat) = ca.create_session().await;
    let mut cb = b.client("bob").await;
    let mut m = cb.subscribe_chat(&chat).await;
    assert_eq!(
        title(&mut cb, &session, "through the secured NATS").await,
        None
    );
    assert_eq!(
        session_title(&a, &session).await,
        "through the secured NATS"
    );
    cb.start_turn(&chat, "hello").await;
    cb.wait_state(&mut m, |s| s.active_turn.is_none() && !s.turns.is_empty())
        .await;
    assert_eq!(last_turn_markdown(&m.state), ["echo: hello"]);
    let violations = std::fs::read_to_string(nats.log()).unwrap_or_default();
    assert!(
        !violations.contains("Permissions Violation"),
        "the nodes need nothing beyond the list: {violations}"
    );

    // Without credentials: not let in.
    assert!(
        tls_opts().connect(&url).await.is_err(),
        "a client without credentials is refused"
    );
    // Another account: its requests reach no node, and it heard nothing
    // of what the nodes wrote meanwhile.
    let forged = other.request("tandem.node.a", "{}".into()).await;
    assert!(
        forged.is_err(),
        "no node answers another account: {forged:?}"
    );
    other.flush().await.expect("flushed");
    assert!(
        futures_util::FutureExt::now_or_never(heard.next())
            .flatten()
            .is_none(),
        "nothing of Tandem's is heard from another account"
    );
}

/// Placement: sessions made through one node spread over the live nodes
/// (each node tells the others how many it runs), a node that joins takes
/// new sessions until it has its share, and a session placed elsewhere is
/// usable through the node it was made through at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_sessions_spread_over_the_nodes_and_a_node_that_joins_takes_a_share() {
    let nats = NatsServer::start();
    let dir = temp_dir("cluster-placement");
    let a = node(&dir, &nats, "a");
    let b = node(&dir, &nats, "b");
    let sessions = |v: &Value, n: &str| v["cluster"]["nodes"][n].as_u64();
    let owned = |v: &Value| v["cluster"]["sessionsOwned"].as_u64().expect("a count");
    eventually("a hears of b", || async {
        sessions(&healthz(a.addr).await, "b").map(|_| ())
    })
    .await;
    let mut ca = a.client("ann").await;
    for _ in 0..10 {
        let (_, chat) = ca.create_session().await;
        ca.subscribe_chat(&chat).await;
    }
    let (on_a, on_b) = (owned(&healthz(a.addr).await), owned(&healthz(b.addr).await));
    assert_eq!(on_a + on_b, 10);
    assert!(
        on_b >= 3 && on_a.abs_diff(on_b) <= 3,
        "spread: a {on_a}, b {on_b}"
    );

    let c = node(&dir, &nats, "c");
    eventually("a hears of c", || async {
        sessions(&healthz(a.addr).await, "c").map(|_| ())
    })
    .await;
    let mut last = String::new();
    for _ in 0..6 {
        let (_, chat) = ca.create_session().await;
        last = chat;
    }
    let on_c = owned(&healthz(c.addr).await);
    assert!(on_c >= 3, "the new node took a share: {on_c} of 6");
    // The last one went to c (a and b were above it): a turn through a.
    assert!(c
        .client("probe")
        .await
        .subscribe_chat(&last)
        .await
        .state
        .turns
        .is_empty());
    let mut m = ca.subscribe_chat(&last).await;
    ca.start_turn(&last, "placed").await;
    ca.wait_state(&mut m, |s| s.active_turn.is_none() && !s.turns.is_empty())
        .await;
    assert_eq!(last_turn_markdown(&m.state), ["echo: placed"]);
}

/// Rebalancing: a session whose watchers are mostly on another node moves
/// there (once no turn runs in it), and goes on serving them from there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_moves_to_the_node_where_most_of_its_watchers_are() {
    let nats = NatsServer::start();
    let dir = temp_dir("cluster-affinity");
    let a = node(&dir, &nats, "a");
    let b = node(&dir, &nats, "b");
    let owned = |v: &Value| v["cluster"]["sessionsOwned"].as_u64().expect("a count");
    let maker = a.client("maker").await;
    let (_, chat) = maker.create_session().await;
    maker.client.shutdown().await;
    assert_eq!(owned(&healthz(a.addr).await), 1);
    let mut watchers = Vec::new();
    for k in 0..3 {
        let c = b.client(&format!("watcher-{k}")).await;
        let m = c.subscribe_chat(&chat).await;
        watchers.push((c, m));
    }
    eventually("b runs the session", || async {
        (owned(&healthz(b.addr).await) == 1).then_some(())
    })
    .await;
    assert_eq!(owned(&healthz(a.addr).await), 0);
    let (c, m) = &mut watchers[0];
    c.start_turn(&chat, "moved").await;
    c.wait_state(m, |s| s.active_turn.is_none() && !s.turns.is_empty())
        .await;
    assert_eq!(last_turn_markdown(&m.state), ["echo: moved"]);
}
