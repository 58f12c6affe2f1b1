//! "The agent needs you": telling people who are not looking that a
//! request for a person waits — through the webhooks the operator
//! configures (`[[notify.webhooks]]`) and through Web Push to the browsers
//! people registered ([`push`], kept in the store by [`book`]).
//!
//! The chat that owns a request reports it here when it opens and when it
//! ends ([`Notifier::opened`], [`Notifier::settled`]): a message on a
//! channel, never a wait, so nothing here can slow the chat. A thread of
//! its own holds each open request for the quiet delay; one settled
//! within it is told to nobody. Past it, every webhook that wants it gets
//! one delivery, and later one telling how it ended. Each webhook has its
//! own queue and worker: a receiver that is slow or gone delays only its
//! own deliveries, which are retried with backoff and then given up
//! (logged and counted).
//!
//! A person is pushed to once per request, when their credential may open
//! the session, their role there can answer the request, their choice for
//! the session wants it ([`book::Mode`]), and they are not looking at the
//! chat ([`Audience`], which the server answers from the session's roles
//! and its presence table). One who stops looking while a request waits
//! is told a quiet delay later.

pub mod book;
pub mod push;
pub mod target;
pub mod webhook;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::metrics::{InteractionKind, Metrics, Settled};
use crate::people::Access;
use book::{Book, Holder};
use push::{Push, PushKeys, Pusher};
use webhook::{Delivery, Webhook};
pub use webhook::{Format, LastDelivery, Only, WebhookSpec};

/// How deliveries are retried.
#[derive(Debug, Clone, Copy)]
pub struct Retry {
    /// Attempts in all, the first included.
    pub attempts: u32,
    /// Wait before the second attempt; doubled after each (at most 60 s).
    pub first_backoff: Duration,
    /// Longest one attempt may take.
    pub timeout: Duration,
}

impl Default for Retry {
    fn default() -> Self {
        Self {
            attempts: 5,
            first_backoff: Duration::from_secs(1),
            timeout: Duration::from_secs(10),
        }
    }
}

/// What the server tells, to whom, and when (`[notify]`).
#[derive(Debug, Clone)]
pub struct NotifyConfig {
    /// How long a request waits before anyone is told (a person already
    /// looking has settled it by then).
    pub quiet_delay: Duration,
    /// The web client's address as people reach it (`https://host`), for
    /// the links in deliveries; `None`: the server's own bind address.
    pub public_url: Option<String>,
    /// The operator's webhooks.
    pub webhooks: Vec<WebhookSpec>,
    /// How deliveries are retried.
    pub retry: Retry,
    /// Whether browsers may register for Web Push.
    pub web_push: bool,
    /// The contact the Web Push signatures name (`mailto:` or `https:`);
    /// `None`: `public_url`, else `mailto:tandem@localhost`.
    pub push_contact: Option<String>,
}

impl Default for NotifyConfig {
    fn default() -> Self {
        Self {
            quiet_delay: Duration::from_secs(5),
            public_url: None,
            webhooks: Vec::new(),
            retry: Retry::default(),
            web_push: true,
            push_contact: None,
        }
    }
}

/// What the notifier asks the server about people.
pub trait Audience: Send + Sync + 'static {
    /// `holder`'s role in `session` now; `None` when they may not open it
    /// (a guest whose link ended, a session this node does not know).
    fn level(&self, session: &str, holder: &Holder) -> Option<Access>;
    /// Whether the person `subject` is looking at `chat` now.
    fn looking(&self, chat: &str, subject: &str) -> bool;
}

/// A request for a person that just opened.
#[derive(Debug, Clone)]
pub struct Opened {
    /// Its session.
    pub session: String,
    /// Its chat.
    pub chat: String,
    /// The input request's or tool call's id.
    pub id: String,
    /// Its kind.
    pub kind: InteractionKind,
    /// What it asks (the request's message, the URL, or the tool).
    pub title: String,
    /// The tool's name, for a tool approval.
    pub tool: Option<String>,
}

/// How a request ended.
#[derive(Debug, Clone)]
pub struct Settle {
    /// Its chat.
    pub chat: String,
    /// Its id.
    pub id: String,
    /// How.
    pub outcome: Settled,
    /// The name of who settled it, when a person did.
    pub by: Option<String>,
}

enum Event {
    Opened(Opened),
    Settled(Settle),
    Due(String, String),
    /// Someone stopped looking at this chat.
    Away(String),
    /// A push subscription ended.
    Ended(push::Ended),
}

