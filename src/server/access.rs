//! Which web pages may open `/ahp`: the `Origin` and `Host` rules.
//!
//! A browser lets any page open a WebSocket to any address — including a
//! Tandem on the user's own loopback, which without a secret trusts every
//! caller. Browsers always send `Origin` on a WebSocket upgrade (the Fetch
//! standard adds it to every `websocket`-mode request), and a page cannot
//! forge it, so the rules apply exactly to upgrades that carry one:
//!
//! 1. An origin on the operator's allow-list (`--allowed-origin`) is accepted.
//! 2. Otherwise the page must be the server's own: the origin's host and port
//!    equal the request's `Host` (whose missing port is the origin scheme's
//!    default), and the scheme is `http` or `https` — the web client served
//!    at `/` passes, `Origin: null` (sandboxed frames, `file:` pages) does not.
//! 3. On a loopback bind, `Host` must also be a loopback name — `localhost`,
//!    an IPv4 loopback address or `[::1]` — with the bound port. This stops
//!    DNS rebinding: a page at `evil.example:7420` whose name now resolves to
//!    127.0.0.1 is "same-origin" with itself, but its `Host` is not ours.
//!    On any other bind a token is mandatory, and the server cannot know the
//!    names it is reached by, so `Host` is accepted as it comes.
//!
//! Behind a reverse proxy, or through a tunnel on another port, the page's
//! origin is the public one and `Host` is not a loopback name with our port:
//! the operator allows that origin (rule 1), and nothing else changes.
//!
//! Clients without `Origin` (the official `ahp` client, IDEs, scripts) are
//! not browsers and are unaffected. The static routes (`/`, the client's
//! files, `/healthz`, `/readyz`) are not checked: they hold nothing beyond the public
//! client code and a few counters, and every action goes through `/ahp`.

use std::net::SocketAddr;

use url::{Host, Url};

/// Why an `--allowed-origin` value cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--allowed-origin `{origin}`: {why} (write it as scheme://host[:port], like `https://ide.example.com`)")]
pub struct OriginConfigError {
    /// The value as given.
    pub origin: String,
    /// What is wrong with it.
    pub why: String,
}

/// Why an upgrade was refused (HTTP 403; the text is the body's message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// `Origin: null`: a page without an origin of its own.
    #[error("`Origin: null` refused: a sandboxed or local-file page may not connect")]
    NullOrigin,
    /// An `Origin` that is not `scheme://host[:port]`.
    #[error("malformed `Origin` header")]
    BadOrigin,
    /// A browser request without a usable `Host`.
    #[error("a browser upgrade without a valid `Host` header")]
    BadHost,
    /// A page from another site.
    #[error("cross-origin upgrade refused: `{origin}` is not the origin of this server (`{host}`); an operator may allow it with --allowed-origin")]
    CrossOrigin {
        /// The page's origin.
        origin: String,
        /// The request's `Host`.
        host: String,
    },
    /// A name that is not this loopback server (DNS rebinding).
    #[error("Host `{host}` refused: this server listens on loopback and answers browsers only at localhost, 127.0.0.1 or [::1] port {port} (DNS rebinding guard; see --allowed-origin)")]
    ForeignHost {
        /// The request's `Host`.
        host: String,
        /// The bound port.
        port: u16,
    },
}

/// A normalized origin: scheme, host, and port (the scheme's default when
/// not written).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Origin {
    scheme: String,
    host: Host<String>,
    port: Option<u16>,
}

impl Origin {
    /// Parse `scheme://host[:port]` (a trailing `/` is tolerated for
    /// hand-written values); nothing else may follow.
    fn parse(s: &str) -> Result<Self, String> {
        let url = Url::parse(s).map_err(|e| e.to_string())?;
        let host = url
            .host()
            .ok_or_else(|| "it has no host".to_owned())?
            .to_owned();
        if !url.username().is_empty() || url.password().is_some() {
            return Err("an origin has no user name or password".into());
        }
        if !matches!(url.path(), "" | "/") || url.query().is_some() || url.fragment().is_some() {
            return Err("an origin has no path, query or fragment".into());
        }
        Ok(Self {
            scheme: url.scheme().to_owned(),
            host,
            port: url.port_or_known_default(),
        })
    }

