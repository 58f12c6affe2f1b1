//! `tandem/setAccess`: an owner sets what someone may do in the session.
//! The table is in the session's `_meta` ([`crate::people::ACCESS_META`]),
//! so it is journaled, the same on every node, and read by the session's
//! chats through [`crate::channels::access::AccessBook`].

use actix::prelude::*;
use ahp_types::actions::{SessionMetaChangedAction, StateAction};
use serde_json::{json, Value};

use super::SessionActor;
use crate::channels::audit::{self, AuditKind};
use crate::channels::commit::ChannelActor;
use crate::channels::forward::ForwardRequest;
use crate::people::{Access, AccessTable, Person, ACCESS_META};
use crate::protocol::{errors, RpcError};

/// Longest subject an owner may set a level for, in bytes.
const MAX_SUBJECT_BYTES: usize = 256;

/// Set `subject`'s level in the session (`None`: back to what their token
/// or the server's default gives). Answered with the session's members.
#[derive(Message)]
#[rtype(result = "Result<Value, RpcError>")]
pub struct SetAccess {
    /// Whose level.
    pub subject: String,
    /// The level, or `None` to remove the entry.
    pub access: Option<Access>,
    /// Who asks (must be an owner).
    pub by: Option<Person>,
}

impl Handler<SetAccess> for SessionActor {
    type Result = ResponseFuture<Result<Value, RpcError>>;

    fn handle(&mut self, msg: SetAccess, ctx: &mut Self::Context) -> Self::Result {
        let fail = |e: RpcError| -> Self::Result { Box::pin(std::future::ready(Err(e))) };
        if self.core.follower {
            let request = ForwardRequest::SetAccess {
                session: self.core.uri.to_string(),
                subject: msg.subject,
                access: msg.access,
                by: msg.by,
            };
            return self.forward_to_owner(request);
        }
        if let Err(e) = self.permit(msg.by.as_ref(), Access::Owner, "setting access") {
            return fail(e);
        }
        let subject = msg.subject.trim().to_owned();
        if subject.is_empty() || subject.len() > MAX_SUBJECT_BYTES {
            return fail(RpcError::invalid_params(format!(
                "`subject` must be 1 to {MAX_SUBJECT_BYTES} bytes"
            )));
        }
        let mut table = AccessTable::of_meta(self.state.meta.as_ref());
        let before = table.members.get(&subject).copied();
        match msg.access {
            Some(a) => table.members.insert(subject.clone(), a),
            None => table.members.remove(&subject),
        };
        let still_owned = table.members.values().any(|a| *a == Access::Owner);
        if before == Some(Access::Owner) && !still_owned {
            return fail(RpcError::new(
                errors::PERMISSION_DENIED,
                "the session would have no owner: make someone else owner first",
            ));
        }
        let members = json!(table.members);
        if before == msg.access {
            return Box::pin(std::future::ready(Ok(json!({ "members": members }))));
        }
        if let Some(by) = &msg.by {
            let fields = json!({"subject": subject, "access": msg.access, "before": before});
            let e = audit::entry(AuditKind::RoleChanged, by, &self.core.uri, None, fields);
            self.core.audit.push(e);
        }
        self.store_meta(
            ctx,
            ACCESS_META,
            table.to_json(),
            json!({ "members": members }),
        )
    }
}

impl SessionActor {
    /// Set the session's `_meta[key]` to `value` (with the audit entries
    /// the caller queued) and answer `reply` once it is stored.
    pub(super) fn store_meta(
        &mut self,
        ctx: &mut Context<Self>,
        key: &str,
        value: Value,
        reply: Value,
    ) -> ResponseFuture<Result<Value, RpcError>> {
        let mut meta = self.state.meta.clone().unwrap_or_default();
        meta.insert(key.into(), value);
        let action = StateAction::SessionMetaChanged(SessionMetaChangedAction { meta: Some(meta) });
        let stored = self.host_actions_stored(ctx, vec![action]);
        Box::pin(async move {
            stored
                .await
                .map_err(|r| RpcError::internal(format!("not stored: {r}")))?;
            Ok(reply)
        })
    }
}
