//! `coedit`: T typists type into one text answer at once
//! (`tandem/editText`, through `tandem::coedit::TextClient`, each at its own
//! caret) while S plain subscribers watch. Every keystroke is a character
//! of the typist's own, so the end state says exactly what was kept: the
//! final text must hold every keystroke, each typist's in the order typed,
//! and every typist, every subscriber and a fresh snapshot must agree on it.
//!
//! Latency is from a keystroke to each subscriber receiving the edit that
//! carries it (an edit sent while another is in flight carries every
//! keystroke typed meanwhile; it is timed from the oldest). CPU per
//! delivery is the server's CPU over the measured window divided by the
//! edits delivered to subscribers in it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context as _};
use clap::Args;
use futures_util::StreamExt;
use serde_json::{json, Value};
use tandem::coedit::{Edit, Outgoing, Received, TextClient, TextOp};
use tokio_tungstenite::tungstenite::Message;

use crate::clock::now_ns;
use crate::conn::{unique, Client, Endpoint};
use crate::proto;
use crate::report::ScenarioResult;
use crate::server::{Server, ServerOpts};
use crate::stats::{ShardedCounter, ShardedHist, Summary};

/// `coedit` flags.
#[derive(Args, Debug, Clone)]
pub struct CoeditArgs {
    /// People typing into the one answer.
    #[arg(long, default_value_t = 20)]
    pub typists: usize,
    /// Plain clients watching it.
    #[arg(long, default_value_t = 200)]
    pub subscribers: usize,
    /// Keystrokes per second per typist.
    #[arg(long, default_value_t = 10.0)]
    pub rate: f64,
    /// Seconds of typing.
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Leading seconds left out of latencies and CPU.
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Longest wait for everyone to agree after the last keystroke, seconds.
    #[arg(long, default_value_t = 15.0)]
    pub drain: f64,
}

/// What typists and watchers share.
struct Shared {
    /// Typist index by client id (the edits' `author`).
    typists: HashMap<String, usize>,
    /// When the oldest keystroke an edit carries was typed, by typist and
    /// edit number.
    typed_at: Vec<Vec<AtomicU64>>,
    /// Keystrokes typed before this are not timed.
    record_from: AtomicU64,
    latency: ShardedHist,
    /// Edits delivered to watchers.
    deliveries: ShardedCounter,
    /// Set once everyone stopped typing: the revision everyone must reach.
    final_rev: AtomicU64,
    done_typing: AtomicBool,
}

/// A typist's `k`-th character: a block of its own.
fn char_of(typist: usize, k: u64) -> char {
    char::from_u32(0x4E00 + 0x400 * typist as u32 + (k % 0x400) as u32).unwrap_or('?')
}

/// Run the scenario.
pub async fn run(args: &CoeditArgs, opts: &ServerOpts) -> anyhow::Result<ScenarioResult> {
    if args.typists == 0 || args.typists > 20 {
        bail!("--typists is 1 to 20 (each types from a block of characters of its own)");
    }
    let (server, plan) = super::store::start_default(opts, "coedit").await?;
    let res = run_on(&server, args, opts).await;
    super::store::finish(server, plan, res).await
}

