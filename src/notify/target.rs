//! Where a webhook may point: `http` or `https` only, and — unless the
//! operator allows it — no loopback, link-local or unspecified address, so
//! a server reachable from a network cannot be made to call the machine
//! it runs on or a cloud's metadata service (server-side request forgery).
//! Literal addresses are checked when the webhook is configured; names are
//! checked again on every delivery, after they resolve, by [`Guarded`].

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// Whether `ip` is one a guarded webhook may not reach.
pub fn forbidden(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback() || v4.is_link_local() || v4.is_unspecified(),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return forbidden(IpAddr::V4(v4));
            }
            // fe80::/10: link-local unicast.
            v6.is_loopback() || v6.is_unspecified() || (v6.segments()[0] & 0xffc0) == 0xfe80
        }
    }
}

/// Check `url` as a webhook's target: `Err` with why it may not be one.
/// With `guarded`, a loopback or link-local host is refused.
pub fn check(url: &url::Url, guarded: bool) -> Result<(), String> {
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "`{url}`: a webhook must be an http:// or https:// URL"
        ));
    }
    let host = match url.host() {
        Some(h) => h,
        None => return Err(format!("`{url}` names no host")),
    };
    if !guarded {
        return Ok(());
    }
    let refused = |what: &str| {
        Err(format!(
            "`{url}` is {what}: on a server that listens beyond loopback a webhook may not \
             target loopback or link-local addresses (set `allow_loopback = true` on the \
             webhook to allow it)"
        ))
    };
    match host {
        url::Host::Ipv4(ip) if forbidden(IpAddr::V4(ip)) => {
            refused("a loopback or link-local address")
        }
        url::Host::Ipv6(ip) if forbidden(IpAddr::V6(ip)) => {
            refused("a loopback or link-local address")
        }
        url::Host::Domain(d)
            if d.eq_ignore_ascii_case("localhost") || d.ends_with(".localhost") =>
        {
            refused("this machine")
        }
        _ => Ok(()),
    }
}

/// A resolver that drops the addresses [`forbidden`] names, so a name that
/// resolves only to them cannot be reached.
#[derive(Clone, Default)]
pub struct Guarded;

impl Resolve for Guarded {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0))
                .await?
                .filter(|a| !forbidden(a.ip()))
                .collect();
            if found.is_empty() {
                let e = std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    format!("`{host}` resolves only to loopback or link-local addresses"),
                );
                return Err(Box::new(e) as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(found.into_iter()) as Addrs)
        })
    }
}

/// [`Guarded`] as reqwest takes it.
pub fn guarded() -> Arc<Guarded> {
    Arc::new(Guarded)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> url::Url {
        url::Url::parse(s).expect("a URL")
    }

    #[test]
    fn a_guarded_webhook_may_not_target_this_machine_or_link_local_addresses() {
        for bad in [
            "http://127.0.0.1:9/",
            "http://127.1.2.3/",
            "http://[::1]/",
            "http://[::ffff:127.0.0.1]/",
            "http://169.254.169.254/latest/meta-data",
            "http://[fe80::1]/",
            "http://0.0.0.0/",
            "http://localhost:8080/",
            "http://api.localhost/",
        ] {
            let e = check(&url(bad), true).expect_err(bad);
            assert!(e.contains("allow_loopback"), "{e}");
            assert!(check(&url(bad), false).is_ok(), "allowed: {bad}");
        }
        for good in [
            "https://hooks.slack.com/services/x",
            "http://10.0.0.5:8080/hook",
            "http://[2001:db8::1]/",
        ] {
            assert!(check(&url(good), true).is_ok(), "{good}");
        }
    }

    #[test]
    fn only_http_and_https_are_webhooks() {
        for bad in ["ftp://example.com/", "file:///etc/passwd", "gopher://x/"] {
            let e = check(&url(bad), false).expect_err(bad);
            assert!(e.contains("http:// or https://"), "{e}");
        }
    }
}
