//! Web Push (RFC 8030) to the browsers people registered: the server's
//! VAPID key (RFC 8292), made on first start and kept in the store's
//! settings so every node of a cluster signs with the same one; the
//! subscription a browser hands over, checked; and the worker that
//! encrypts each payload for its browser (RFC 8291, `aes128gcm`, by the
//! `web-push-native` crate) and posts it, retrying like a webhook. A push
//! service that answers 404 or 410 has ended the subscription: the
//! dispatcher is told, and forgets it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::{mpsc, Semaphore};
use web_push_native::jwt_simple::algorithms::{ECDSAP256PublicKeyLike, ES256KeyPair};
use web_push_native::{p256, Auth, WebPushBuilder};

use super::webhook::{with_retries, Attempt};
use super::{book::Device, Retry};
use crate::metrics::NotifyCounters;
use crate::store::{JournalError, Settings};

/// The settings key of the server's VAPID private key (its 32 bytes).
const KEY: &str = "push/vapid";
/// How long a push service keeps a push it could not deliver yet.
const TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// Pushes being delivered at once (to different browsers).
const IN_FLIGHT: usize = 32;
/// Pushes one browser may have waiting; past it a push is dropped
/// (counted).
const QUEUE: usize = 64;
/// A browser's worker with nothing to send for this long stops.
const IDLE: Duration = Duration::from_secs(60);

/// The server's VAPID key pair and the contact its signatures name.
pub struct PushKeys {
    pair: ES256KeyPair,
    /// The public key as browsers take it (`applicationServerKey`):
    /// base64url of the uncompressed P-256 point.
    pub public: String,
    contact: String,
}

impl PushKeys {
    /// The key kept in `settings`, made (once, for every node) when there
    /// is none; `contact` goes into every signature (`mailto:` or `https:`).
    pub fn load(settings: &dyn Settings, contact: String) -> Result<Self, JournalError> {
        let fresh = ES256KeyPair::generate().to_bytes();
        let kept = settings.create(KEY, &fresh)?;
        let pair = ES256KeyPair::from_bytes(&kept).map_err(|e| {
            JournalError::Unavailable(format!("the stored Web Push key cannot be read: {e}"))
        })?;
        let public = B64.encode(pair.public_key().public_key().to_bytes_uncompressed());
        Ok(Self {
            pair,
            public,
            contact,
        })
    }
}

/// A browser's `PushSubscription.toJSON()`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Subscription {
    /// The push service's URL for it.
    pub endpoint: String,
    /// When it ends, if the browser says.
    #[serde(default)]
    pub expiration_time: Option<Value>,
    /// Its keys.
    pub keys: SubscriptionKeys,
}

/// `keys` of a [`Subscription`].
#[derive(Debug, Clone, Deserialize)]
pub struct SubscriptionKeys {
    /// base64url of the browser's P-256 public key.
    pub p256dh: String,
    /// base64url of its 16-byte secret.
    pub auth: String,
}

/// Decode base64url, padded or not.
fn unb64(s: &str) -> Option<Vec<u8>> {
    B64.decode(s.trim_end_matches('=')).ok()
}

impl Subscription {
    /// The device to keep, or why it cannot be: an endpoint that is not
    /// `https` (`http` allowed unless `guarded`, a server listening beyond
    /// loopback, which also refuses loopback and link-local targets), a key
    /// that is not a P-256 point, a secret that is not 16 bytes.
    pub fn device(&self, guarded: bool) -> Result<Device, String> {
        let url = url::Url::parse(&self.endpoint)
            .map_err(|e| format!("`endpoint` `{}` is not a URL: {e}", self.endpoint))?;
        if guarded && url.scheme() != "https" {
            return Err(format!(
                "`endpoint` must be an https URL (got `{}`)",
                self.endpoint
            ));
        }
        super::target::check(&url, guarded).map_err(|e| format!("`endpoint`: {e}"))?;
        let key =
            unb64(&self.keys.p256dh).ok_or_else(|| "`keys.p256dh` is not base64url".to_owned())?;
        p256::PublicKey::from_sec1_bytes(&key)
            .map_err(|_| "`keys.p256dh` is not a P-256 public key".to_owned())?;
        let auth =
            unb64(&self.keys.auth).ok_or_else(|| "`keys.auth` is not base64url".to_owned())?;
        if auth.len() != 16 {
            return Err(format!("`keys.auth` must be 16 bytes (got {})", auth.len()));
        }
        Ok(Device {
            endpoint: url.to_string(),
            p256dh: B64.encode(key),
            auth: B64.encode(auth),
            at_secs: crate::auth::now_secs(),
        })
    }
}

