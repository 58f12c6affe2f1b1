//! One webhook: what it is told (its sessions, its kinds), the body it gets
//! (Tandem's JSON or a Slack-compatible message), the signature on it, and
//! the worker that delivers its queue in order, retrying with backoff.
//!
//! The signature follows the Standard Webhooks scheme receivers already
//! verify: headers `webhook-id` (the delivery's id, the same on every
//! retry), `webhook-timestamp` (Unix seconds of the attempt) and
//! `webhook-signature: v1,<base64 of HMAC-SHA256(secret, "<id>.<timestamp>.<body>")>`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::{Opened, Retry, Settle};
use crate::metrics::NotifyCounters;

/// Deliveries one webhook may have queued; past it the newest is dropped
/// (counted and logged), so a dead receiver holds a bounded amount.
const QUEUE: usize = 256;

/// The body's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// Tandem's JSON (documented in `docs/protocol.md`).
    #[default]
    Json,
    /// `{"text": …}` with a link, as Slack's incoming webhooks take.
    Slack,
}

/// Which requests a webhook is told of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Only {
    /// Every request for a person.
    #[default]
    All,
    /// Tool approvals only.
    Approvals,
}

/// A webhook as the operator configured it (`[[notify.webhooks]]`).
#[derive(Debug, Clone)]
pub struct WebhookSpec {
    /// Its name (logs, metrics, the admin view).
    pub name: String,
    /// Where deliveries go.
    pub url: url::Url,
    /// The sessions it is told of (`None`: every session).
    pub sessions: Option<Vec<String>>,
    /// The body's shape.
    pub format: Format,
    /// Which requests.
    pub only: Only,
    /// Whether the body says what is asked (the question, the tool's name,
    /// who settled it); without, only kinds, ids and the link.
    pub include_content: bool,
    /// The HMAC key of the signature (`None`: unsigned).
    pub secret: Option<Vec<u8>>,
    /// Whether it may target loopback or link-local addresses from a
    /// server that listens beyond loopback.
    pub allow_loopback: bool,
}

impl WebhookSpec {
    /// Whether this webhook is told of `o`.
    pub fn wants(&self, o: &Opened) -> bool {
        let kind_ok = self.only == Only::All || o.kind == crate::metrics::InteractionKind::Tool;
        let session_ok = self
            .sessions
            .as_ref()
            .is_none_or(|s| s.iter().any(|x| x == &o.session));
        kind_ok && session_ok
    }

    /// The body telling of `o` (`settled`: its end), for delivery `id`.
    pub fn body(&self, id: &str, o: &Opened, settled: Option<&Settle>, link: &str) -> Vec<u8> {
        let v = match self.format {
            Format::Json => self.json(id, o, settled, link),
            Format::Slack => json!({ "text": self.slack_text(o, settled, link) }),
        };
        serde_json::to_vec(&v).unwrap_or_default()
    }

    fn json(&self, id: &str, o: &Opened, settled: Option<&Settle>, link: &str) -> Value {
        let mut interaction = json!({"id": o.id, "kind": o.kind.as_str()});
        if self.include_content {
            interaction["title"] = o.title.clone().into();
            if let Some(t) = &o.tool {
                interaction["toolName"] = t.clone().into();
            }
        }
        let mut v = json!({
            "type": if settled.is_some() { "interaction.settled" } else { "interaction.opened" },
            "id": id,
            "at": crate::time::now_rfc3339(),
            "session": o.session,
            "chat": o.chat,
            "interaction": interaction,
            "link": link,
        });
        if let Some(s) = settled {
            v["outcome"] = s.outcome.as_str().into();
            if let (true, Some(by)) = (self.include_content, &s.by) {
                v["settledBy"] = json!({ "name": by });
            }
        }
        v
    }

