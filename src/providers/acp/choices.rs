//! An ACP agent's modes and models as session config: the two properties
//! every ACP session has (`agentMode`, `agentModel`), the values the agent
//! offers for them (from `session/new` / `session/load` and its later
//! `current_mode_update` / `config_option_update`), and the call that sets
//! one (`session/set_config_option` for an option of that category, else
//! `session/set_mode` for a mode).
//!
//! A person sets them like any config value (`session/configChanged`); the
//! bridge applies them to the agent before the next prompt.

use agent_client_protocol::v1::schema::{
    SessionConfigKind, SessionConfigOption, SessionConfigOptionCategory,
    SessionConfigSelectOptions, SessionModeState, SessionUpdate,
};
use ahp_types::commands::SessionConfigValueItem;
use ahp_types::state::SessionConfigPropertySchema;

/// Session config key: the agent's mode.
pub const MODE: &str = "agentMode";
/// Session config key: the agent's model.
pub const MODEL: &str = "agentModel";

/// The properties ACP sessions add to the session config: strings whose
/// values the agent offers at run time (`enumDynamic`, listed by
/// `sessionConfigCompletions`).
pub fn properties() -> Vec<(String, SessionConfigPropertySchema)> {
    [
        (MODE, "Agent mode", "The agent's mode (e.g. ask, code), from the modes it offers; applied at the next turn."),
        (MODEL, "Agent model", "The model the agent uses, from those it offers; applied at the next turn."),
    ]
    .into_iter()
    .map(|(key, title, description)| {
        (
            key.to_owned(),
            SessionConfigPropertySchema {
                r#type: "string".into(),
                title: title.into(),
                description: Some(description.into()),
                default: None,
                r#enum: None,
                enum_labels: None,
                enum_descriptions: None,
                read_only: None,
                items: None,
                min_items: None,
                max_items: None,
                properties: None,
                required: None,
                additional_properties: None,
                enum_dynamic: Some(true),
                session_mutable: Some(true),
            },
        )
    })
    .collect()
}

/// What one ACP session offers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Choices {
    modes: Option<SessionModeState>,
    options: Vec<SessionConfigOption>,
}

/// How to set a property on the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetCall {
    /// `session/set_mode`.
    Mode(String),
    /// `session/set_config_option` (option id, value id).
    Option(String, String),
}

impl Choices {
    /// What `session/new` or `session/load` answered.
    pub fn new(modes: Option<SessionModeState>, options: Option<Vec<SessionConfigOption>>) -> Self {
        Self {
            modes,
            options: options.unwrap_or_default(),
        }
    }

    /// Take in an update that changes them; whether it did.
    pub fn update(&mut self, update: &SessionUpdate) -> bool {
        match update {
            SessionUpdate::CurrentModeUpdate(u) => {
                if let Some(m) = &mut self.modes {
                    m.current_mode_id = u.current_mode_id.clone();
                }
                true
            }
            SessionUpdate::ConfigOptionUpdate(u) => {
                self.options = u.config_options.clone();
                true
            }
            _ => false,
        }
    }

    /// Options replaced wholesale (`session/set_config_option`'s answer).
    pub fn set_options(&mut self, options: Vec<SessionConfigOption>) {
        self.options = options;
    }

    /// A mode was set with `session/set_mode`.
    pub fn set_mode(&mut self, mode: &str) {
        if let Some(m) = &mut self.modes {
            m.current_mode_id = mode.to_owned().into();
        }
    }

    /// The select option of `category`, if the agent has one.
    fn select(
        &self,
        category: &SessionConfigOptionCategory,
    ) -> Option<(
        &SessionConfigOption,
        &agent_client_protocol::v1::schema::SessionConfigSelect,
    )> {
        self.options.iter().find_map(|o| match &o.kind {
            SessionConfigKind::Select(s) if o.category.as_ref() == Some(category) => Some((o, s)),
            _ => None,
        })
    }

    fn category(property: &str) -> Option<SessionConfigOptionCategory> {
        match property {
            MODE => Some(SessionConfigOptionCategory::Mode),
            MODEL => Some(SessionConfigOptionCategory::Model),
            _ => None,
        }
    }