/// One push to deliver.
pub struct Push {
    /// To whom (the subject), for forgetting an ended subscription.
    pub subject: String,
    /// Their browser.
    pub device: Device,
    /// The payload (JSON), encrypted for the browser when sent.
    pub payload: Vec<u8>,
    /// `Urgency`: `high` for a request, `normal` for its end.
    pub urgency: &'static str,
    /// `Topic`: the request's, so its end replaces a start not delivered.
    pub topic: String,
}

/// The push queues, one per browser, and their workers.
///
/// Each browser's pushes go out in order (a request's end never overtakes
/// its start), on a worker of its own, so a push service that is slow or
/// gone delays only its own browsers; [`IN_FLIGHT`] bounds how many are
/// sent at once.
pub struct Pusher {
    queues: parking_lot::Mutex<HashMap<String, mpsc::Sender<Push>>>,
    slots: Arc<Semaphore>,
    keys: Arc<PushKeys>,
    client: reqwest::Client,
    retry: Retry,
    counters: NotifyCounters,
    ended: mpsc::UnboundedSender<Ended>,
}

/// What the worker tells the dispatcher: the subscription of `.0` at
/// endpoint `.1` has ended.
pub type Ended = (String, String);

impl Pusher {
    /// The pusher, its workers started on the current runtime as browsers
    /// need them, sending on `client`.
    pub fn start(
        keys: Arc<PushKeys>,
        client: reqwest::Client,
        retry: Retry,
        counters: NotifyCounters,
        ended: mpsc::UnboundedSender<Ended>,
    ) -> Self {
        Self {
            queues: parking_lot::Mutex::new(HashMap::new()),
            slots: Arc::new(Semaphore::new(IN_FLIGHT)),
            keys,
            client,
            retry,
            counters,
            ended,
        }
    }

    /// Queue `p` behind its browser's earlier pushes; a full queue drops
    /// it (counted and logged).
    pub fn send(&self, p: Push) {
        let mut queues = self.queues.lock();
        let p = match queues.get(&p.device.endpoint).cloned() {
            None => p,
            Some(q) => match q.try_send(p) {
                Ok(()) => return,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    self.counters.dropped.increment(1);
                    tracing::warn!("a browser's push queue is full: a push was dropped");
                    return;
                }
                // Its worker went idle and stopped: start another.
                Err(mpsc::error::TrySendError::Closed(p)) => p,
            },
        };
        let (tx, rx) = mpsc::channel(QUEUE);
        queues.retain(|_, q| !q.is_closed());
        queues.insert(p.device.endpoint.clone(), tx.clone());
        let _ = tx.try_send(p);
        let w = Worker {
            slots: self.slots.clone(),
            keys: self.keys.clone(),
            client: self.client.clone(),
            retry: self.retry,
            counters: self.counters.clone(),
            ended: self.ended.clone(),
        };
        tokio::spawn(w.run(rx));
    }
}

/// One browser's worker.
struct Worker {
    slots: Arc<Semaphore>,
    keys: Arc<PushKeys>,
    client: reqwest::Client,
    retry: Retry,
    counters: NotifyCounters,
    ended: mpsc::UnboundedSender<Ended>,
}

impl Worker {
    async fn run(self, mut rx: mpsc::Receiver<Push>) {
        loop {
            let p = match tokio::time::timeout(IDLE, rx.recv()).await {
                Ok(Some(p)) => p,
                Ok(None) => return,
                Err(_) => {
                    // Idle: stop taking pushes, deliver what came meanwhile.
                    rx.close();
                    while let Ok(p) = rx.try_recv() {
                        self.one(p).await;
                    }
                    return;
                }
            };
            self.one(p).await;
        }
    }

    async fn one(&self, p: Push) {
        let Ok(_slot) = self.slots.acquire().await else {
            return;
        };
        deliver(
            &self.keys,
            &self.client,
            self.retry,
            &self.counters,
            &self.ended,
            p,
        )
        .await;
    }
}

async fn deliver(
    keys: &PushKeys,
    client: &reqwest::Client,
    retry: Retry,
    counters: &NotifyCounters,
    ended: &mpsc::UnboundedSender<Ended>,
    p: Push,
) {
    let host = url::Url::parse(&p.device.endpoint)
        .ok()
        .and_then(|u| u.host_str().map(str::to_owned))
        .unwrap_or_default();
    let request = match encrypt(keys, &p) {
        Ok(r) => r,
        Err(e) => {
            counters.failed.increment(1);
            tracing::warn!(push_service = %host, error = %e, "push not sent");
            return;
        }
    };
    let tried = with_retries(
        retry,
        || {
            let mut req = client
                .post(p.device.endpoint.clone())
                .timeout(retry.timeout)
                .headers(request.headers().clone())
                .header("urgency", p.urgency)
                .header("topic", p.topic.clone())
                .header("user-agent", concat!("tandem/", env!("CARGO_PKG_VERSION")));
            req = req.body(request.body().clone());
            async move { Attempt::of(req.send().await) }
        },
        |s, e, n| {
            tracing::debug!(push_service = %host, status = ?s, error = %e, attempt = n, "push failed; trying again");
        },
    )
    .await;
    tried.count(counters);
    match tried.status {
        Some(404 | 410) => {
            tracing::info!(push_service = %host, "push subscription ended: forgotten");
            let _ = ended.send((p.subject, p.device.endpoint));
        }
        _ if tried.outcome != "sent" => {
            tracing::warn!(push_service = %host, status = ?tried.status, error = ?tried.error, attempts = tried.attempts, "push given up");
        }
        _ => {}
    }
}

