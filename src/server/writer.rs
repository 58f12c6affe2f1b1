//! The per-connection writer: drains the byte-bounded [`Outbound`] queue into
//! the socket, pings an idle peer, and closes with a reason. It is the only
//! place that awaits the socket, so a slow reader slows nobody else.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::Addr;
use actix_ws::{CloseCode, CloseReason, Session};

use super::connection::{Connection, WriterGone};
use crate::publish::outbound::{CloseCause, Next, Outbound};

/// How long a close frame may wait for a peer that stopped reading.
const CLOSE_GRACE: Duration = Duration::from_secs(30);

/// Milliseconds since the Unix epoch (activity stamps).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn close_reason(cause: &CloseCause) -> CloseReason {
    match cause {
        CloseCause::Overflow => CloseReason {
            code: CloseCode::Policy,
            description: Some(
                "outbound buffer overflow: the client read too slowly; reconnect to resume".into(),
            ),
        },
        CloseCause::Protocol(msg) => CloseReason {
            code: if msg.contains("too large") {
                CloseCode::Size
            } else {
                CloseCode::Policy
            },
            description: Some(msg.clone()),
        },
        CloseCause::Shutdown => CloseReason {
            code: CloseCode::Away,
            description: Some("server shutting down".into()),
        },
    }
}

/// Run until the connection closes.
pub async fn run(
    out: Arc<Outbound>,
    mut session: Session,
    conn: Addr<Connection>,
    last_rx_ms: Arc<AtomicU64>,
    heartbeat: Duration,
    idle_timeout: Duration,
) {
    let mut tick = tokio::time::interval(heartbeat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        let next = tokio::select! {
            next = out.next() => next,
            _ = tick.tick() => {
                let idle_ms = now_ms().saturating_sub(last_rx_ms.load(Ordering::Relaxed));
                if idle_ms > idle_timeout.as_millis() as u64 {
                    out.close(CloseCause::Protocol(format!("idle for {idle_ms} ms without any frame")));
                } else if tokio::time::timeout(heartbeat, session.ping(b"")).await.is_err() {
                    out.close(CloseCause::Overflow);
                }
                continue;
            }
        };
        match next {
            Next::Frame(frame) => {
                let evicted = tokio::select! {
                    sent = session.text(frame.data.clone()) => {
                        if sent.is_err() {
                            break;
                        }
                        false
                    }
                    _ = out.evicted() => true,
                };
                out.sent(&frame);
                if evicted {
                    continue;
                }
            }
            Next::Close(cause) => {
                if cause == CloseCause::Shutdown {
                    tracing::debug!(conn = out.id().0, "closing connection");
                } else {
                    tracing::info!(conn = out.id().0, ?cause, "closing connection");
                }
                // Close first, then let the connection actor go: stopping it
                // drops the socket, which would lose the close frame.
                let _ =
                    tokio::time::timeout(CLOSE_GRACE, session.close(Some(close_reason(&cause))))
                        .await;
                conn.do_send(WriterGone);
                return;
            }
        }
    }
    out.close(CloseCause::Shutdown);
    conn.do_send(WriterGone);
}