type Told = Arc<std::sync::OnceLock<Arc<dyn Audience>>>;

/// The notifier every chat reports to.
pub struct Notifier {
    tx: Option<mpsc::UnboundedSender<Event>>,
    webhooks: Vec<(WebhookSpec, Arc<parking_lot::Mutex<Option<LastDelivery>>>)>,
    push: Option<PushSide>,
    audience: Told,
}

/// What the server's methods use of Web Push.
struct PushSide {
    public: String,
    book: Arc<Book>,
    guarded: bool,
}

impl Notifier {
    /// A notifier for `config`, its thread started when there is anyone to
    /// tell. `base` is the web client's address for links; with `guard`
    /// (the server listens beyond loopback) a webhook's name that resolves
    /// to loopback or link-local addresses is not reached, unless the
    /// webhook allows it.
    pub fn start(
        config: &NotifyConfig,
        base: String,
        guard: bool,
        metrics: &Metrics,
        settings: Option<Arc<dyn crate::store::Settings>>,
    ) -> anyhow::Result<Self> {
        let push = if config.web_push {
            let settings = settings.unwrap_or_else(|| {
                tracing::info!("no store: push subscriptions are kept in memory");
                Arc::new(crate::store::MemorySettings::default())
            });
            let contact = config
                .push_contact
                .clone()
                .or_else(|| config.public_url.clone())
                .unwrap_or_else(|| "mailto:tandem@localhost".into());
            let keys = PushKeys::load(&*settings, contact)
                .map_err(|e| anyhow::anyhow!("the Web Push key: {e}"))?;
            Some((Arc::new(keys), Arc::new(Book::new(settings))))
        } else {
            None
        };
        if config.webhooks.is_empty() && push.is_none() {
            return Ok(Self::off());
        }
        let open = client(config.retry.timeout, false)?;
        let guarded = client(config.retry.timeout, true)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let cfg = config.clone();
        let counters = metrics.notify_webhook.clone();
        let push_counters = metrics.notify_push.clone();
        let loop_tx = tx.clone();
        let audience: Told = Arc::default();
        let heard = audience.clone();
        let pushing = push.clone();
        std::thread::Builder::new()
            .name("tandem-notify".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                rt.block_on(async move {
                    let hooks: Vec<Webhook> = cfg
                        .webhooks
                        .iter()
                        .map(|s| {
                            let c = if guard && !s.allow_loopback {
                                &guarded
                            } else {
                                &open
                            };
                            Webhook::start(s.clone(), c.clone(), cfg.retry, counters.clone())
                        })
                        .collect();
                    let people = pushing.map(|(keys, book)| {
                        let (ended_tx, mut ended) = mpsc::unbounded_channel();
                        let back = loop_tx.clone();
                        tokio::spawn(async move {
                            while let Some(e) = ended.recv().await {
                                let _ = back.send(Event::Ended(e));
                            }
                        });
                        let c = if guard { &guarded } else { &open };
                        People {
                            pusher: Pusher::start(
                                keys,
                                c.clone(),
                                cfg.retry,
                                push_counters,
                                ended_tx,
                            ),
                            book,
                            audience: heard,
                        }
                    });
                    let _ = ready_tx.send(Ok(hooks
                        .iter()
                        .map(|h| (h.spec.clone(), h.last.clone()))
                        .collect()));
                    Dispatch {
                        hooks,
                        people,
                        quiet: cfg.quiet_delay,
                        base,
                        open: HashMap::new(),
                        tx: loop_tx,
                    }
                    .run(rx)
                    .await;
                });
            })?;
        let webhooks = ready_rx
            .recv()
            .map_err(|_| anyhow::anyhow!("the notifier's thread did not start"))?
            .map_err(anyhow::Error::msg)?;
        Ok(Self {
            tx: Some(tx),
            webhooks,
            push: push.map(|(keys, book)| PushSide {
                public: keys.public.clone(),
                book,
                guarded: guard,
            }),
            audience,
        })
    }

    /// A notifier that tells nobody.
    pub fn off() -> Self {
        Self {
            tx: None,
            webhooks: Vec::new(),
            push: None,
            audience: Arc::default(),
        }
    }

    /// From now on, ask `audience` who may be told and who is looking
    /// (until then nobody is pushed to).
    pub fn serve(&self, audience: Arc<dyn Audience>) {
        let _ = self.audience.set(audience);
    }

    /// Someone stopped looking at `chat`: a request there they were not
    /// told of is told to them a quiet delay from now.
    pub fn looked_away(&self, chat: &str) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Event::Away(chat.to_owned()));
        }
    }

    /// The server's VAPID public key, when Web Push is on.
    pub fn push_key(&self) -> Option<&str> {
        self.push.as_ref().map(|p| p.public.as_str())
    }

    /// The people's records, when Web Push is on (their store calls
    /// block: run them off the serving threads).
    pub fn book(&self) -> Option<&Arc<Book>> {
        self.push.as_ref().map(|p| &p.book)
    }

    /// Whether push endpoints must be https and not loopback (the server
    /// listens beyond loopback).
    pub fn guarded(&self) -> bool {
        self.push.as_ref().is_some_and(|p| p.guarded)
    }

    /// Request `o` waits for a person from now on.
    pub fn opened(&self, o: Opened) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Event::Opened(o));
        }
    }

    /// A request ended.
    pub fn settled(&self, s: Settle) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Event::Settled(s));
        }
    }

    /// Every webhook with its last delivery (the admin view).
    pub fn webhooks(&self) -> Vec<(WebhookSpec, Option<LastDelivery>)> {
        self.webhooks
            .iter()
            .map(|(s, last)| (s.clone(), last.lock().clone()))
            .collect()
    }
}

