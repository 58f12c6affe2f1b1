//! The person behind a connection: the name the record gives what it
//! sends (see [`crate::people`]), and `tandem/setName`.
//!
//! With authentication the name is the token's: its `name` claim, or its
//! subject — a client cannot speak under another name. Without it (one
//! machine, loopback only) every caller is trusted anyway, so the client
//! names its person: `_meta["tandem/name"]` in `initialize` or
//! `reconnect`, or `tandem/setName`.

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::connection::Connection;
use crate::ids::ChannelUri;
use crate::people::{clean_name, Access, Person, Standing};
use crate::protocol::{errors, RpcError};

/// `_meta` key of the name a client gives in `initialize` / `reconnect`.
pub(super) const NAME_META: &str = "tandem/name";

/// `tandem/setName` params.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SetNameParams {
    /// The display name.
    pub name: String,
}

impl Connection {
    /// The person this connection speaks for, once it has a `clientId`.
    pub(super) fn person(&self) -> Option<Person> {
        let client_id = self.client_id.as_ref()?.to_string();
        let name = self
            .principal
            .name
            .clone()
            .or_else(|| self.chosen_name.clone())
            .unwrap_or_else(|| match &self.app.auth {
                Some(_) if self.principal.invite.is_none() => self.principal.subject.clone(),
                _ => format!("guest {}", short(&client_id)),
            });
        Some(Person {
            name,
            subject: self.principal.subject.clone(),
            client_id,
            standing: Standing {
                admin: self.principal.role == crate::auth::Role::Admin,
                grants: (*self.principal.access).clone(),
            },
        })
    }

    /// Take the name a client gives in `initialize` / `reconnect`'s `_meta`,
    /// when it may name itself (no authentication); ignored otherwise.
    pub(super) fn name_from(&mut self, meta: Option<&Map<String, Value>>) {
        if self.names_itself() {
            if let Some(name) = meta
                .and_then(|m| m.get(NAME_META))
                .and_then(Value::as_str)
                .and_then(clean_name)
            {
                self.chosen_name = Some(name);
            }
        }
        self.note_person();
    }

    /// Show the admin view who this connection speaks for now.
    fn note_person(&self) {
        if let Some(person) = self.person() {
            self.app.connections.note_person(self.out.id(), &person);
        }
    }

    /// Whether the person names themselves: without authentication, or as
    /// a guest of an invite link (with a token, the token names them).
    fn names_itself(&self) -> bool {
        self.app.auth.is_none() || self.principal.invite.is_some()
    }

    /// `tandem/setName`: name this connection's person (without
    /// authentication); `{name}` as it will be shown.
    pub(super) fn set_name(&mut self, id: Option<Value>, p: SetNameParams) -> Result<(), RpcError> {
        if !self.names_itself() {
            return Err(RpcError::new(
                errors::PERMISSION_DENIED,
                "on this server a person's name comes from their token (its `name` claim)",
            ));
        }
        let name = clean_name(&p.name)
            .ok_or_else(|| RpcError::invalid_params("`name` must hold a visible character"))?;
        self.chosen_name = Some(name.clone());
        self.note_person();
        self.refresh_presence();
        self.reply(&id, &json!({"name": name}));
        Ok(())
    }
}

/// `tandem/access` params.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AccessParams {
    /// The session.
    pub channel: ChannelUri,
}

/// `tandem/setAccess` params.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SetAccessParams {
    /// The session.
    pub channel: ChannelUri,
    /// Whose level (a token subject).
    pub subject: String,
    /// The level; `null` removes what the session set for them.
    pub access: Option<Access>,
}

impl Connection {
    /// `tandem/access`: this connection's person in a session and what they
    /// may do there (`{name, subject, clientId, access, members}`).
    pub(super) fn my_access(&mut self, id: Option<Value>, p: AccessParams) -> Result<(), RpcError> {
        self.permit(&p.channel)?;
        let shared = &self.app.shared;
        if !shared
            .registry
            .get(&p.channel)
            .is_some_and(|c| c.addr.is_session())
        {
            return Err(super::routes::no_session(&p.channel));
        }
        let by = self
            .person()
            .ok_or_else(|| RpcError::invalid_request("`tandem/access` needs `initialize` first"))?;
        let table = shared.access.get(&p.channel);
        let access = table.level_of(p.channel.as_str(), &by, shared.config.session_access);
        let mut answer = by.to_json();
        answer["access"] = json!(access);
        answer["members"] = json!(table.members);
        self.reply(&id, &answer);
        Ok(())
    }

    /// `tandem/setAccess`: answered, once stored, with the session's members.
    pub(super) fn set_access(
        &mut self,
        id: Option<Value>,
        p: SetAccessParams,
        ctx: &mut actix::Context<Self>,
    ) -> Result<(), RpcError> {
        self.permit(&p.channel)?;
        let by = self.person();
        let done = self.ask(
            &p.channel,
            |c| c.set_access(p.subject, p.access, by),
            super::routes::no_session,
        )?;
        self.reply_when(id, done, ctx, |v| v);
        Ok(())
    }
}

/// The first characters of a client id, for a guest's name.
fn short(client_id: &str) -> String {
    client_id
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(4)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guest_is_named_after_its_client() {
        assert_eq!(short("6d1c2f9a-0000"), "6d1c");
        assert_eq!(short("--ab"), "ab");
    }
}
