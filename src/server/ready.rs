//! `GET /readyz`: whether this node should be sent clients now.
//!
//! `/healthz` says the process lives (it answers 200 for as long as it
//! can answer at all); `/readyz` says it can do its work: its store takes
//! a write now (found out by making one, see
//! [`crate::store::Journal::probe_write`]) and, on a cluster node, its link
//! to NATS is up. Anything else is 503 with the reason, so an orchestrator
//! stops sending it clients (Kubernetes' `readinessProbe`) without
//! restarting it (`livenessProbe` stays on `/healthz`).
//!
//! A probe is a write, so requests share them: one answer serves every
//! request for [`FRESH`], and at most one probe runs at a time. A request
//! waits at most [`WAIT`] for it — under the one second Kubernetes gives a
//! probe by default — and a store that has not answered by then is not
//! ready (a locked SQLite database keeps a write waiting for its busy
//! timeout; the probe goes on, and its answer serves the next request).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_web::{web, HttpResponse};
use tokio::sync::watch;
use tokio::time::Instant;

use super::AppState;
use crate::store::Journal;

/// How long one probe's answer serves later requests.
const FRESH: Duration = Duration::from_secs(1);

/// The longest a request waits for a probe's answer.
const WAIT: Duration = Duration::from_millis(800);

/// A probe's answer and when it came.
#[derive(Clone)]
struct Answer {
    at: Instant,
    /// `Err`: why the store takes no write.
    store: Result<(), String>,
}

/// The probes of one server.
pub(super) struct Readiness {
    last: watch::Sender<Option<Answer>>,
    /// A probe is under way.
    probing: AtomicBool,
}

impl Default for Readiness {
    fn default() -> Self {
        Self {
            last: watch::Sender::new(None),
            probing: AtomicBool::new(false),
        }
    }
}

impl Readiness {
    /// Whether `journal` takes a write: a fresh answer, or a new probe's,
    /// waited for at most [`WAIT`].
    async fn store(self: &Arc<Self>, journal: &Arc<dyn Journal>) -> Result<(), String> {
        let mut answers = self.last.subscribe();
        if let Some(a) = answers.borrow_and_update().as_ref() {
            if a.at.elapsed() < FRESH {
                return a.store.clone();
            }
        }
        if !self.probing.swap(true, Ordering::AcqRel) {
            let probe = Probe {
                readiness: self.clone(),
                answer: None,
            };
            let journal = journal.clone();
            tokio::task::spawn_blocking(move || {
                let mut probe = probe;
                probe.answer = Some(journal.probe_write().map_err(|e| e.to_string()));
            });
        }
        match tokio::time::timeout(WAIT, answers.changed()).await {
            Ok(Ok(())) => answers.borrow().as_ref().map_or_else(
                || Err("no answer from the store".into()),
                |a| a.store.clone(),
            ),
            Ok(Err(_)) => Err("the server is stopping".into()),
            Err(_) => Err(format!(
                "the store has not confirmed a write within {} ms",
                WAIT.as_millis()
            )),
        }
    }
}

/// One probe under way: whatever becomes of it — answered, panicked, or
/// dropped unrun by a runtime shutting down — its answer is published
/// and the next request may probe again.
struct Probe {
    readiness: Arc<Readiness>,
    /// The store's answer, once it came.
    answer: Option<Result<(), String>>,
}

impl Drop for Probe {
    fn drop(&mut self) {
        let store = self
            .answer
            .take()
            .unwrap_or_else(|| Err("the write probe did not finish".into()));
        // Free before published: a request that sees this answer stale
        // later must be able to start the next probe (the other order
        // left it waiting for an answer already sent).
        self.readiness.probing.store(false, Ordering::Release);
        self.readiness.last.send_replace(Some(Answer {
            at: Instant::now(),
            store,
        }));
    }
}

/// `GET /readyz`: 200 `{"ready": true, …}` or 503 `{"ready": false,
/// "reasons": […]}`, each check by name in `checks`.
pub(super) async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    let journal = &state.shared.journal;
    let mut checks = serde_json::Map::new();
    let mut reasons = Vec::new();
    let store = state.readiness.store(journal).await;
    checks.insert("store".into(), check(&store));
    if let Err(why) = store {
        reasons.push(format!("store: {why}"));
    }
    if let Some(link) = state.shared.cluster.as_ref() {
        let cluster = link.ready();
        checks.insert("cluster".into(), check(&cluster));
        if let Err(why) = cluster {
            reasons.push(format!("cluster: {why}"));
        }
    }
    if state
        .shared
        .draining
        .load(std::sync::atomic::Ordering::Acquire)
    {
        checks.insert("drain".into(), "draining".into());
        reasons
            .push("drain: this node is stopping and hands its sessions to the other nodes".into());
    }
    let ready = reasons.is_empty();
    let body = serde_json::json!({
        "ready": ready,
        "checks": checks,
        "reasons": reasons,
    });
    if ready {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}

fn check(r: &Result<(), String>) -> serde_json::Value {
    match r {
        Ok(()) => "ok".into(),
        Err(why) => why.clone().into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channels::testing::TestJournal;

    #[tokio::test]
    async fn a_probe_that_fails_hard_is_an_answer_and_the_next_request_probes_again() {
        let readiness = Arc::new(Readiness::default());
        let test_journal = Arc::new(TestJournal::default());
        test_journal.probe_panics.store(true, Ordering::SeqCst);
        let journal: Arc<dyn Journal> = test_journal;
        let first = readiness.store(&journal).await;
        assert_eq!(first, Err("the write probe did not finish".into()));
        // Fresh, the answer serves the next request without a probe.
        assert_eq!(readiness.store(&journal).await, first);
        // Once it is stale, a new probe runs (and this one works). (Aged
        // by hand: the probe runs on a blocking thread, which paused time
        // would not wait for.)
        readiness.last.send_modify(|a| {
            if let Some(a) = a {
                a.at -= FRESH;
            }
        });
        assert_eq!(readiness.store(&journal).await, Ok(()));
    }
}
