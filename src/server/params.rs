//! The params of Tandem's own methods (`tandem/*`, see `docs/protocol.md`,
//! "Extensions"), and
//! the checks on them that need no connection state.

use serde_json::Value;

use crate::ids::ChannelUri;
use crate::protocol::RpcError;

/// `tandem/registerProvider` params.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegisterProviderParams {
    /// Always `ahp-root://`: providers are listed in root state.
    pub channel: ChannelUri,
    /// The provider id sessions name.
    pub provider: String,
    /// Shown to clients in root state.
    pub display_name: String,
    /// Shown to clients in root state.
    #[serde(default)]
    pub description: Option<String>,
}

impl RegisterProviderParams {
    /// `-32602` unless the display name and description are within their
    /// limits: root state carries them to every client.
    pub fn check_texts(&self, limits: &crate::config::Limits) -> Result<(), RpcError> {
        let over = |field: &str, n: usize, max: usize| {
            Err(RpcError::invalid_params(format!(
                "`{field}` of {n} characters is over the limit of {max}"
            )))
        };
        let name = self.display_name.chars().count();
        if name > limits.max_title_chars {
            return over("displayName", name, limits.max_title_chars);
        }
        let description = self.description.as_deref().map_or(0, |d| d.chars().count());
        if description > limits.max_description_chars {
            return over("description", description, limits.max_description_chars);
        }
        Ok(())
    }
}

/// `tandem/requestInteraction` params.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RequestInteractionParams {
    /// The chat to ask in.
    pub channel: ChannelUri,
    /// The active turn the interaction belongs to.
    pub turn_id: String,
    /// What is asked (an [`crate::interactions::Interaction`], decoded and
    /// checked by the handler).
    pub interaction: Value,
}

/// Params that name only a channel (`tandem/listPending`).
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChannelParams {
    /// The channel URI.
    pub channel: ChannelUri,
}