    fn slack_text(&self, o: &Opened, settled: Option<&Settle>, link: &str) -> String {
        let what = match (self.include_content, o.kind) {
            (true, _) => o.title.clone(),
            (false, crate::metrics::InteractionKind::Tool) => "a tool call to approve".into(),
            (false, crate::metrics::InteractionKind::Url) => "a link to visit".into(),
            (false, crate::metrics::InteractionKind::Input) => "a question".into(),
        };
        match settled {
            None => format!("The agent needs you: {what} <{link}|Open>"),
            Some(s) => {
                let by = match (self.include_content, &s.by) {
                    (true, Some(b)) => format!(" by {b}"),
                    _ => String::new(),
                };
                format!("Settled ({}{by}): {what} <{link}|Open>", s.outcome.as_str())
            }
        }
    }
}

/// `v1,<base64 HMAC-SHA256(secret, "<id>.<timestamp>.<body>")>`.
pub fn signature(secret: &[u8], id: &str, timestamp: u64, body: &[u8]) -> String {
    let mut mac = <Hmac<sha2::Sha256> as KeyInit>::new_from_slice(secret)
        .expect("HMAC takes a key of any length");
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    let tag = mac.finalize().into_bytes();
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(tag)
    )
}

/// What the admin view shows of a webhook's last delivery.
#[derive(Debug, Clone, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LastDelivery {
    /// When it ended (RFC 3339).
    pub at: String,
    /// `sent`, `failed` or `dropped`.
    pub outcome: &'static str,
    /// The receiver's last HTTP status, if it answered.
    pub status: Option<u16>,
    /// Attempts made.
    pub attempts: u32,
    /// Why it failed, if it did.
    pub error: Option<String>,
    /// From its first attempt to its end.
    #[serde(skip)]
    pub seconds: f64,
}

/// A webhook's queue and what the admin view reads of it.
pub struct Webhook {
    /// Its configuration.
    pub spec: WebhookSpec,
    queue: mpsc::Sender<Delivery>,
    /// Its last delivery's outcome.
    pub last: Arc<Mutex<Option<LastDelivery>>>,
    counters: NotifyCounters,
}

/// One body to deliver.
pub struct Delivery {
    /// Its id (`webhook-id`; the same on every attempt).
    pub id: String,
    /// The body.
    pub body: Vec<u8>,
}

impl Webhook {
    /// The webhook with its worker started on the current runtime.
    pub fn start(
        spec: WebhookSpec,
        client: reqwest::Client,
        retry: Retry,
        counters: NotifyCounters,
    ) -> Self {
        let (queue, rx) = mpsc::channel(QUEUE);
        let last = Arc::new(Mutex::new(None));
        let worker = Worker {
            spec: spec.clone(),
            client,
            retry,
            last: last.clone(),
            counters: counters.clone(),
        };
        tokio::spawn(worker.run(rx));
        Self {
            spec,
            queue,
            last,
            counters,
        }
    }

    /// Queue `d`; a full queue drops it (counted and logged).
    pub fn send(&self, d: Delivery) {
        if let Err(e) = self.queue.try_send(d) {
            let d = match e {
                mpsc::error::TrySendError::Full(d) | mpsc::error::TrySendError::Closed(d) => d,
            };
            self.counters.dropped.increment(1);
            tracing::warn!(webhook = %self.spec.name, delivery = %d.id, "webhook queue full: delivery dropped");
            *self.last.lock() = Some(LastDelivery {
                at: crate::time::now_rfc3339(),
                outcome: "dropped",
                error: Some("the webhook's queue is full".into()),
                ..Default::default()
            });
        }
    }
}

struct Worker {
    spec: WebhookSpec,
    client: reqwest::Client,
    retry: Retry,
    last: Arc<Mutex<Option<LastDelivery>>>,
    counters: NotifyCounters,
}

/// How one attempt went.
pub(super) enum Attempt {
    Sent(u16),
    /// Worth trying again (5xx, 408, 429, a timeout, no connection).
    Again(Option<u16>, String),
    /// Not worth trying again (another 4xx, a refused target).
    Refused(Option<u16>, String),
}

