//! `tandem/auditLog`: a session's audit log ([`crate::channels::audit`]),
//! a page at a time, for anyone who may open the session.

use serde::Deserialize;
use serde_json::{json, Value};

use super::connection::Connection;
use crate::ids::ChannelUri;
use crate::protocol::RpcError;

/// Entries in a page unless the caller asks for fewer or more.
const DEFAULT_PAGE: u64 = 100;
/// The most entries one page holds.
const MAX_PAGE: u64 = 500;

/// `tandem/auditLog` params.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct AuditLogParams {
    /// The session.
    pub session: ChannelUri,
    /// The `cursor` of the page before (absent: from the start).
    #[serde(default)]
    pub cursor: Option<u64>,
    /// Entries wanted (1 to 500; 100 unless given).
    #[serde(default)]
    pub limit: Option<u64>,
}

impl Connection {
    /// `tandem/auditLog`: `{entries, cursor, more}` — up to `limit` entries
    /// after `cursor`, oldest first; `cursor` is where the next page starts
    /// (the same one when nothing new was logged), `more` whether entries
    /// are left after this page. A disposed session's log stays readable
    /// to an admin.
    pub(super) fn audit_log(
        &mut self,
        id: Option<Value>,
        p: AuditLogParams,
        ctx: &mut actix::Context<Self>,
    ) -> Result<(), RpcError> {
        self.permit(&p.session)?;
        let admin = self.principal.role == crate::auth::Role::Admin;
        let known = self
            .app
            .shared
            .registry
            .get(&p.session)
            .is_some_and(|c| c.addr.is_session());
        if !known && !admin {
            return Err(super::routes::no_session(&p.session));
        }
        let limit = p.limit.unwrap_or(DEFAULT_PAGE);
        if !(1..=MAX_PAGE).contains(&limit) {
            return Err(RpcError::invalid_params(format!(
                "`limit` must be 1 to {MAX_PAGE}"
            )));
        }
        let after = p.cursor.unwrap_or(0);
        let journal = self.app.shared.journal.clone();
        let session = p.session;
        // One more than asked: whether the page is the last.
        let read =
            tokio::task::spawn_blocking(move || journal.audit_page(&session, after, limit + 1));
        let answer = async move {
            let page = read
                .await
                .map_err(|e| RpcError::internal(e.to_string()))?
                .map_err(|e| RpcError::internal(format!("the audit log could not be read: {e}")))?;
            Ok(page_json(page, after, limit))
        };
        self.reply_when(id, answer, ctx, |v| v);
        Ok(())
    }
}

/// The answer for a read of up to `limit + 1` entries after `after`.
fn page_json(mut page: Vec<(u64, std::sync::Arc<str>)>, after: u64, limit: u64) -> Value {
    let more = page.len() as u64 > limit;
    page.truncate(limit as usize);
    let cursor = page.last().map_or(after, |(c, _)| *c);
    let entries: Vec<Value> = page
        .iter()
        .map(|(_, e)| serde_json::from_str(e).unwrap_or(Value::Null))
        .collect();
    json!({"entries": entries, "cursor": cursor, "more": more})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_says_where_the_next_starts_and_whether_it_exists() {
        let page = vec![(3, "{\"a\":1}".into()), (7, "{\"a\":2}".into())];
        assert_eq!(
            page_json(page.clone(), 0, 1),
            json!({"entries": [{"a": 1}], "cursor": 3, "more": true})
        );
        assert_eq!(
            page_json(page, 0, 2),
            json!({"entries": [{"a": 1}, {"a": 2}], "cursor": 7, "more": false})
        );
        assert_eq!(
            page_json(Vec::new(), 7, 2),
            json!({"entries": [], "cursor": 7, "more": false})
        );
    }
}