/// The encrypted, signed request for `p` (its body and headers).
fn encrypt(keys: &PushKeys, p: &Push) -> Result<http::Request<Vec<u8>>, String> {
    let endpoint: http::Uri = p
        .device
        .endpoint
        .parse()
        .map_err(|e| format!("endpoint: {e}"))?;
    let key = unb64(&p.device.p256dh)
        .and_then(|k| p256::PublicKey::from_sec1_bytes(&k).ok())
        .ok_or("the subscription's key is not a P-256 point")?;
    let auth = unb64(&p.device.auth)
        .filter(|a| a.len() == 16)
        .ok_or("the subscription's secret is not 16 bytes")?;
    WebPushBuilder::new(endpoint, key, Auth::clone_from_slice(&auth))
        .with_valid_duration(TTL)
        .with_vapid(&keys.pair, &keys.contact)
        .build(p.payload.clone())
        .map_err(|e| e.to_string())
}

/// The `Topic` of request `id` in `chat`: at most 32 characters of the
/// base64url alphabet (RFC 8030 §5.4), here hex of its digest.
pub fn topic(chat: &str, id: &str) -> String {
    let digest = crate::digest::sha256(format!("{chat}#{id}").as_bytes());
    let hex = digest.trim_start_matches("sha256:");
    hex[..32.min(hex.len())].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemorySettings;

    fn browser() -> (p256::SecretKey, [u8; 16], Subscription) {
        let secret =
            p256::SecretKey::random(&mut web_push_native::p256::elliptic_curve::rand_core::OsRng);
        let auth = [7u8; 16];
        use web_push_native::p256::elliptic_curve::sec1::ToEncodedPoint;
        let public = secret.public_key().to_encoded_point(false);
        let sub = Subscription {
            endpoint: "https://push.example.com/s/1".into(),
            expiration_time: None,
            keys: SubscriptionKeys {
                p256dh: B64.encode(public.as_bytes()),
                auth: B64.encode(auth),
            },
        };
        (secret, auth, sub)
    }

    #[test]
    fn the_key_is_made_once_and_kept() {
        let s = MemorySettings::default();
        let a = PushKeys::load(&s, "mailto:ops@example.com".into()).expect("key");
        let b = PushKeys::load(&s, "mailto:ops@example.com".into()).expect("key");
        assert_eq!(a.public, b.public);
        assert_eq!(unb64(&a.public).map(|k| k.len()), Some(65));
    }

    #[test]
    fn a_push_decrypts_with_the_browsers_keys() {
        let s = MemorySettings::default();
        let keys = PushKeys::load(&s, "mailto:ops@example.com".into()).expect("key");
        let (secret, auth, sub) = browser();
        let p = Push {
            subject: "ann".into(),
            device: sub.device(true).expect("device"),
            payload: br#"{"type":"opened"}"#.to_vec(),
            urgency: "high",
            topic: topic("ahp-chat:/c", "q1"),
        };
        let req = encrypt(&keys, &p).expect("request");
        assert_eq!(req.headers()["content-encoding"], "aes128gcm");
        assert!(req.headers()["authorization"]
            .to_str()
            .expect("ascii")
            .starts_with("vapid t="));
        let plain =
            web_push_native::decrypt(req.body().clone(), &secret, &Auth::clone_from_slice(&auth))
                .expect("decrypts");
        assert_eq!(plain, br#"{"type":"opened"}"#);
        assert!(p.topic.len() <= 32);
    }

    #[test]
    fn subscriptions_are_checked() {
        let (_, _, sub) = browser();
        let mut http = sub.clone();
        http.endpoint = "http://push.example.com/s/1".into();
        assert!(http.device(true).unwrap_err().contains("https"));
        assert!(http.device(false).is_ok());
        let mut local = sub.clone();
        local.endpoint = "https://127.0.0.1/s".into();
        assert!(local.device(true).is_err());
        let mut bad = sub.clone();
        bad.keys.auth = B64.encode([1u8; 5]);
        assert!(bad.device(true).unwrap_err().contains("16 bytes"));
        let mut bad = sub;
        bad.keys.p256dh = B64.encode([4u8; 65]);
        assert!(bad.device(true).unwrap_err().contains("P-256"));
    }
}
