//! Reads on the second connection: start-up recovery, one channel's stored
//! state (to roll back after a failed append), and turn paging.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use rusqlite::{params, Connection, OptionalExtension};

use super::unavailable;
use crate::ids::{ChannelUri, JournalPos, ServerSeq};
use crate::store::{
    AuditPage, ChannelInfo, ChannelKind, JournalError, Record, Recovered, RecoveredChannel,
    SnapshotRecord, TurnPage,
};

/// A channel's length (records ever appended to it) as an SQL expression
/// over its `channels` row. Appends do not rewrite the row (one page less in
/// every commit), so the length is the greatest of: the row's `len` (kept
/// current by stores written before that change, 0 since), the last stored
/// action's position + 1, and the snapshot's position (a snapshot compacts
/// the actions before it away). [`lengths`] reads the same for every
/// channel with three scans instead of two lookups per channel.
const LEN_SQL: &str = "MAX(channels.len, \
     COALESCE((SELECT MAX(seq) + 1 FROM actions WHERE actions.channel = channels.uri), 0), \
     COALESCE((SELECT at_seq FROM snapshots WHERE snapshots.channel = channels.uri), 0))";

/// The columns of a `channels` row, as [`read_channel`] reads them, the
/// length given by `len` (an SQL expression).
fn channel_columns(len: &str) -> String {
    format!("uri, kind, session, provider, title, created_at, {len}, owner")
}

/// Every stored channel's length (see [`LEN_SQL`]).
pub(super) fn lengths(conn: &Connection) -> Result<HashMap<String, u64>, JournalError> {
    let mut lens: HashMap<String, u64> = HashMap::new();
    for sql in [
        "SELECT uri, len FROM channels",
        "SELECT channel, MAX(seq) + 1 FROM actions GROUP BY channel",
        "SELECT channel, at_seq FROM snapshots",
    ] {
        for_each_row(
            conn,
            sql,
            |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)),
            |(uri, len)| {
                let l = lens.entry(uri).or_default();
                *l = (*l).max(len.max(0) as u64);
                Ok(())
            },
        )?;
    }
    Ok(lens)
}

/// A `channels` row read with [`channel_columns`]: the channel's identity
/// and how many records it has. A kind this build does not know is an
/// error, not a channel silently skipped.
fn read_channel(r: &rusqlite::Row<'_>) -> rusqlite::Result<(ChannelInfo, JournalPos)> {
    let uri: String = r.get(0)?;
    let kind: String = r.get(1)?;
    let Some(kind) = ChannelKind::parse(&kind) else {
        return Err(rusqlite::Error::FromSqlConversionFailure(
            1,
            rusqlite::types::Type::Text,
            format!("channel {uri} has an unknown kind `{kind}`").into(),
        ));
    };
    let info = ChannelInfo {
        uri: uri.into(),
        kind,
        session: r.get::<_, Option<String>>(2)?.map(ChannelUri::from),
        provider: r.get(3)?,
        title: r.get(4)?,
        created_at: r.get(5)?,
        owner: r.get(7)?,
    };
    Ok((info, JournalPos::new(r.get::<_, i64>(6)? as u64)))
}

/// Run the parameterless query `sql`, decode each row with `read` and hand
/// it to `each`; stops at the first error `each` returns.
fn for_each_row<T>(
    conn: &Connection,
    sql: &str,
    read: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    mut each: impl FnMut(T) -> Result<(), JournalError>,
) -> Result<(), JournalError> {
    let mut stmt = conn.prepare(sql).map_err(unavailable)?;
    for row in stmt.query_map([], read).map_err(unavailable)? {
        each(row.map_err(unavailable)?)?;
    }
    Ok(())
}

/// A row of (text, integer, text).
fn text_int_text(r: &rusqlite::Row<'_>) -> rusqlite::Result<(String, i64, String)> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
}

/// Every stored provider binding.
fn read_provider_owners(conn: &Connection) -> Result<BTreeMap<String, String>, JournalError> {
    let mut owners = BTreeMap::new();
    for_each_row(
        conn,
        "SELECT provider, subject FROM provider_owners",
        |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)),
        |(provider, subject)| {
            owners.insert(provider, subject);
            Ok(())
        },
    )?;
    Ok(owners)
}

/// Up to `limit` stored turns of `chat` just before index `before`, oldest first.
pub(super) fn turns_before(conn: &Connection, chat: &str, before: u64, limit: u64) -> TurnPage {
    let mut stmt = conn
        .prepare_cached(
            "SELECT turn FROM turns WHERE chat = ?1 AND idx >= ?2 AND idx < ?3 ORDER BY idx",
        )
        .map_err(unavailable)?;
    let start = before.saturating_sub(limit);
    let rows = stmt
        .query_map(params![chat, start as i64, before as i64], |r| {
            r.get::<_, String>(0)
        })
        .map_err(unavailable)?;
    rows.map(|r| r.map(Arc::from).map_err(unavailable))
        .collect()
}