    /// The values `property` may take, if the agent offers any.
    pub fn items(&self, property: &str) -> Option<Vec<SessionConfigValueItem>> {
        let category = Self::category(property)?;
        if let Some((_, select)) = self.select(&category) {
            let mut items = Vec::new();
            let item = |o: &agent_client_protocol::v1::schema::SessionConfigSelectOption| {
                SessionConfigValueItem {
                    value: o.value.to_string(),
                    label: o.name.clone(),
                    description: o.description.clone(),
                }
            };
            match &select.options {
                SessionConfigSelectOptions::Ungrouped(os) => items.extend(os.iter().map(item)),
                SessionConfigSelectOptions::Grouped(gs) => {
                    items.extend(gs.iter().flat_map(|g| g.options.iter().map(item)))
                }
                _ => {}
            }
            return Some(items);
        }
        match (property, &self.modes) {
            (MODE, Some(m)) => Some(
                m.available_modes
                    .iter()
                    .map(|mode| SessionConfigValueItem {
                        value: mode.id.to_string(),
                        label: mode.name.clone(),
                        description: mode.description.clone(),
                    })
                    .collect(),
            ),
            _ => None,
        }
    }

    /// The value `property` has in the agent now.
    pub fn current(&self, property: &str) -> Option<String> {
        let category = Self::category(property)?;
        if let Some((_, select)) = self.select(&category) {
            return Some(select.current_value.to_string());
        }
        match (property, &self.modes) {
            (MODE, Some(m)) => Some(m.current_mode_id.to_string()),
            _ => None,
        }
    }

    /// How to set `property` to `value`, or why it cannot be.
    pub fn set_call(&self, property: &str, value: &str) -> Result<SetCall, String> {
        let category = Self::category(property)
            .ok_or_else(|| format!("`{property}` is not an agent setting"))?;
        let offered = self.items(property).ok_or_else(|| {
            format!(
                "the agent offers no choice of {}",
                if property == MODE { "mode" } else { "model" }
            )
        })?;
        if !offered.iter().any(|i| i.value == value) {
            let known: Vec<&str> = offered.iter().map(|i| i.value.as_str()).collect();
            return Err(format!(
                "the agent offers no `{value}` for `{property}` (it offers {})",
                known.join(", ")
            ));
        }
        Ok(match self.select(&category) {
            Some((option, _)) => SetCall::Option(option.id.to_string(), value.to_owned()),
            None => SetCall::Mode(value.to_owned()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_client_protocol::v1::schema::{
        ConfigOptionUpdate, CurrentModeUpdate, SessionConfigSelectOption, SessionMode,
    };

    fn modes() -> SessionModeState {
        SessionModeState::new(
            "ask",
            vec![
                SessionMode::new("ask", "Ask"),
                SessionMode::new("code", "Code"),
            ],
        )
    }

    fn model_option(current: &str) -> SessionConfigOption {
        SessionConfigOption::select(
            "model",
            "Model",
            current.to_owned(),
            vec![
                SessionConfigSelectOption::new("fast", "Fast"),
                SessionConfigSelectOption::new("deep", "Deep"),
            ],
        )
        .category(SessionConfigOptionCategory::Model)
    }

    #[test]
    fn modes_come_from_the_mode_state_and_are_set_with_set_mode() {
        let mut c = Choices::new(Some(modes()), None);
        let items = c.items(MODE).expect("modes");
        assert_eq!(
            items.iter().map(|i| i.value.as_str()).collect::<Vec<_>>(),
            ["ask", "code"]
        );
        assert_eq!(c.current(MODE).as_deref(), Some("ask"));
        assert_eq!(c.set_call(MODE, "code"), Ok(SetCall::Mode("code".into())));
        assert!(c
            .set_call(MODE, "yolo")
            .unwrap_err()
            .contains("offers ask, code"));
        assert!(
            c.update(&SessionUpdate::CurrentModeUpdate(CurrentModeUpdate::new(
                "code"
            )))
        );
        assert_eq!(c.current(MODE).as_deref(), Some("code"));
        // No model selection offered.
        assert!(c.items(MODEL).is_none());
        assert!(c
            .set_call(MODEL, "x")
            .unwrap_err()
            .contains("no choice of model"));
    }

    #[test]
    fn a_config_option_of_the_category_wins_and_is_set_as_an_option() {
        let mut c = Choices::new(Some(modes()), Some(vec![model_option("fast")]));
        assert_eq!(c.current(MODEL).as_deref(), Some("fast"));
        assert_eq!(
            c.set_call(MODEL, "deep"),
            Ok(SetCall::Option("model".into(), "deep".into()))
        );
        assert!(
            c.update(&SessionUpdate::ConfigOptionUpdate(ConfigOptionUpdate::new(
                vec![model_option("deep")]
            )))
        );
        assert_eq!(c.current(MODEL).as_deref(), Some("deep"));
        let keys: Vec<String> = properties().into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, [MODE, MODEL]);
        assert!(properties()
            .iter()
            .all(|(_, p)| p.enum_dynamic == Some(true)));
    }
}
