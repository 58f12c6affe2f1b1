//! The bridge's ACP sessions: the agent process it starts on demand, the
//! ACP session of each chat (opened, or loaded again after a restart), and
//! the mode and model each one runs with.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::{Bridge, ACP_SESSION_NOTE};
use crate::channels::agent::ChatHandle;
use crate::providers::acp::choices::{self, Choices, SetCall};
use crate::providers::acp::conn::{Event, Process};

impl Bridge {
    /// The directory the agent's sessions work in.
    fn cwd(&self) -> PathBuf {
        match &self.spec.cwd {
            Some(cwd) => cwd.clone(),
            None => std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")),
        }
    }

    /// The chat's ACP session: the one it has in the running process; or,
    /// after a restart (of Tandem or of the agent), the one it had, loaded
    /// again where the agent supports `session/load`; or the one opened at
    /// `createSession`; or a new one. A new mapping is noted in the
    /// session's `_meta`, so it survives a restart.
    pub(super) async fn session_for(
        &mut self,
        chat: &str,
        handle: &ChatHandle,
    ) -> Result<String, String> {
        if self.process.is_some() {
            if let Some(acp) = self.chats.get(chat) {
                return Ok(acp.clone());
            }
        }
        let process = self.process().await?;
        let known = handle
            .recall(ACP_SESSION_NOTE)
            .await
            .and_then(|v| v.get("id")?.as_str().map(str::to_owned));
        if let Some(id) = known.filter(|_| process.load_session) {
            match self.load(&process, &id).await {
                Ok(()) => {
                    tracing::info!(session = %self.session, chat, acp_session = %id, "chat reattached to its ACP session");
                    return Ok(id);
                }
                Err(e) => {
                    tracing::warn!(session = %self.session, chat, acp_session = %id, error = %e, "cannot reattach the chat's ACP session; opening a new one");
                }
            }
        }
        let acp = match self.spare.take().filter(|_| self.process.is_some()) {
            Some(spare) => spare,
            None => self.open().await?,
        };
        handle.note(ACP_SESSION_NOTE.to_owned(), json!({ "id": acp }));
        Ok(acp)
    }

    /// Load the ACP session `acp` again and wait for the answer. The
    /// agent's replay of its history comes first; it is already in the
    /// chat, so it is skipped. Everything else is handled as usual.
    async fn load(&mut self, process: &Arc<Process>, acp: &str) -> Result<(), String> {
        process.load(acp, self.cwd())?;
        let timeout = self.spec.start_timeout();
        let deadline = tokio::time::Instant::now() + timeout;
        let mut replayed = 0usize;
        loop {
            let Some(events) = self.events.as_mut() else {
                return Err("the agent process is gone".into());
            };
            let ev = match tokio::time::timeout_at(deadline, events.recv()).await {
                Err(_) => {
                    return Err(format!(
                        "no answer to `session/load` within {} s",
                        timeout.as_secs()
                    ))
                }
                Ok(None) => {
                    self.events = None;
                    return Err("the agent process is gone".into());
                }
                Ok(Some(ev)) => ev,
            };
            self.last_heard = Instant::now();
            match ev {
                Event::Loaded { session, result } if session == acp => {
                    tracing::debug!(acp_session = %acp, replayed, "session/load answered");
                    let choices = result.map_err(|e| format!("`session/load` failed: {e}"))?;
                    self.offers(acp, choices);
                    return Ok(());
                }
                Event::Update(n) if n.session_id.to_string() == acp => replayed += 1,
                ev => self.event(ev).await,
            }
        }
    }

    /// A running process (started if needed) and a new ACP session in it.
    pub(super) async fn open(&mut self) -> Result<String, String> {
        let process = self.process().await?;
        let cwd = self.cwd();
        let timeout = self.spec.start_timeout();
        match tokio::time::timeout(timeout, process.new_session(cwd)).await {
            Ok(Ok((id, choices))) => {
                self.offers(&id, choices);
                Ok(id)
            }
            Ok(Err(e)) if e.contains("-32601") || e.to_lowercase().contains("method not found") => {
                Err(format!(
                    "the agent does not support `session/new` ({e}), so it cannot hold a session"
                ))
            }
            Ok(Err(e)) => Err(format!("`session/new` failed: {e}")),
            Err(_) => Err(format!(
                "no answer to `session/new` within {} s",
                timeout.as_secs()
            )),
        }
    }

    async fn process(&mut self) -> Result<Arc<Process>, String> {
        if let Some(p) = &self.process {
            return Ok(p.clone());
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let p = Process::start(&self.spec, tx, self.alive.clone()).await?;
        tracing::info!(agent = %self.spec.name, session = %self.session, pid = ?p.pid, "agent process started");
        self.process = Some(p.clone());
        self.events = Some(rx);
        self.stopped_because = None;
        Ok(p)
    }

    /// What ACP session `acp` offers now.
    fn offers(&mut self, acp: &str, choices: Choices) {
        self.choices.insert(self.session.clone(), choices.clone());
        self.offered.insert(acp.to_owned(), choices);
    }

    /// Bring the agent's mode and model to what the session's config says
    /// (people set them with `session/configChanged`). What the agent does
    /// not offer or refuses is noted in the session's `_meta`
    /// (`agentModeError` / `agentModelError`) and the turn goes on.
    pub(super) async fn apply_config(&mut self, acp: &str, process: &Process, handle: &ChatHandle) {
        let Some(values) = handle.session_config().await else {
            return;
        };
        for prop in [choices::MODE, choices::MODEL] {
            let Some(want) = values.get(prop).and_then(|v| v.as_str()) else {
                continue;
            };
            let Some(offered) = self.offered.get(acp) else {
                return;
            };
            if offered.current(prop).as_deref() == Some(want) {
                continue;
            }
            let outcome = match offered.set_call(prop, want) {
                Err(e) => Err(e),
                Ok(call) => {
                    let timeout = self.spec.start_timeout();
                    match tokio::time::timeout(timeout, process.set(acp, call.clone())).await {
                        Ok(Ok(options)) => Ok((call, options)),
                        Ok(Err(e)) => Err(format!("the agent refused `{want}`: {e}")),
                        Err(_) => Err(format!("no answer within {} s", timeout.as_secs())),
                    }
                }
            };
            let key = format!("{prop}Error");
            match outcome {
                Ok((call, options)) => {
                    if let Some(offered) = self.offered.get_mut(acp) {
                        match (call, options) {
                            (_, Some(options)) => offered.set_options(options),
                            (SetCall::Mode(mode), None) => offered.set_mode(&mode),
                            (SetCall::Option(..), None) => {}
                        }
                        self.choices.insert(self.session.clone(), offered.clone());
                    }
                    if self.refused.remove(&(acp.to_owned(), prop)) {
                        handle.note(key, Value::Null);
                    }
                    tracing::debug!(acp_session = %acp, prop, want, "agent setting applied");
                }
                Err(e) => {
                    tracing::warn!(session = %self.session, prop, want, error = %e, "agent setting not applied");
                    self.refused.insert((acp.to_owned(), prop));
                    handle.note(key, Value::from(e));
                }
            }
        }
    }
}
