//! ACP elicitation (`elicitation/create`): a form becomes our `form`
//! interaction (the same MCP-style `requestedSchema`), a URL our `url`
//! interaction, with the same settlement rules as any question; the settled
//! answer is what goes back — `accept` with the form's content, `decline`,
//! or `cancel` when the turn was cancelled, the request aborted or nobody
//! answered in time.

use agent_client_protocol::v1::schema::{CreateElicitationRequest, CreateElicitationResponse};
use serde_json::{json, Value};

use super::map::json_of;
use crate::interactions::{Interaction, Outcome, Settlement};

/// The ACP session the request belongs to, when it names one.
pub fn session_of(request: &CreateElicitationRequest) -> Option<String> {
    json_of(request)
        .get("sessionId")
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// The interaction people see, or why the request cannot be shown.
pub fn interaction(request: &CreateElicitationRequest) -> Result<Interaction, String> {
    let v = json_of(request);
    let message = request.message.clone();
    match v.get("mode").and_then(Value::as_str) {
        Some("form") => Ok(Interaction::Form {
            message,
            schema: v.get("requestedSchema").cloned().unwrap_or(Value::Null),
        }),
        Some("url") => {
            let url = v
                .get("url")
                .and_then(Value::as_str)
                .ok_or("a URL elicitation without `url`")?;
            Ok(Interaction::Url {
                message,
                url: url.to_owned(),
            })
        }
        other => Err(format!("elicitation mode {other:?} is not supported")),
    }
}

/// The one answer the agent gets, settled as `s`.
pub fn answer(s: &Settlement) -> CreateElicitationResponse {
    let v = match s.outcome {
        Outcome::Answered => match &s.content {
            Some(content) => json!({"action": "accept", "content": content}),
            None => json!({"action": "accept"}),
        },
        Outcome::Declined => json!({"action": "decline"}),
        _ => json!({"action": "cancel"}),
    };
    cancel_or(v)
}

/// ACP's `cancel` answer.
pub fn cancelled() -> CreateElicitationResponse {
    cancel_or(json!({"action": "cancel"}))
}

fn cancel_or(v: Value) -> CreateElicitationResponse {
    serde_json::from_value(v).unwrap_or_else(|_| {
        serde_json::from_value(json!({"action": "cancel"})).expect("`cancel` is a valid response")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_and_urls_become_interactions_and_the_settlement_goes_back() {
        let form: CreateElicitationRequest = serde_json::from_value(json!({
            "sessionId": "s-1", "mode": "form", "message": "Tell me",
            "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
        }))
        .expect("a form request");
        assert_eq!(session_of(&form).as_deref(), Some("s-1"));
        let Ok(Interaction::Form { message, schema }) = interaction(&form) else {
            panic!("a form");
        };
        assert_eq!(message, "Tell me");
        assert_eq!(schema["required"][0], "name");

        let url: CreateElicitationRequest = serde_json::from_value(json!({
            "sessionId": "s-1", "mode": "url", "message": "Open", "elicitationId": "e1",
            "url": "https://example.com/auth"
        }))
        .expect("a url request");
        assert!(
            matches!(interaction(&url), Ok(Interaction::Url { url, .. }) if url == "https://example.com/auth")
        );

        let accepted = Settlement {
            content: Some(json!({"name": "spring"})),
            ..Settlement::bare(Outcome::Answered)
        };
        assert_eq!(
            json_of(&answer(&accepted)),
            json!({"action": "accept", "content": {"name": "spring"}})
        );
        assert_eq!(
            json_of(&answer(&Settlement::bare(Outcome::Declined)))["action"],
            "decline"
        );
        for o in [
            Outcome::Cancelled,
            Outcome::Interrupted,
            Outcome::Aborted,
            Outcome::TimedOut,
        ] {
            assert_eq!(json_of(&answer(&Settlement::bare(o)))["action"], "cancel");
        }
    }
}
