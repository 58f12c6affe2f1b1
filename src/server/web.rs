//! The browser client (`web/`), embedded in the binary and served at `/`.
//!
//! Plain ES modules, no build step: every file under `web/` that the page
//! loads is listed in [`ASSETS`] and compiled in with `include_bytes!`, so the
//! one `tandem serve` command is all a user needs and nothing is fetched at
//! run time. The page speaks AHP to `/ahp` like any other client.

use actix_web::{guard, http::header, web, HttpResponse};

/// One embedded file: URL path, content type, bytes.
pub struct Asset {
    /// Path the browser asks for.
    pub path: &'static str,
    /// `Content-Type` header.
    pub content_type: &'static str,
    /// The file, as compiled in.
    pub body: &'static [u8],
}

macro_rules! asset {
    ($path:literal, $file:literal, $ct:expr) => {
        Asset {
            path: $path,
            content_type: $ct,
            body: include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/web/", $file)),
        }
    };
}

const JS: &str = "text/javascript; charset=utf-8";

/// Everything the page loads.
pub const ASSETS: &[Asset] = &[
    asset!("/", "index.html", "text/html; charset=utf-8"),
    asset!("/index.html", "index.html", "text/html; charset=utf-8"),
    asset!("/style.css", "style.css", "text/css; charset=utf-8"),
    asset!("/favicon.svg", "favicon.svg", "image/svg+xml"),
    asset!("/app.js", "app.js", JS),
    asset!("/ahp.js", "ahp.js", JS),
    asset!("/reducers.js", "reducers.js", JS),
    asset!("/validate.js", "validate.js", JS),
    asset!("/markdown.js", "markdown.js", JS),
    asset!("/dom.js", "dom.js", JS),
    asset!("/cards.js", "cards.js", JS),
    asset!("/coedit.js", "coedit.js", JS),
    asset!("/admin.js", "admin.js", JS),
    asset!("/people.js", "people.js", JS),
    asset!("/invites.js", "invites.js", JS),
    asset!("/activity.js", "activity.js", JS),
    asset!("/presence.js", "presence.js", JS),
    asset!("/notify.js", "notify.js", JS),
    asset!("/waiting.js", "waiting.js", JS),
    // At the root, so its scope is the whole page.
    asset!("/sw.js", "sw.js", JS),
];

/// Register a GET (and HEAD) route per embedded file.
pub fn routes(cfg: &mut web::ServiceConfig) {
    for asset in ASSETS {
        let (ct, body) = (asset.content_type, asset.body);
        cfg.route(
            asset.path,
            web::route()
                .guard(guard::Any(guard::Get()).or(guard::Head()))
                .to(move || async move {
                    HttpResponse::Ok()
                        .content_type(ct)
                        // Assets change with the binary; always revalidate.
                        .insert_header((header::CACHE_CONTROL, "no-cache"))
                        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
                        .body(body)
                }),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_module_the_page_imports_is_served() {
        let served: Vec<&str> = ASSETS.iter().map(|a| a.path).collect();
        for asset in ASSETS.iter().filter(|a| a.content_type == JS) {
            let text = std::str::from_utf8(asset.body).expect("utf-8");
            for line in text.lines() {
                let line = line.trim();
                if !(line.starts_with("import ") || line.starts_with("} from ")) {
                    continue;
                }
                let Some(spec) = line.split(['\'', '"']).nth(1) else {
                    continue;
                };
                let path = spec.trim_start_matches('.');
                assert!(
                    served.contains(&path),
                    "{} imports {spec}, which is not embedded",
                    asset.path
                );
            }
        }
    }
}