async fn run_on(
    server: &Server,
    args: &CoeditArgs,
    opts: &ServerOpts,
) -> anyhow::Result<ScenarioResult> {
    let ep = Arc::new(Endpoint::new(&server.url, opts.source_ips).await?);
    let (chat, rid) = super::drafts::open_request(&ep, 1).await?;
    let target = json!({"requestId": rid, "questionId": "q0"});
    let keystrokes = (args.rate * args.seconds).ceil() as u64;
    let names: Vec<String> = (0..args.typists)
        .map(|i| unique(&format!("typist-{i}")))
        .collect();
    let shared = Arc::new(Shared {
        typists: names
            .iter()
            .cloned()
            .enumerate()
            .map(|(i, n)| (n, i))
            .collect(),
        typed_at: (0..args.typists)
            .map(|_| (0..=keystrokes + 1).map(|_| AtomicU64::new(0)).collect())
            .collect(),
        record_from: AtomicU64::new(u64::MAX),
        latency: ShardedHist::new(16),
        deliveries: ShardedCounter::new(64),
        final_rev: AtomicU64::new(u64::MAX),
        done_typing: AtomicBool::new(false),
    });

    let mut watchers = Vec::new();
    for s in 0..args.subscribers {
        let mut c = ep.client(&unique(&format!("watcher-{s}"))).await?;
        c.subscribe(&chat).await?;
        watchers.push(tokio::spawn(watch(c, s, shared.clone(), args.drain)));
    }
    let mut typists = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let mut c = ep.client(name).await?;
        c.subscribe(&chat).await?;
        let opened: Value = serde_json::from_str(
            &c.request(
                "tandem/openText",
                json!({"channel": chat, "target": target}),
            )
            .await?,
        )?;
        let text = TextClient::new(
            name.clone(),
            opened["text"].as_str().unwrap_or_default(),
            opened["rev"].as_u64().unwrap_or_default(),
        );
        let job = Typist {
            index: i,
            c,
            text,
            caret: 0,
            oldest_untimed: None,
            chat: chat.clone(),
            target: target.clone(),
            shared: shared.clone(),
            errors: 0,
        };
        typists.push(tokio::spawn(job.run(keystrokes, args.rate, args.drain)));
    }

    let pid = server.pid;
    let started = now_ns();
    let warm = Duration::from_secs_f64(args.warmup.min(args.seconds / 2.0));
    tokio::time::sleep(warm).await;
    shared.record_from.store(now_ns(), Ordering::Release);
    let cpu0 = pid.and_then(crate::sys::cpu_seconds);
    let d0 = shared.deliveries.load();
    let t0 = now_ns();
    let typing = Duration::from_secs_f64(args.seconds) - warm;
    tokio::time::sleep(typing).await;
    let cpu1 = pid.and_then(crate::sys::cpu_seconds);
    let d1 = shared.deliveries.load();
    let window = (now_ns() - t0) as f64 / 1e9;

    // Everyone stops typing and settles; then everyone catches up to the
    // last revision.
    let mut results = Vec::new();
    for t in typists {
        results.push(t.await.context("typist task")??);
    }
    let mut checker = ep.client(&unique("coedit-check")).await?;
    let last: Value = serde_json::from_str(
        &checker
            .request(
                "tandem/openText",
                json!({"channel": chat, "target": target}),
            )
            .await?,
    )?;
    let final_rev = last["rev"]
        .as_u64()
        .ok_or_else(|| anyhow!("no rev: {last}"))?;
    let final_text = last["text"].as_str().unwrap_or_default().to_owned();
    shared.final_rev.store(final_rev, Ordering::Release);
    shared.done_typing.store(true, Ordering::Release);
    let snap = checker.subscribe(&chat).await?;
    checker.close().await;
    let snapshot_text = snap.state.to_string();

    let mut typist_texts = Vec::new();
    let mut errors = 0;
    for mut r in results {
        r.catch_up(final_rev, args.drain).await?;
        errors += r.errors;
        typist_texts.push(r.text.text());
    }
    let mut watcher_texts = Vec::new();
    for w in watchers {
        watcher_texts.push(w.await.context("watcher task")??);
    }
    let elapsed = (now_ns() - started) as f64 / 1e9;

    // What was kept.
    let chars: Vec<char> = final_text.chars().collect();
    let mut missing = 0u64;
    let mut out_of_order = 0u64;
    for i in 0..args.typists {
        let mine: Vec<char> = chars
            .iter()
            .copied()
            .filter(|c| (*c as u32).wrapping_sub(0x4E00) / 0x400 == i as u32)
            .collect();
        let expected: Vec<char> = (0..keystrokes).map(|k| char_of(i, k)).collect();
        missing += expected.len().saturating_sub(mine.len()) as u64;
        if mine != expected {
            out_of_order += 1;
        }
    }
    let typists_agree = typist_texts.iter().all(|t| *t == final_text);
    let watchers_agree = watcher_texts.iter().all(|t| *t == final_text);
    let in_snapshot = snapshot_text.contains(&serde_json::to_string(&final_text)?);
    let converged = typists_agree && watchers_agree && in_snapshot;

    let lat = shared.latency.merged();
    let all = Summary::of(&lat);
    let delivered = d1.saturating_sub(d0);
    let params = json!({
        "typists": args.typists,
        "subscribers": args.subscribers,
        "keystrokes_per_sec_per_typist": args.rate,
        "seconds": args.seconds,
    });
    let mut r = ScenarioResult::new("coedit", &server.label, params);
    r.deliveries_per_sec = Some(delivered as f64 / window);
    r.set_latency(&all);
    r.converged = Some(converged);
    r.put("keystrokes", keystrokes * args.typists as u64);
    r.put("final_text_chars", chars.len() as u64);
    r.put("final_rev", final_rev);
    r.put("keystrokes_missing", missing);
    r.put("typists_out_of_order", out_of_order);
    r.put(
        "typists_agreeing",
        typist_texts.iter().filter(|t| **t == final_text).count() as u64,
    );
    r.put(
        "watchers_agreeing",
        watcher_texts.iter().filter(|t| **t == final_text).count() as u64,
    );
    r.put("edit_errors", errors);
    r.put("seconds_total", elapsed);
    if let (Some(a), Some(b)) = (cpu0, cpu1) {
        let cpu = b - a;
        r.put("server_cpu_cores", cpu / window);
        if delivered > 0 {
            r.put("server_cpu_us_per_delivery", cpu * 1e6 / delivered as f64);
        }
    }
    r.curve("keystroke → every subscriber", &lat);
    let kept = missing == 0 && out_of_order == 0;
    r.target(
        "typists, subscribers and a fresh snapshot agree",
        "converged",
        format!(
            "typists {}/{}, subscribers {}/{}, snapshot {}",
            typist_texts.iter().filter(|t| **t == final_text).count(),
            typist_texts.len(),
            watcher_texts.iter().filter(|t| **t == final_text).count(),
            watcher_texts.len(),
            in_snapshot
        ),
        converged,
    );
    r.target(
        "every keystroke kept, each typist's in order",
        "all",
        format!("{missing} missing, {out_of_order} typists out of order"),
        kept,
    );
    r.target(
        "p99 keystroke → every subscriber",
        "≤ 25 ms",
        format!("{:.2} ms", all.p99_ms),
        all.count > 0 && all.p99_ms <= 25.0,
    );
    if !converged || !kept || errors > 0 {
        r.failed = true;
    }
    Ok(r)
}