/// The HTTP client deliveries go out on: rustls with the machine's roots,
/// no redirects (a receiver cannot send a delivery elsewhere), no proxy
/// from the environment; `guarded`: names resolved through
/// [`target::Guarded`].
fn client(timeout: Duration, guarded: bool) -> anyhow::Result<reqwest::Client> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    let found = rustls_native_certs::load_native_certs();
    for cert in found.certs {
        let _ = roots.add(cert);
    }
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut b = reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .connect_timeout(timeout);
    if guarded {
        b = b.dns_resolver(target::guarded());
    }
    Ok(b.build()?)
}

/// One open request as the dispatcher holds it.
struct Open {
    opened: Opened,
    /// The webhooks told of it (by index), once its quiet delay passed.
    told: Option<Vec<usize>>,
    /// The people pushed to (by subject).
    pushed: HashSet<String>,
    /// A check of who to tell is scheduled.
    due: bool,
}

/// Web Push: the worker, the records, the server's answers.
struct People {
    pusher: Pusher,
    book: Arc<Book>,
    audience: Told,
}

struct Dispatch {
    hooks: Vec<Webhook>,
    people: Option<People>,
    quiet: Duration,
    base: String,
    open: HashMap<(String, String), Open>,
    tx: mpsc::UnboundedSender<Event>,
}

impl Dispatch {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Event>) {
        while let Some(e) = rx.recv().await {
            match e {
                Event::Opened(o) => self.opened(o),
                Event::Due(chat, id) => self.due(chat, id),
                Event::Settled(s) => self.settled(s),
                Event::Away(chat) => self.away(&chat),
                Event::Ended((subject, endpoint)) => {
                    if let Some(p) = &self.people {
                        if let Err(e) = p.book.unsubscribe(&subject, &endpoint) {
                            tracing::warn!(error = %e, "an ended push subscription could not be forgotten");
                        }
                    }
                }
            }
        }
    }

    fn opened(&mut self, o: Opened) {
        let key = (o.chat.clone(), o.id.clone());
        if self.open.contains_key(&key) {
            return;
        }
        self.open.insert(
            key.clone(),
            Open {
                opened: o,
                told: None,
                pushed: HashSet::new(),
                due: false,
            },
        );
        self.schedule(key);
    }

    /// Check who to tell of `key` a quiet delay from now (once at a time).
    fn schedule(&mut self, key: (String, String)) {
        let Some(open) = self.open.get_mut(&key) else {
            return;
        };
        if open.due {
            return;
        }
        open.due = true;
        let (tx, quiet) = (self.tx.clone(), self.quiet);
        tokio::spawn(async move {
            tokio::time::sleep(quiet).await;
            let _ = tx.send(Event::Due(key.0, key.1));
        });
    }

    fn away(&mut self, chat: &str) {
        let waiting: Vec<_> = self
            .open
            .iter()
            .filter(|((c, _), o)| c == chat && o.told.is_some())
            .map(|(k, _)| k.clone())
            .collect();
        for key in waiting {
            self.schedule(key);
        }
    }

    fn due(&mut self, chat: String, id: String) {
        let Some(open) = self.open.get_mut(&(chat, id)) else {
            return; // settled within the quiet delay
        };
        open.due = false;
        let link = link(&self.base, &open.opened);
        if open.told.is_none() {
            let mut told = Vec::new();
            for (i, h) in self.hooks.iter().enumerate() {
                if h.spec.wants(&open.opened) {
                    let id = uuid::Uuid::now_v7().to_string();
                    let body = h.spec.body(&id, &open.opened, None, &link);
                    h.send(Delivery { id, body });
                    told.push(i);
                }
            }
            open.told = Some(told);
        }
        if let Some(people) = &self.people {
            people.tell(open, &link);
        }
    }

    fn settled(&mut self, s: Settle) {
        let Some(open) = self.open.remove(&(s.chat.clone(), s.id.clone())) else {
            return;
        };
        let link = link(&self.base, &open.opened);
        for i in open.told.iter().flatten() {
            let h = &self.hooks[*i];
            let id = uuid::Uuid::now_v7().to_string();
            let body = h.spec.body(&id, &open.opened, Some(&s), &link);
            h.send(Delivery { id, body });
        }
        if let Some(people) = &self.people {
            people.withdraw(&open, &s);
        }
    }
}

