//! The heartbeat: one task that looks at every open connection once per
//! interval, a share of them each tick, and pings, closes or lets go of
//! them (see [`Outbound::beat`]).

use std::sync::Weak;
use std::time::Duration;

use super::{Beat, Outbound};

/// How often the heartbeat wakes: each connection is beaten once per
/// interval, in the tick its id falls in, so the pings (and the pongs
/// coming back) are spread over the interval. Beating 10,000 connections at
/// once took both cores of a 2-core server for about 300 ms, and every
/// action published meanwhile waited that long.
const BEAT_TICK: Duration = Duration::from_millis(100);
/// Most ticks one interval is cut into.
const MAX_BEAT_SLICES: u64 = 256;

/// Look at every connection each `interval` (a share of them each tick):
/// ping those with no sign of life since the last look (see
/// [`Outbound::beat`]), close those with none for `idle_timeout`, and let
/// go of those whose close could not be written for as long. Runs until
/// the server's system stops.
///
/// `by_slot(slices)` lists the open connections at that moment, cut into
/// `slices` even shares, each held weakly: one that ends while the round
/// goes on is skipped, and a beat costs no lookup.
pub async fn heartbeat<T, F>(by_slot: F, interval: Duration, idle_timeout: Duration)
where
    T: AsRef<Outbound>,
    F: Fn(u64) -> Vec<Vec<Weak<T>>>,
{
    let interval = interval.max(Duration::from_millis(10));
    let idle_ms = idle_timeout.as_millis() as u64;
    let interval_ms = interval.as_millis() as u64;
    let abandon_beats = idle_timeout
        .as_millis()
        .div_ceil(interval.as_millis())
        .max(1) as u32;
    let slices = beat_slices(interval);
    let mut tick = tokio::time::interval(interval / slices as u32);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut slot = 0;
    // This interval's connections by slot, listed at its first tick (a
    // connection opened since waits for the next interval; one closed since
    // is skipped).
    let mut round: Vec<Vec<Weak<T>>> = Vec::new();
    loop {
        tick.tick().await;
        if slot == 0 {
            round = by_slot(slices);
        }
        let beaten = std::mem::take(&mut round[slot as usize]);
        slot = (slot + 1) % slices;
        for open in beaten.iter().filter_map(Weak::upgrade) {
            let c: &Outbound = (*open).as_ref();
            match c.beat(idle_ms, abandon_beats, interval_ms) {
                Beat::Idle => tracing::info!(conn = %c.id(), "closing an idle connection"),
                Beat::Abandoned => tracing::info!(
                    conn = %c.id(),
                    "letting go of a connection whose peer never took its close"
                ),
                Beat::Pinged | Beat::Acknowledged | Beat::Closing => {}
            }
        }
    }
}

/// Ticks one heartbeat `interval` is cut into: one per [`BEAT_TICK`], at
/// least one, at most [`MAX_BEAT_SLICES`].
fn beat_slices(interval: Duration) -> u64 {
    (interval.as_millis() / BEAT_TICK.as_millis()).clamp(1, u128::from(MAX_BEAT_SLICES)) as u64
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::transport::CloseCause;

    /// An open connection as the heartbeat is handed it.
    struct Open(Arc<Outbound>);

    impl AsRef<Outbound> for Open {
        fn as_ref(&self) -> &Outbound {
            &self.0
        }
    }

    /// Whether a ping waits at the front of `out`'s queue (taken, if so).
    fn pinged(out: &Outbound) -> bool {
        let waker = futures_util::task::noop_waker();
        match out.poll_take(&mut std::task::Context::from_waker(&waker), false) {
            crate::transport::outbound::Take::Ready(t) => {
                let ping = matches!(
                    t.frames.front(),
                    Some(crate::transport::outbound::Frame::Ping)
                );
                out.wrote(false);
                ping
            }
            _ => false,
        }
    }

    /// Let `d` pass one heartbeat tick at a time, the heartbeat running
    /// after each.
    async fn pass(d: Duration) {
        for _ in 0..d.as_millis() / BEAT_TICK.as_millis() {
            tokio::time::advance(BEAT_TICK).await;
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_heartbeat_pings_each_interval_spares_a_client_that_speaks_and_closes_a_silent_one()
    {
        let interval = Duration::from_secs(1);
        let idle = Duration::from_secs(3);
        let speaks = Arc::new(Open(Arc::new(Outbound::new(1 << 20))));
        let silent = Arc::new(Open(Arc::new(Outbound::new(1 << 20))));
        let open = [speaks.clone(), silent.clone()];
        let task = tokio::spawn(heartbeat(
            move |slices| {
                let mut slots: Vec<Vec<Weak<Open>>> = vec![Vec::new(); slices as usize];
                slots[0] = open.iter().map(Arc::downgrade).collect();
                slots
            },
            interval,
            idle,
        ));
        // Let the heartbeat take its first tick (now) and wait for the next.
        tokio::task::yield_now().await;
        for beat in 1..=3 {
            pass(interval).await;
            assert!(
                pinged(&speaks.0),
                "beat {beat}: the talking client is pinged"
            );
            assert!(
                pinged(&silent.0),
                "beat {beat}: the silent client is pinged"
            );
            speaks.0.received();
        }
        assert!(!speaks.0.is_closing() && !silent.0.is_closing());
        // Past the idle timeout without a frame: the silent one is closed.
        pass(interval).await;
        assert!(
            matches!(silent.0.close_cause(), Some(CloseCause::Protocol(m)) if m.starts_with("idle for")),
            "{:?}",
            silent.0.close_cause()
        );
        assert!(!speaks.0.is_closing(), "the client that answers stays");
        task.abort();
    }

    #[test]
    fn the_heartbeat_spreads_its_pings_over_the_interval() {
        // The default 20 s: 200 ticks of 100 ms, each connection in one.
        assert_eq!(beat_slices(Duration::from_secs(20)), 200);
        assert_eq!(beat_slices(Duration::from_secs(60)), MAX_BEAT_SLICES);
        // Short intervals (tests) beat everyone at each tick.
        assert_eq!(beat_slices(Duration::from_millis(50)), 1);
    }
}