/// The edit a `tandem/textEdited` envelope carries.
fn edit_of(params: &Value) -> Option<Edit> {
    let a = &params["action"];
    if a["type"] != "tandem/textEdited" {
        return None;
    }
    Some(Edit {
        rev: a["rev"].as_u64()?,
        author: a["author"].as_str()?.to_owned(),
        seq: a["seq"].as_u64()?,
        op: serde_json::from_value(a["op"].clone()).ok()?,
    })
}

/// A watcher: times each edit's arrival and keeps the answer's last text.
async fn watch(
    mut c: Client,
    id: usize,
    shared: Arc<Shared>,
    drain: f64,
) -> anyhow::Result<String> {
    let mut text = String::new();
    let mut rev = 0;
    let mut samples = Vec::with_capacity(256);
    let mut heard = tokio::time::Instant::now();
    loop {
        if shared.done_typing.load(Ordering::Acquire)
            && rev >= shared.final_rev.load(Ordering::Acquire)
        {
            break;
        }
        // Short reads, so the end (set by others) is seen without a frame.
        let frame = match c.next_text(Duration::from_millis(100)).await {
            Ok(f) => f,
            Err(e) if heard.elapsed() > Duration::from_secs_f64(drain) => {
                bail!("watcher {id}: nothing for {drain} s: {e}")
            }
            Err(_) => continue,
        };
        heard = tokio::time::Instant::now();
        let now = now_ns();
        let v: Value = serde_json::from_str(&frame)?;
        if v["method"] != "action" {
            continue;
        }
        let a = &v["params"]["action"];
        if a["type"] == "chat/inputAnswerChanged" {
            text = a["answer"]["value"]["value"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            continue;
        }
        let Some(edit) = edit_of(&v["params"]) else {
            continue;
        };
        rev = edit.rev;
        shared.deliveries.add(id, 1);
        let Some(&t) = shared.typists.get(&edit.author) else {
            continue;
        };
        let typed = shared.typed_at[t]
            .get(edit.seq as usize)
            .map_or(0, |a| a.load(Ordering::Acquire));
        if typed != 0 && typed >= shared.record_from.load(Ordering::Acquire) {
            samples.push(now.saturating_sub(typed));
            if samples.len() >= 256 {
                shared.latency.flush(id, &mut samples);
            }
        }
    }
    shared.latency.flush(id, &mut samples);
    c.close().await;
    Ok(text)
}

/// One typist: types at its caret on a fixed schedule, one edit in flight.
struct Typist {
    index: usize,
    c: Client,
    text: TextClient,
    caret: usize,
    /// When the oldest keystroke not yet sent was typed.
    oldest_untimed: Option<u64>,
    chat: String,
    target: Value,
    shared: Arc<Shared>,
    errors: u64,
}

impl Typist {
    async fn run(mut self, keystrokes: u64, rate: f64, drain: f64) -> anyhow::Result<Self> {
        self.caret = self.text.units().len();
        // Frames that came in while the text was being opened.
        while let Some(frame) = self.c.pending.pop_front() {
            self.on_frame(&frame).await?;
        }
        let period = Duration::from_secs_f64(1.0 / rate.max(0.001));
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut typed = 0;
        let deadline = tokio::time::Instant::now()
            + Duration::from_secs_f64(keystrokes as f64 / rate.max(0.001) + drain);
        while typed < keystrokes || !self.text.settled() {
            if tokio::time::Instant::now() > deadline {
                bail!("typist {} did not settle in time", self.index);
            }
            tokio::select! {
                _ = tick.tick(), if typed < keystrokes => {
                    let ch = char_of(self.index, typed).to_string();
                    typed += 1;
                    self.type_str(&ch).await?;
                }
                frame = self.c.ws.next() => {
                    let frame = match frame {
                        Some(Ok(Message::Text(t))) => t.as_str().to_owned(),
                        Some(Ok(_)) => continue,
                        Some(Err(e)) => return Err(e.into()),
                        None => bail!("typist {}: connection closed", self.index),
                    };
                    self.on_frame(&frame).await?;
                }
            }
        }
        Ok(self)
    }

    async fn type_str(&mut self, s: &str) -> anyhow::Result<()> {
        let len = self.text.units().len();
        let mut op = TextOp::new();
        op.retain(self.caret).insert_str(s).retain(len - self.caret);
        self.caret += s.encode_utf16().count();
        self.oldest_untimed.get_or_insert_with(now_ns);
        let out = self.text.local(op)?;
        self.send(out).await
    }

    async fn send(&mut self, out: Option<Outgoing>) -> anyhow::Result<()> {
        let Some(out) = out else { return Ok(()) };
        if let (Some(t), Some(slot)) = (
            self.oldest_untimed.take(),
            self.shared.typed_at[self.index].get(out.seq as usize),
        ) {
            slot.store(t, Ordering::Release);
        }
        let id = self.c.next_id();
        let params = json!({"channel": self.chat, "target": self.target, "base": out.base, "seq": out.seq, "op": out.op});
        self.c
            .send(proto::request(id, "tandem/editText", &params))
            .await
    }

    async fn on_frame(&mut self, frame: &str) -> anyhow::Result<()> {
        let v: Value = serde_json::from_str(frame)?;
        if v["method"] == "action" {
            if let Some(edit) = edit_of(&v["params"]) {
                match self.text.receive(&edit)? {
                    Received::Remote(op) => self.caret = op.transform_index(self.caret, true),
                    Received::Acked(next) => self.send(next).await?,
                    Received::Old => {}
                }
            }
            return Ok(());
        }
        let err = &v["error"];
        if err.is_null() {
            return Ok(());
        }
        if err["code"] == -32011 {
            let d = &err["data"];
            let before = self.text.units().len();
            let (op, out) = self.text.rebase(
                d["text"].as_str().unwrap_or_default(),
                d["rev"].as_u64().unwrap_or_default(),
                d["taken"].as_u64().unwrap_or_default(),
            )?;
            debug_assert_eq!(op.base_len(), before);
            self.caret = op.transform_index(self.caret, true);
            return self.send(out).await;
        }
        self.errors += 1;
        Ok(())
    }

    /// Read on until the text is at `rev` (everyone's last edit).
    async fn catch_up(&mut self, rev: u64, drain: f64) -> anyhow::Result<()> {
        while self.text.rev() < rev {
            let frame = self.c.next_text(Duration::from_secs_f64(drain)).await?;
            self.on_frame(&frame).await?;
        }
        Ok(())
    }
}