/// Up to `limit` audit entries of `session` after `after`, oldest first.
pub(super) fn audit_page(conn: &Connection, session: &str, after: u64, limit: u64) -> AuditPage {
    let mut stmt = conn
        .prepare_cached(
            "SELECT seq, entry FROM audit WHERE session = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
        )
        .map_err(unavailable)?;
    let rows = stmt
        .query_map(
            params![
                session,
                after.min(i64::MAX as u64) as i64,
                limit.min(i64::MAX as u64) as i64
            ],
            |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, String>(1)?)),
        )
        .map_err(unavailable)?;
    rows.map(|r| r.map(|(seq, e)| (seq, Arc::from(e))).map_err(unavailable))
        .collect()
}

/// One channel as stored, or `None` if it is not.
pub(super) fn load_channel(
    conn: &Connection,
    uri: &str,
) -> Result<Option<RecoveredChannel>, JournalError> {
    let row = conn
        .query_row(
            &format!(
                "SELECT {} FROM channels WHERE uri = ?1",
                channel_columns(LEN_SQL)
            ),
            [uri],
            read_channel,
        )
        .optional()
        .map_err(unavailable)?;
    let Some((info, len)) = row else {
        return Ok(None);
    };
    let snapshot = conn
        .query_row(
            "SELECT at_seq, state FROM snapshots WHERE channel = ?1",
            [uri],
            |r| {
                Ok(SnapshotRecord {
                    at_seq: JournalPos::new(r.get::<_, i64>(0)? as u64),
                    state: r.get::<_, String>(1)?.into(),
                })
            },
        )
        .optional()
        .map_err(unavailable)?;
    let from = snapshot.as_ref().map_or(0, |s| s.at_seq.get()) as i64;
    let mut stmt = conn
        .prepare("SELECT action FROM actions WHERE channel = ?1 AND seq >= ?2 ORDER BY seq")
        .map_err(unavailable)?;
    let tail = stmt
        .query_map(params![uri, from], |r| r.get::<_, String>(0))
        .map_err(unavailable)?
        .map(|r| r.map(Record::from).map_err(unavailable))
        .collect::<Result<Vec<_>, _>>()?;
    let turn_count: i64 = conn
        .query_row(
            "SELECT COALESCE(MAX(idx) + 1, 0) FROM turns WHERE chat = ?1",
            [uri],
            |r| r.get(0),
        )
        .map_err(unavailable)?;
    Ok(Some(RecoveredChannel {
        info,
        snapshot,
        tail,
        tail_origins: Vec::new(),
        len,
        turn_count: turn_count as u64,
    }))
}

/// Every stored channel (sessions before their chats), the `serverSeq`
/// floor and the provider bindings.
pub(super) fn recover(conn: &Connection) -> Result<Recovered, JournalError> {
    let seq_floor: u64 = conn
        .query_row("SELECT value FROM meta WHERE key = 'seq_floor'", [], |r| {
            r.get::<_, i64>(0)
        })
        .optional()
        .map_err(unavailable)?
        .unwrap_or(0) as u64;
    let mut snapshots: HashMap<String, SnapshotRecord> = HashMap::new();
    for_each_row(
        conn,
        "SELECT channel, at_seq, state FROM snapshots",
        text_int_text,
        |(c, at, state)| {
            let record = SnapshotRecord {
                at_seq: JournalPos::new(at as u64),
                state: state.into(),
            };
            snapshots.insert(c, record);
            Ok(())
        },
    )?;
    let mut tails: HashMap<String, Vec<Record>> = HashMap::new();
    for_each_row(
        conn,
        "SELECT channel, seq, action FROM actions ORDER BY channel, seq",
        text_int_text,
        |(c, seq, action)| {
            let from = snapshots.get(&c).map_or(0, |s| s.at_seq.get());
            if seq as u64 >= from {
                tails.entry(c).or_default().push(action.into());
            }
            Ok(())
        },
    )?;
    let lens = lengths(conn)?;
    let mut turn_counts: HashMap<String, u64> = HashMap::new();
    for_each_row(
        conn,
        "SELECT chat, MAX(idx) + 1 FROM turns GROUP BY chat",
        |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)),
        |(c, n)| {
            turn_counts.insert(c, n as u64);
            Ok(())
        },
    )?;
    let mut channels = Vec::new();
    for_each_row(
        conn,
        &format!(
            "SELECT {} FROM channels ORDER BY ord",
            channel_columns("len")
        ),
        read_channel,
        |(info, row_len)| {
            let uri: &str = &info.uri;
            let len = lens.get(uri).map_or(row_len, |l| JournalPos::new(*l));
            channels.push(RecoveredChannel {
                snapshot: snapshots.remove(uri),
                tail: tails.remove(uri).unwrap_or_default(),
                tail_origins: Vec::new(),
                len,
                turn_count: turn_counts.get(uri).copied().unwrap_or(0),
                info,
            });
            Ok(())
        },
    )?;
    Ok(Recovered {
        channels,
        seq_floor: ServerSeq::new(seq_floor),
        provider_owners: read_provider_owners(conn)?,
    })
}