    /// The default port of a web origin's scheme (`None`: not a web page,
    /// never the server's own origin).
    fn web_default_port(&self) -> Option<u16> {
        match self.scheme.as_str() {
            "http" => Some(80),
            "https" => Some(443),
            _ => None,
        }
    }
}

/// A `Host` header: a name or address, and the port if written.
fn parse_host(header: &str) -> Option<(Host<String>, Option<u16>)> {
    let (name, port) = match header.strip_prefix('[') {
        Some(rest) => {
            let (ip, after) = rest.split_once(']')?;
            let port = match after {
                "" => None,
                p => Some(p.strip_prefix(':')?.parse().ok()?),
            };
            (format!("[{ip}]"), port)
        }
        None => match header.rsplit_once(':') {
            Some((name, p)) => (name.to_owned(), Some(p.parse().ok()?)),
            None => (header.to_owned(), None),
        },
    };
    if name.is_empty() {
        return None;
    }
    Some((Host::parse(&name).ok()?, port))
}

fn is_loopback(host: &Host<String>) -> bool {
    match host {
        Host::Domain(d) => d.eq_ignore_ascii_case("localhost"),
        Host::Ipv4(ip) => ip.is_loopback(),
        Host::Ipv6(ip) => ip.is_loopback(),
    }
}

/// The `Origin`/`Host` rules of one server (see the module doc).
#[derive(Debug, Clone)]
pub struct OriginPolicy {
    /// The bound port when bound to loopback: `Host` must then name a
    /// loopback address with it (rule 3); `None` on other binds.
    loopback_port: Option<u16>,
    /// Operator-allowed origins (rule 1).
    allowed: Vec<Origin>,
}

