//! Which links an agent may ask a person to open.
//!
//! A URL request becomes a link in every subscriber's client. Only absolute
//! `http:` and `https:` URLs are allowed: a `javascript:` or `data:` link runs
//! in (or replaces) the client's own page, which holds the person's session
//! and token; `file:` and custom schemes reach into the person's machine.
//! User names and passwords in a URL are refused too: `https://bank.example@evil.example`
//! is a classic way to make a link look like somewhere it is not.
//!
//! The rule is checked where an agent's URL enters: `tandem/requestInteraction`
//! (`-32602`), an in-process agent's interaction (settles `aborted`) and a
//! provider's raw `chat/inputRequested` (rejected). The web client applies the
//! same rule again before it makes a link.

/// The longest part of a refused URL quoted back in the reason.
const MAX_QUOTED_CHARS: usize = 80;

/// Why a URL may not be offered as a link.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`url` must be an absolute http or https URL: {why} (got `{quoted}`)")]
pub struct LinkRefused {
    /// What is wrong.
    pub why: String,
    /// The URL, shortened.
    pub quoted: String,
}

/// Accept `url` only as an absolute `http`/`https` URL with a host and no
/// credentials, parsed by the WHATWG rules browsers use.
pub fn check(url: &str) -> Result<(), LinkRefused> {
    let refuse = |why: String| LinkRefused {
        why,
        quoted: url.chars().take(MAX_QUOTED_CHARS).collect(),
    };
    let parsed = url::Url::parse(url).map_err(|e| refuse(e.to_string()))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(refuse(format!(
            "the scheme `{}:` is not allowed",
            parsed.scheme()
        )));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(refuse("it has no host".into()));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(refuse("it carries a user name or password".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_absolute_http_urls_with_a_host_pass() {
        for ok in [
            "https://example.com",
            "http://127.0.0.1:7420/healthz",
            "https://example.com/a?b=c#d",
            "HTTPS://EXAMPLE.COM/",
        ] {
            assert_eq!(check(ok), Ok(()), "{ok}");
        }
        for bad in [
            "javascript:alert(1)",
            "JavaScript:alert(1)",
            " java\tscript:alert(1)",
            "data:text/html,<script>alert(1)</script>",
            "file:///etc/passwd",
            "vbscript:x",
            "/relative/path",
            "//example.com/no-scheme",
            "example.com",
            "https://user:pw@example.com",
            "https://bank.example@evil.example/",
            "",
        ] {
            let e = check(bad).expect_err(bad);
            assert!(e
                .to_string()
                .starts_with("`url` must be an absolute http or https URL"));
        }
    }

    #[test]
    fn a_long_refused_url_is_quoted_short() {
        let long = format!("javascript:{}", "x".repeat(10_000));
        let e = check(&long).expect_err("refused");
        assert_eq!(e.quoted.chars().count(), MAX_QUOTED_CHARS);
    }
}
