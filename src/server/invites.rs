//! `tandem/createInvite`, `tandem/listInvites`, `tandem/revokeInvite`: an
//! owner's invite links ([`crate::invites`]).

use serde::Deserialize;
use serde_json::{json, Value};

use super::connection::Connection;
use crate::channels::session::InviteOp;
use crate::ids::ChannelUri;
use crate::invites::new_code;
use crate::people::Access;
use crate::protocol::{errors, RpcError};

/// What a link's answer says on a server without authentication.
const UNAUTHENTICATED_NOTE: &str = "this server runs without authentication: \
    whoever opens it without the link is an owner; the link's role holds for \
    those who come in through it";

/// `tandem/createInvite` params.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct CreateInviteParams {
    /// The session.
    pub channel: ChannelUri,
    /// The role the link gives.
    pub access: Access,
    /// How long it lets people in, in seconds.
    pub ttl_secs: u64,
    /// How many people may come in through it (absent: any number).
    #[serde(default)]
    pub uses: Option<u32>,
}

/// `tandem/revokeInvite` params.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RevokeInviteParams {
    /// The session.
    pub channel: ChannelUri,
    /// The link's id.
    pub id: String,
}

impl Connection {
    /// `tandem/createInvite`: the new link's listing with its `code` — the
    /// only time the code is shown.
    pub(super) fn create_invite(
        &mut self,
        id: Option<Value>,
        p: CreateInviteParams,
        ctx: &mut actix::Context<Self>,
    ) -> Result<(), RpcError> {
        self.permit(&p.channel)?;
        let by = self.invite_maker("tandem/createInvite")?;
        let (invite_id, code) = new_code();
        let digest = crate::invites::parse_code(&code)
            .map(|(_, d)| d)
            .ok_or_else(|| RpcError::internal("a new code does not parse"))?;
        let op = InviteOp::Create {
            id: invite_id,
            digest,
            access: p.access,
            ttl_secs: p.ttl_secs,
            uses: p.uses,
        };
        let done = self.ask(
            &p.channel,
            |c| c.invites(op, Some(by)),
            super::routes::no_session,
        )?;
        let unauthenticated = self.app.auth.is_none();
        self.reply_when(id, done, ctx, move |mut v| {
            v["code"] = code.clone().into();
            if unauthenticated {
                v["note"] = UNAUTHENTICATED_NOTE.into();
            }
            v
        });
        Ok(())
    }

    /// `tandem/revokeInvite`: `{id, state}` once the revocation is stored;
    /// the sockets that came in through the link close within seconds.
    pub(super) fn revoke_invite(
        &mut self,
        id: Option<Value>,
        p: RevokeInviteParams,
        ctx: &mut actix::Context<Self>,
    ) -> Result<(), RpcError> {
        self.permit(&p.channel)?;
        let by = self.invite_maker("tandem/revokeInvite")?;
        let op = InviteOp::Revoke { id: p.id };
        let done = self.ask(
            &p.channel,
            |c| c.invites(op, Some(by)),
            super::routes::no_session,
        )?;
        self.reply_when(id, done, ctx, |v| v);
        Ok(())
    }

    /// `tandem/listInvites`: `{invites}`, the session's links (open and
    /// recently ended, oldest first), for an owner.
    pub(super) fn list_invites(
        &mut self,
        id: Option<Value>,
        channel: ChannelUri,
    ) -> Result<(), RpcError> {
        self.permit(&channel)?;
        let shared = &self.app.shared;
        if !shared
            .registry
            .get(&channel)
            .is_some_and(|c| c.addr.is_session())
        {
            return Err(super::routes::no_session(&channel));
        }
        let by = self.invite_maker("tandem/listInvites")?;
        shared
            .access
            .permit(
                &channel,
                Some(&by),
                shared.config.session_access,
                Access::Owner,
                "listing invite links",
            )
            .map_err(|r| RpcError::new(errors::PERMISSION_DENIED, r.0))?;
        let now = crate::auth::now_secs();
        let invites: Vec<Value> = shared
            .access
            .invites_of(&channel)
            .iter()
            .map(|(id, i)| i.listing(id, now))
            .collect();
        let mut answer = json!({ "invites": invites });
        if self.app.auth.is_none() {
            answer["note"] = UNAUTHENTICATED_NOTE.into();
        }
        self.reply(&id, &answer);
        Ok(())
    }

    /// The person asking for `method` (who must have initialized).
    fn invite_maker(&self, method: &str) -> Result<crate::people::Person, RpcError> {
        self.person().ok_or_else(|| {
            RpcError::invalid_request(format!("`{method}` needs `initialize` first"))
        })
    }
}