impl OriginPolicy {
    /// The rules for a server bound to `bound`, with operator-allowed
    /// origins `allowed` (each `scheme://host[:port]`).
    pub fn new(bound: SocketAddr, allowed: &[String]) -> Result<Self, OriginConfigError> {
        let allowed = allowed
            .iter()
            .map(|o| {
                Origin::parse(o.trim()).map_err(|why| OriginConfigError {
                    origin: o.clone(),
                    why,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            loopback_port: bound.ip().is_loopback().then_some(bound.port()),
            allowed,
        })
    }

    /// Check an upgrade's `Origin` and `Host` headers (`None` when absent or
    /// not text).
    pub fn check(&self, origin: Option<&str>, host: Option<&str>) -> Result<(), Refusal> {
        let Some(origin) = origin else {
            return Ok(());
        };
        if origin.trim() == "null" {
            return Err(Refusal::NullOrigin);
        }
        let parsed = Origin::parse(origin).map_err(|_| Refusal::BadOrigin)?;
        if self.allowed.contains(&parsed) {
            return Ok(());
        }
        let host_header = host.ok_or(Refusal::BadHost)?;
        let (host, port) = parse_host(host_header).ok_or(Refusal::BadHost)?;
        let cross = || Refusal::CrossOrigin {
            origin: origin.to_owned(),
            host: host_header.to_owned(),
        };
        let default_port = parsed.web_default_port().ok_or_else(cross)?;
        // A `Host` without a port means the default of the scheme the page
        // was loaded with.
        let port = port.unwrap_or(default_port);
        if parsed.host != host || parsed.port != Some(port) {
            return Err(cross());
        }
        if let Some(bound) = self.loopback_port {
            if !(is_loopback(&host) && port == bound) {
                return Err(Refusal::ForeignHost {
                    host: host_header.to_owned(),
                    port: bound,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loopback() -> OriginPolicy {
        OriginPolicy::new("127.0.0.1:7420".parse().expect("addr"), &[]).expect("policy")
    }

    #[test]
    fn clients_without_origin_are_not_browsers_and_pass() {
        assert_eq!(loopback().check(None, None), Ok(()));
        assert_eq!(loopback().check(None, Some("anything:1")), Ok(()));
    }

    #[test]
    fn the_served_client_passes_on_every_loopback_name() {
        let p = loopback();
        for (origin, host) in [
            ("http://127.0.0.1:7420", "127.0.0.1:7420"),
            ("http://localhost:7420", "localhost:7420"),
            ("http://LOCALHOST:7420", "localhost:7420"),
            ("http://[::1]:7420", "[::1]:7420"),
            ("https://localhost:7420", "localhost:7420"),
        ] {
            assert_eq!(p.check(Some(origin), Some(host)), Ok(()), "{origin}");
        }
        let on_80 = OriginPolicy::new("127.0.0.1:80".parse().expect("addr"), &[]).expect("p");
        assert_eq!(
            on_80.check(Some("http://localhost"), Some("localhost")),
            Ok(())
        );
    }

    #[test]
    fn foreign_pages_null_and_rebinding_are_refused() {
        let p = loopback();
        assert!(matches!(
            p.check(Some("https://evil.example"), Some("127.0.0.1:7420")),
            Err(Refusal::CrossOrigin { .. })
        ));
        assert_eq!(
            p.check(Some("null"), Some("127.0.0.1:7420")),
            Err(Refusal::NullOrigin)
        );
        assert_eq!(
            p.check(Some("::"), Some("127.0.0.1:7420")),
            Err(Refusal::BadOrigin)
        );
        assert_eq!(
            p.check(Some("http://localhost:7420"), None),
            Err(Refusal::BadHost)
        );
        // Another port on the same host is another origin.
        assert!(matches!(
            p.check(Some("http://localhost:8080"), Some("localhost:7420")),
            Err(Refusal::CrossOrigin { .. })
        ));
        // http://localhost (port 80) against Host localhost:7420.
        assert!(p
            .check(Some("http://localhost"), Some("localhost:7420"))
            .is_err());
        // DNS rebinding: same-origin with itself, but not our name.
        assert!(matches!(
            p.check(Some("http://evil.example:7420"), Some("evil.example:7420")),
            Err(Refusal::ForeignHost { port: 7420, .. })
        ));
        // A loopback name on another port (not where we listen).
        assert!(matches!(
            p.check(Some("http://127.0.0.1:9000"), Some("127.0.0.1:9000")),
            Err(Refusal::ForeignHost { .. })
        ));
        // Not a web page.
        assert!(p
            .check(Some("chrome-extension://abc"), Some("127.0.0.1:7420"))
            .is_err());
    }

    #[test]
    fn allowed_origins_pass_and_their_names_count_as_ours() {
        let p = OriginPolicy::new(
            "127.0.0.1:7420".parse().expect("addr"),
            &[
                "https://ide.example.com".into(),
                "https://tandem.example/".into(),
                "vscode-webview://abc".into(),
            ],
        )
        .expect("policy");
        assert_eq!(
            p.check(Some("https://ide.example.com"), Some("127.0.0.1:7420")),
            Ok(())
        );
        assert_eq!(
            p.check(Some("https://IDE.example.com:443"), Some("x")),
            Ok(())
        );
        assert_eq!(
            p.check(Some("https://tandem.example"), Some("tandem.example")),
            Ok(())
        );
        assert_eq!(
            p.check(Some("vscode-webview://abc"), Some("127.0.0.1:7420")),
            Ok(())
        );
        assert!(
            p.check(Some("http://ide.example.com"), Some("127.0.0.1:7420"))
                .is_err(),
            "the scheme is part of the origin"
        );
    }

    #[test]
    fn a_public_bind_accepts_any_host_but_still_only_its_own_origin() {
        let p = OriginPolicy::new("0.0.0.0:7420".parse().expect("addr"), &[]).expect("policy");
        assert_eq!(
            p.check(Some("http://192.168.1.5:7420"), Some("192.168.1.5:7420")),
            Ok(())
        );
        assert_eq!(
            p.check(Some("https://tandem.example"), Some("tandem.example")),
            Ok(())
        );
        assert!(matches!(
            p.check(Some("https://evil.example"), Some("tandem.example")),
            Err(Refusal::CrossOrigin { .. })
        ));
    }

    #[test]
    fn bad_allowed_origins_are_refused_at_start() {
        let bound = "127.0.0.1:7420".parse().expect("addr");
        for bad in [
            "ide.example.com",
            "https://x.example/app",
            "https://u:p@x.example",
            "*",
        ] {
            let e = OriginPolicy::new(bound, &[bad.into()]).expect_err(bad);
            assert!(e.to_string().contains(bad), "{e}");
        }
    }
}
