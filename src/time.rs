//! Wall-clock timestamps in the ISO 8601 form AHP uses (`…T18:42:03.123Z`).

/// Now, as an RFC 3339 UTC timestamp with milliseconds.
pub fn now_rfc3339() -> String {
    format!("{:.3}", jiff::Timestamp::now())
}

/// Milliseconds from an RFC 3339 `started_at` to now (0 if it does not parse
/// or lies in the future) — the `duration` of a turn that ends now.
pub fn millis_since(started_at: &str) -> i64 {
    started_at
        .parse::<jiff::Timestamp>()
        .ok()
        .and_then(|t| {
            jiff::Timestamp::now()
                .duration_since(t)
                .as_millis()
                .try_into()
                .ok()
        })
        .map(|ms: i64| ms.max(0))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn timestamps_parse_back() {
        let now = super::now_rfc3339();
        assert!(now.ends_with('Z'), "{now}");
        assert!(now.parse::<jiff::Timestamp>().is_ok());
        assert!(super::millis_since(&now) < 5_000);
        assert_eq!(super::millis_since("garbage"), 0);
    }
}
