//! The calls of a provider connection — an agent served over AHP:
//! `tandem/registerProvider` and `tandem/requestInteraction`.

use actix::prelude::*;
use serde_json::Value;

use super::connection::Connection;
use super::params::{RegisterProviderParams, RequestInteractionParams};
use super::routes::no_chat;
use crate::interactions::Interaction;
use crate::protocol::{errors, RpcError};
use crate::providers::{Claim, RegisterError};

/// A refused registration as a JSON-RPC error: someone else's id is a
/// permission matter, a taken or built-in one a conflict.
fn register_error(e: RegisterError) -> RpcError {
    let code = match &e {
        RegisterError::NotOwner(_) => errors::PERMISSION_DENIED,
        RegisterError::BuiltIn(_) | RegisterError::Taken(_) => errors::ALREADY_EXISTS,
        RegisterError::TooMany(..) => errors::INVALID_REQUEST,
        RegisterError::Store(..) => return RpcError::internal(e.to_string()),
    };
    RpcError::new(code, e.to_string())
}

/// `-32602` unless `interaction` is one a person can be asked: a safe URL,
/// a supported form, at most `max_questions` questions.
fn check_interaction(interaction: &Interaction, max_questions: usize) -> Result<(), RpcError> {
    if let Some(url) = interaction.url() {
        crate::interactions::link::check(url)
            .map_err(|e| RpcError::invalid_params(e.to_string()))?;
    }
    let asked = match interaction {
        Interaction::Form { schema, .. } => crate::interactions::form::questions(schema)
            .map_err(|e| {
                RpcError::invalid_params(format!("the form schema is not supported: {e}"))
            })?
            .len(),
        Interaction::Input { request, .. } => request.questions.as_ref().map_or(0, Vec::len),
        Interaction::Url { .. } | Interaction::ToolApproval { .. } => 0,
    };
    if asked > max_questions {
        return Err(RpcError::invalid_params(format!(
            "{asked} questions in one request; the limit is {max_questions} (`max_questions_per_request`)"
        )));
    }
    Ok(())
}

impl Connection {
    /// `tandem/registerProvider`. A provider id is bound to the token subject
    /// that first registers it; a new binding is stored before the provider
    /// is registered, so a restart keeps it.
    pub(super) fn register_provider(
        &mut self,
        id: Option<Value>,
        p: RegisterProviderParams,
        ctx: &mut Context<Self>,
    ) -> Result<(), RpcError> {
        if !self.principal.may_register_providers() {
            return Err(RpcError::new(
                errors::PERMISSION_DENIED,
                "only an `agent` token may register providers",
            ));
        }
        if p.channel != ahp_types::ROOT_RESOURCE_URI {
            return Err(RpcError::invalid_params(
                "`tandem/registerProvider` targets `ahp-root://`",
            ));
        }
        if p.provider.is_empty() || p.provider.len() > 128 {
            return Err(RpcError::invalid_params(
                "`provider` must be 1 to 128 characters",
            ));
        }
        let shared = self.app.shared.clone();
        p.check_texts(&shared.config.limits)?;
        let info = ahp_types::state::AgentInfo {
            provider: p.provider.clone(),
            display_name: p.display_name,
            description: p.description.unwrap_or_default(),
            models: Vec::new(),
            protected_resources: None,
            customizations: None,
            capabilities: Some(ahp_types::state::AgentCapabilities {
                multiple_chats: Some(Default::default()),
                multiple_working_directories: None,
            }),
        };
        let claim = self
            .app
            .agents
            .claim(
                &p.provider,
                &self.principal,
                shared.config.limits.max_providers_per_subject,
            )
            .map_err(register_error)?;
        match claim {
            Claim::Owned => {
                self.attach_provider(info)?;
                self.reply(&id, &Value::Null);
            }
            Claim::New => {
                let bind = shared
                    .journal
                    .bind_provider(&p.provider, &self.principal.subject);
                ctx.wait(bind.into_actor(self).map(move |stored, act, _| {
                    let done = act
                        .app
                        .agents
                        .bound(&p.provider, stored, &act.principal)
                        .map_err(register_error)
                        .and_then(|()| act.attach_provider(info));
                    match done {
                        Ok(()) => act.reply(&id, &Value::Null),
                        Err(e) => act.reply_error(&id.unwrap_or_default(), e),
                    }
                }));
            }
        }
        Ok(())
    }

    /// Serve the claimed provider `info` on this connection.
    fn attach_provider(&mut self, info: ahp_types::state::AgentInfo) -> Result<(), RpcError> {
        let provider = info.provider.clone();
        let shared = &self.app.shared;
        self.app
            .agents
            .register_remote(
                info,
                self.out.clone(),
                self.principal.clone(),
                shared.config.provider_grace,
            )
            .map_err(register_error)?;
        tracing::info!(%provider, conn = %self.out.id(), subject = %self.principal.subject, "provider registered");
        self.providers.insert(provider);
        self.app.root.agents_changed();
        Ok(())
    }

    /// `-32600` when this connection already waits on as many interactions
    /// as it may.
    pub(super) fn check_interaction_room(&self) -> Result<(), RpcError> {
        let max = self
            .app
            .shared
            .config
            .limits
            .max_open_interactions_per_connection;
        if self.open_interactions >= max {
            return Err(RpcError::invalid_request(format!(
                "at most {max} interactions may wait on one connection"
            )));
        }
        Ok(())
    }

    /// `tandem/requestInteraction`: answered when the interaction settles,
    /// without holding up the connection's other requests.
    pub(super) fn request_interaction(
        &mut self,
        id: Option<Value>,
        p: RequestInteractionParams,
        ctx: &mut Context<Self>,
    ) -> Result<(), RpcError> {
        self.permit(&p.channel)?;
        let ch = self
            .app
            .shared
            .registry
            .get(&p.channel)
            .ok_or_else(|| no_chat(&p.channel))?;
        if !ch.addr.is_chat() {
            return Err(RpcError::invalid_params(format!(
                "`{}` is not a chat",
                p.channel
            )));
        }
        if !ch
            .provider
            .as_deref()
            .is_some_and(|pr| self.providers.contains(pr))
        {
            return Err(RpcError::new(
                errors::PERMISSION_DENIED,
                "only the session's provider connection may request interactions",
            ));
        }
        let interaction: Interaction = serde_json::from_value(p.interaction)
            .map_err(|e| RpcError::invalid_params(format!("invalid `interaction`: {e}")))?;
        check_interaction(
            &interaction,
            self.app.shared.config.limits.max_questions_per_request,
        )?;
        let settled = ch.addr.interact(ch.uri.clone(), p.turn_id, interaction);
        self.open_interactions += 1;
        ctx.spawn(settled.into_actor(self).map(move |settlement, act, _| {
            act.open_interactions -= 1;
            act.reply(&id, &serde_json::to_value(settlement).unwrap_or_default());
        }));
        Ok(())
    }
}