impl People {
    /// Push `open` to everyone who should hear of it now and has not.
    fn tell(&self, open: &mut Open, link: &str) {
        let Some(audience) = self.audience.get() else {
            return;
        };
        let o = &open.opened;
        let holders = match self.book.holders() {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(error = %e, "push subscriptions could not be read: nobody pushed to");
                return;
            }
        };
        let need = match o.kind {
            InteractionKind::Tool => Access::Approver,
            _ => Access::Participant,
        };
        let payload = serde_json::to_vec(&serde_json::json!({
            "type": "opened",
            "tag": format!("{}#{}", o.chat, o.id),
            "session": o.session,
            "chat": o.chat,
            "id": o.id,
            "kind": o.kind.as_str(),
            "title": match o.kind {
                InteractionKind::Tool => "Approval needed",
                _ => "The agent needs you",
            },
            "body": o.title,
            "url": link,
        }))
        .unwrap_or_default();
        let topic = push::topic(&o.chat, &o.id);
        for h in holders {
            if open.pushed.contains(&h.subject) || !h.may_open(&o.session) {
                continue;
            }
            if audience.level(&o.session, &h).is_none_or(|l| l < need) {
                continue;
            }
            match self.book.mode(&h.subject, &o.session) {
                Ok(m) if m.wants(o.kind) => {}
                Ok(_) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "a notification choice could not be read");
                    continue;
                }
            }
            if audience.looking(&o.chat, &h.subject) {
                continue;
            }
            for device in &h.devices {
                self.pusher.send(Push {
                    subject: h.subject.clone(),
                    device: device.clone(),
                    payload: payload.clone(),
                    urgency: "high",
                    topic: topic.clone(),
                });
            }
            open.pushed.insert(h.subject);
        }
    }

    /// Tell everyone pushed to of `open` how it ended.
    fn withdraw(&self, open: &Open, s: &Settle) {
        let o = &open.opened;
        let mut body = serde_json::json!({
            "type": "settled",
            "tag": format!("{}#{}", o.chat, o.id),
            "session": o.session,
            "chat": o.chat,
            "id": o.id,
            "outcome": s.outcome.as_str(),
        });
        if let Some(by) = &s.by {
            body["settledBy"] = by.clone().into();
        }
        let payload = serde_json::to_vec(&body).unwrap_or_default();
        let topic = push::topic(&o.chat, &o.id);
        for subject in &open.pushed {
            let Ok(Some(h)) = self.book.holder(subject) else {
                continue;
            };
            for device in h.devices {
                self.pusher.send(Push {
                    subject: subject.clone(),
                    device,
                    payload: payload.clone(),
                    urgency: "normal",
                    topic: topic.clone(),
                });
            }
        }
    }
}

/// The web client's page of `o`'s chat.
fn link(base: &str, o: &Opened) -> String {
    let tail = |uri: &str| uri.rsplit('/').next().unwrap_or_default().to_owned();
    format!(
        "{}/#/s/{}/{}",
        base.trim_end_matches('/'),
        tail(&o.session),
        tail(&o.chat)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_opens_the_chat_in_the_web_client() {
        let o = Opened {
            session: "ahp-session:/0b1c".into(),
            chat: "ahp-chat:/9f8e".into(),
            id: "q1".into(),
            kind: InteractionKind::Input,
            title: "Which window?".into(),
            tool: None,
        };
        assert_eq!(
            link("https://t.example.com/", &o),
            "https://t.example.com/#/s/0b1c/9f8e"
        );
    }
}