impl Worker {
    async fn run(self, mut rx: mpsc::Receiver<Delivery>) {
        while let Some(d) = rx.recv().await {
            self.deliver(d).await;
        }
    }

    async fn deliver(&self, d: Delivery) {
        let name = &self.spec.name;
        let tried = with_retries(self.retry, || self.attempt(&d), |s, e, n| {
            tracing::debug!(webhook = %name, delivery = %d.id, status = ?s, error = %e, attempt = n, "webhook delivery failed; trying again");
        })
        .await;
        tried.count(&self.counters);
        if tried.outcome != "sent" {
            tracing::warn!(webhook = %name, delivery = %d.id, status = ?tried.status, error = ?tried.error, attempts = tried.attempts, "webhook delivery given up");
        }
        *self.last.lock() = Some(tried);
    }

    async fn attempt(&self, d: &Delivery) -> Attempt {
        let mut req = self
            .client
            .post(self.spec.url.clone())
            .timeout(self.retry.timeout)
            .header("content-type", "application/json")
            .header("user-agent", concat!("tandem/", env!("CARGO_PKG_VERSION")))
            .header("webhook-id", &d.id);
        if let Some(secret) = &self.spec.secret {
            let ts = crate::auth::now_secs();
            req = req
                .header("webhook-timestamp", ts.to_string())
                .header("webhook-signature", signature(secret, &d.id, ts, &d.body));
        }
        Attempt::of(req.body(d.body.clone()).send().await)
    }
}

impl Attempt {
    /// How a request went, by its answer: 2xx sent; 5xx, 408, 429, a
    /// timeout or no connection worth again; anything else refused.
    pub(super) fn of(res: Result<reqwest::Response, reqwest::Error>) -> Self {
        match res {
            Ok(r) => {
                let s = r.status().as_u16();
                match s {
                    200..=299 => Attempt::Sent(s),
                    408 | 429 | 500..=599 => Attempt::Again(Some(s), format!("HTTP {s}")),
                    _ => Attempt::Refused(Some(s), format!("HTTP {s}")),
                }
            }
            Err(e) if e.is_builder() => Attempt::Refused(None, error_chain(&e)),
            Err(e) => Attempt::Again(None, error_chain(&e)),
        }
    }
}

/// Make attempts until one is sent or refused, or `retry.attempts` were
/// made, waiting `first_backoff` (doubled each time, at most 60 s) between
/// them; `again` hears of each one tried again.
pub(super) async fn with_retries<F: std::future::Future<Output = Attempt>>(
    retry: Retry,
    mut attempt: impl FnMut() -> F,
    again: impl Fn(Option<u16>, &str, u32),
) -> LastDelivery {
    let started = Instant::now();
    let mut backoff = retry.first_backoff;
    let mut attempts = 0;
    let (outcome, status, error) = loop {
        attempts += 1;
        match attempt().await {
            Attempt::Sent(s) => break ("sent", Some(s), None),
            Attempt::Refused(s, e) => break ("failed", s, Some(e)),
            Attempt::Again(s, e) if attempts >= retry.attempts => break ("failed", s, Some(e)),
            Attempt::Again(s, e) => {
                again(s, &e, attempts);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(60));
            }
        }
    };
    LastDelivery {
        at: crate::time::now_rfc3339(),
        outcome,
        status,
        attempts,
        error,
        seconds: started.elapsed().as_secs_f64(),
    }
}

impl LastDelivery {
    /// Count it in `counters`.
    pub(super) fn count(&self, counters: &NotifyCounters) {
        counters.seconds.record(self.seconds);
        match self.outcome {
            "sent" => counters.sent.increment(1),
            "dropped" => counters.dropped.increment(1),
            _ => counters.failed.increment(1),
        }
    }
}

/// An error with its causes, as one line.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_hmac_sha256_of_id_timestamp_and_body() {
        // The Standard Webhooks scheme's published example.
        let secret = base64::engine::general_purpose::STANDARD
            .decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
            .expect("base64");
        let sig = signature(
            &secret,
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }
}
