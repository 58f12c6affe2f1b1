//! "The agent needs you": telling people who are not looking that a
//! request for a person waits — today through webhooks the operator
//! configures (`[[notify.webhooks]]`).
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

pub mod target;
pub mod webhook;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::metrics::{InteractionKind, Metrics, Settled};
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
}

impl Default for NotifyConfig {
    fn default() -> Self {
        Self {
            quiet_delay: Duration::from_secs(5),
            public_url: None,
            webhooks: Vec::new(),
            retry: Retry::default(),
        }
    }
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
}

/// The notifier every chat reports to (a no-op without webhooks).
pub struct Notifier {
    tx: Option<mpsc::UnboundedSender<Event>>,
    webhooks: Vec<(WebhookSpec, Arc<parking_lot::Mutex<Option<LastDelivery>>>)>,
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
    ) -> anyhow::Result<Self> {
        if config.webhooks.is_empty() {
            return Ok(Self::off());
        }
        let open = client(config.retry.timeout, false)?;
        let guarded = client(config.retry.timeout, true)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let cfg = config.clone();
        let counters = metrics.notify_webhook.clone();
        let loop_tx = tx.clone();
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
                    let _ = ready_tx.send(Ok(hooks
                        .iter()
                        .map(|h| (h.spec.clone(), h.last.clone()))
                        .collect()));
                    Dispatch {
                        hooks,
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
        })
    }

    /// A notifier that tells nobody.
    pub fn off() -> Self {
        Self {
            tx: None,
            webhooks: Vec::new(),
        }
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
}

struct Dispatch {
    hooks: Vec<Webhook>,
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
            },
        );
        let (tx, quiet) = (self.tx.clone(), self.quiet);
        tokio::spawn(async move {
            tokio::time::sleep(quiet).await;
            let _ = tx.send(Event::Due(key.0, key.1));
        });
    }

    fn due(&mut self, chat: String, id: String) {
        let Some(open) = self.open.get_mut(&(chat, id)) else {
            return; // settled within the quiet delay
        };
        let link = link(&self.base, &open.opened);
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

    fn settled(&mut self, s: Settle) {
        let Some(open) = self.open.remove(&(s.chat.clone(), s.id.clone())) else {
            return;
        };
        let link = link(&self.base, &open.opened);
        for i in open.told.unwrap_or_default() {
            let h = &self.hooks[i];
            let id = uuid::Uuid::now_v7().to_string();
            let body = h.spec.body(&id, &open.opened, Some(&s), &link);
            h.send(Delivery { id, body });
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
