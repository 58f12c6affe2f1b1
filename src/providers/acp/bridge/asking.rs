//! The bridge's questions to people: the agent's permission requests and
//! elicitations become interactions of the running turn, and exactly one
//! answer goes back to the agent for each.

use std::time::Instant;

use agent_client_protocol::v1::schema::{RequestPermissionRequest, RequestPermissionResponse};
use agent_client_protocol::v1::Responder;

use super::{emit_all, Bridge};
use crate::interactions::Settlement;
use crate::providers::acp::{elicit, permission};

/// A question of the agent's was settled (or a permission request decided).
pub(super) enum Answered {
    Permission(Box<Decided>),
    Elicitation { acp_session: String },
}

/// A permission request answered by a person (or the session's policy).
pub(super) struct Decided {
    acp_session: String,
    tool_call_id: String,
    settlement: Settlement,
    request: Box<RequestPermissionRequest>,
    responder: Responder<RequestPermissionResponse>,
}

impl Bridge {
    pub(super) async fn permission(
        &mut self,
        request: Box<RequestPermissionRequest>,
        responder: Responder<RequestPermissionResponse>,
    ) {
        let acp = request.session_id.to_string();
        let Some(turn) = self.turns.get_mut(&acp) else {
            let _ = responder.respond(permission::cancelled());
            return;
        };
        let shown = turn.map.asking(&request.tool_call);
        emit_all(&turn.handle, shown).await;
        turn.asking += 1;
        let interaction = permission::interaction(&request);
        let handle = turn.handle.clone();
        let decided = self.decided_tx.clone();
        let tool_call_id = request.tool_call.tool_call_id.to_string();
        tokio::spawn(async move {
            let settlement = handle.interact(interaction).await;
            let _ = decided.send(Answered::Permission(Box::new(Decided {
                acp_session: acp,
                tool_call_id,
                settlement,
                request,
                responder,
            })));
        });
    }

    /// A form or URL question: asked like any other, the settled answer
    /// goes back.
    pub(super) fn elicitation(
        &mut self,
        request: Box<agent_client_protocol::v1::schema::CreateElicitationRequest>,
        responder: Responder<agent_client_protocol::v1::schema::CreateElicitationResponse>,
    ) {
        // Scoped to a session, or to the one prompt that is running.
        let acp = elicit::session_of(&request).or_else(|| {
            (self.turns.len() == 1)
                .then(|| self.turns.keys().next().cloned())
                .flatten()
        });
        let (Some(acp), Ok(interaction)) = (acp, elicit::interaction(&request)) else {
            let _ = responder.respond(elicit::cancelled());
            return;
        };
        let Some(turn) = self.turns.get_mut(&acp) else {
            let _ = responder.respond(elicit::cancelled());
            return;
        };
        turn.asking += 1;
        let handle = turn.handle.clone();
        let done = self.decided_tx.clone();
        tokio::spawn(async move {
            let settlement = handle.interact(interaction).await;
            if let Err(e) = responder.respond(elicit::answer(&settlement)) {
                tracing::debug!(error = %e, "elicitation answer not delivered");
            }
            let _ = done.send(Answered::Elicitation { acp_session: acp });
        });
    }

    pub(super) fn asked_done(&mut self, acp: &str) {
        if let Some(turn) = self.turns.get_mut(acp) {
            turn.asking = turn.asking.saturating_sub(1);
        }
        self.last_heard = Instant::now();
    }

    pub(super) async fn decided(&mut self, d: Decided) {
        let answer = permission::answer(&d.request, &d.settlement);
        if let Some(turn) = self.turns.get_mut(&d.acp_session) {
            turn.asking = turn.asking.saturating_sub(1);
            turn.map
                .decided(&d.tool_call_id, permission::approved(&d.settlement));
        }
        self.last_heard = Instant::now();
        if let Err(e) = d.responder.respond(answer) {
            tracing::debug!(session = %self.session, error = %e, "permission answer not delivered");
        }
    }
}
