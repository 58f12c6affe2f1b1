//! Invite links of a session ([`crate::invites`]): an owner creates and
//! revokes them; a guest's first arrival through one is a use. The links
//! are in the session's `_meta`, so each change is journaled, the same on
//! every node, and read by the upgrades of every node through
//! [`crate::channels::access::AccessBook`].

use actix::prelude::*;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::SessionActor;
use crate::auth::now_secs;
use crate::channels::audit::{self, AuditKind};
use crate::channels::forward::ForwardRequest;
use crate::invites::{rfc3339, Closed, Invite, InviteTable, Maker, INVITES_META, MAX_TTL_SECS};
use crate::people::{Access, Person};
use crate::protocol::{errors, RpcError};

/// Most links a session keeps at once (open or recently ended).
const MAX_LINKS: usize = 100;

/// What to do with a session's links.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum InviteOp {
    /// A new link (its code was made by the node that asked: only the
    /// digest of its secret travels and is kept).
    Create {
        /// The link's id.
        id: String,
        /// `sha256:` of its secret.
        digest: String,
        /// The role it gives.
        access: Access,
        /// How long it lets people in, in seconds.
        ttl_secs: u64,
        /// How many people may come in (`None`: any number).
        uses: Option<u32>,
    },
    /// End a link now.
    Revoke {
        /// The link's id.
        id: String,
    },
    /// A guest arrived through a link.
    Use {
        /// The link's id.
        id: String,
        /// `sha256:` of the code's secret they came with.
        digest: String,
        /// Their guest tag.
        guest: String,
    },
}

/// Change the session's links; answered with the link's listing.
#[derive(Message)]
#[rtype(result = "Result<Value, RpcError>")]
pub struct Invites {
    /// What to do.
    pub op: InviteOp,
    /// Who asks: an owner (create, revoke), the guest (use).
    pub by: Option<Person>,
}

impl Handler<Invites> for SessionActor {
    type Result = ResponseFuture<Result<Value, RpcError>>;

    fn handle(&mut self, msg: Invites, ctx: &mut Self::Context) -> Self::Result {
        let fail = |e: RpcError| -> Self::Result { Box::pin(std::future::ready(Err(e))) };
        if self.core.follower {
            let request = ForwardRequest::Invites {
                session: self.core.uri.to_string(),
                change: msg.op,
                by: msg.by,
            };
            return self.forward_to_owner(request);
        }
        let Some(by) = msg.by else {
            return fail(RpcError::invalid_request("an invite needs a person"));
        };
        let now = now_secs();
        let mut table = InviteTable::of_meta(self.state.meta.as_ref());
        table.prune(now);
        let (id, kind, fields) = match self.change(&mut table, msg.op, &by, now) {
            Ok(Some(change)) => change,
            Ok(None) => {
                // A guest coming back: nothing to record.
                return Box::pin(std::future::ready(Ok(json!({}))));
            }
            Err(e) => return fail(e),
        };
        let listing = table.0.get(&id).map(|i| i.listing(&id, now));
        let mut fields = fields;
        fields["inviteId"] = id.into();
        let e = audit::entry(kind, &by, &self.core.uri, None, fields);
        self.core.audit.push(e);
        let reply = listing.unwrap_or_default();
        self.store_meta(ctx, INVITES_META, table.to_json(), reply)
    }
}

impl SessionActor {
    /// Apply `op` to `table`: the link changed, the audit entry's kind and
    /// fields; `None` when nothing changes (a guest who came in before).
    fn change(
        &self,
        table: &mut InviteTable,
        op: InviteOp,
        by: &Person,
        now: u64,
    ) -> Result<Option<(String, AuditKind, Value)>, RpcError> {
        match op {
            InviteOp::Create {
                id,
                digest,
                access,
                ttl_secs,
                uses,
            } => {
                self.permit(Some(by), Access::Owner, "creating an invite link")?;
                if !(1..=MAX_TTL_SECS).contains(&ttl_secs) {
                    return Err(RpcError::invalid_params(format!(
                        "`ttlSecs` must be 1 to {MAX_TTL_SECS} (30 days)"
                    )));
                }
                if uses == Some(0) {
                    return Err(RpcError::invalid_params("`uses` must be at least 1"));
                }
                if table.0.len() >= MAX_LINKS {
                    return Err(RpcError::invalid_request(format!(
                        "the session has {MAX_LINKS} invite links: revoke some first"
                    )));
                }
                let invite = Invite {
                    digest,
                    access,
                    created_at: crate::time::now_rfc3339(),
                    created_by: Maker {
                        name: by.name.clone(),
                        subject: by.subject.clone(),
                    },
                    expires_at_secs: now.saturating_add(ttl_secs),
                    uses,
                    guests: Vec::new(),
                    revoked_at_secs: None,
                };
                let fields = json!({
                    "access": access,
                    "expiresAt": rfc3339(invite.expires_at_secs),
                    "uses": uses,
                });
                table.0.insert(id.clone(), invite);
                Ok(Some((id, AuditKind::InviteCreated, fields)))
            }
            InviteOp::Revoke { id } => {
                self.permit(Some(by), Access::Owner, "revoking an invite link")?;
                let invite = table.0.get_mut(&id).ok_or_else(|| {
                    RpcError::invalid_params(format!("no invite link `{id}` in this session"))
                })?;
                if invite.revoked_at_secs.is_some() {
                    return Err(RpcError::invalid_request(format!(
                        "invite link `{id}` was revoked already"
                    )));
                }
                invite.revoked_at_secs = Some(now);
                let fields = json!({"access": invite.access, "used": invite.guests.len()});
                Ok(Some((id, AuditKind::InviteRevoked, fields)))
            }
            InviteOp::Use { id, digest, guest } => {
                let refused = |c: Closed| RpcError::new(errors::PERMISSION_DENIED, c.reason());
                let invite = table.0.get_mut(&id).ok_or(refused(Closed::Unknown))?;
                invite.admits(&digest, &guest, now).map_err(refused)?;
                if invite.guests.contains(&guest) {
                    return Ok(None);
                }
                invite.guests.push(guest);
                let fields = json!({"access": invite.access, "used": invite.guests.len()});
                Ok(Some((id, AuditKind::InviteUsed, fields)))
            }
        }
    }
}
