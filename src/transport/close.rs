//! How a connection's close reads on the wire: the close frame's code and
//! reason for each [`CloseCause`], and the cause's name in log lines.

use actix_http::ws::{CloseCode, CloseReason};

use super::CloseCause;

/// RFC 6455: a close frame's reason is at most 123 bytes (strict clients
/// such as Chromium fail the connection on longer ones).
pub(crate) const MAX_CLOSE_REASON: usize = 123;

/// The close code for an expired token: in the range RFC 6455 leaves to
/// applications, and mirroring HTTP 401 so a client can tell it from other
/// policy closes (1008) — reconnecting with the same token would be refused.
pub const TOKEN_EXPIRED_CLOSE_CODE: u16 = 4401;

/// The close reason sent with [`TOKEN_EXPIRED_CLOSE_CODE`].
pub const TOKEN_EXPIRED_REASON: &str = "token expired: reconnect with a fresh token";

/// The close code for a connection whose invite link ended: like
/// [`TOKEN_EXPIRED_CLOSE_CODE`] but mirroring HTTP 403 — the link will not
/// let it in again.
pub const INVITE_ENDED_CLOSE_CODE: u16 = 4403;

/// Whether a close code may be sent (1005, 1006, 1015 and unassigned ranges
/// may not).
fn sendable(code: u16) -> bool {
    matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999)
}

/// The close frame for `cause`.
pub fn close_reason(cause: &CloseCause) -> CloseReason {
    let (code, text) = match cause {
        CloseCause::Overflow => (
            CloseCode::Policy,
            "outbound buffer overflow: the client read too slowly; reconnect to resume".to_owned(),
        ),
        CloseCause::Protocol(msg) => (CloseCode::Policy, msg.clone()),
        CloseCause::TooLarge(msg) => (CloseCode::Size, msg.clone()),
        CloseCause::Malformed(msg) => (CloseCode::Protocol, msg.clone()),
        CloseCause::InvalidText(msg) => (CloseCode::Invalid, msg.clone()),
        CloseCause::Normal => (CloseCode::Normal, String::new()),
        // RFC 6455 §5.5.1: echo the client's code, unless it is one that
        // must not appear on the wire.
        CloseCause::ClientClosed(Some(code)) if sendable(*code) => {
            (CloseCode::from(*code), String::new())
        }
        CloseCause::ClientClosed(_) => (CloseCode::Normal, String::new()),
        CloseCause::Shutdown => (CloseCode::Away, "server shutting down".to_owned()),
        CloseCause::TokenExpired => (
            CloseCode::Other(TOKEN_EXPIRED_CLOSE_CODE),
            TOKEN_EXPIRED_REASON.to_owned(),
        ),
        CloseCause::InviteEnded(why) => {
            (CloseCode::Other(INVITE_ENDED_CLOSE_CODE), (*why).to_owned())
        }
    };
    let mut text = text;
    if text.len() > MAX_CLOSE_REASON {
        let mut end = MAX_CLOSE_REASON;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    CloseReason {
        code,
        description: (!text.is_empty()).then_some(text),
    }
}

/// A close's cause in a log line.
pub(crate) fn cause_name(cause: &CloseCause) -> &'static str {
    match cause {
        CloseCause::Overflow => "overflow",
        CloseCause::Protocol(_) => "idle",
        CloseCause::TooLarge(_) => "too_large",
        CloseCause::Malformed(_) => "malformed",
        CloseCause::InvalidText(_) => "invalid_text",
        CloseCause::Normal => "server",
        CloseCause::ClientClosed(_) => "client",
        CloseCause::Shutdown => "shutdown",
        CloseCause::TokenExpired => "token_expired",
        CloseCause::InviteEnded(_) => "invite_ended",
    }
}

#[cfg(test)]
mod tests {
    use super::super::inbound::ReadError;
    use super::*;

    #[test]
    fn close_reasons_fit_a_control_frame() {
        let long = CloseCause::Protocol("é".repeat(200));
        let reason = close_reason(&long);
        assert!(reason.description.unwrap().len() <= MAX_CLOSE_REASON);
        assert_eq!(
            close_reason(&ReadError::TooLarge(10).close_cause()).code,
            CloseCode::Size
        );
        assert_eq!(
            close_reason(&ReadError::Protocol("x".into()).close_cause()).code,
            CloseCode::Protocol
        );
        assert_eq!(close_reason(&CloseCause::Shutdown).code, CloseCode::Away);
        let expired = close_reason(&CloseCause::TokenExpired);
        assert_eq!(expired.code, CloseCode::Other(TOKEN_EXPIRED_CLOSE_CODE));
        assert!(expired
            .description
            .is_some_and(|d| d.len() <= MAX_CLOSE_REASON));
        assert_eq!(close_reason(&CloseCause::Normal).description, None);
        assert_eq!(
            close_reason(&CloseCause::ClientClosed(Some(4001))).code,
            CloseCode::Other(4001)
        );
        assert_eq!(
            close_reason(&CloseCause::ClientClosed(Some(1005))).code,
            CloseCode::Normal
        );
        assert_eq!(
            close_reason(&CloseCause::ClientClosed(None)).code,
            CloseCode::Normal
        );
    }
}
