//! The storefront: a page that sells one flash sale the way a buyer sees it
//! — the sale's name, stock and status, a countdown on the service's clock,
//! a buy button that is enabled only while the sale is open, and every
//! answer of the purchase API in words (docs/storefront.md).
//!
//! Three files embedded in the binary (`storefront/`), plain HTML, CSS and
//! JavaScript with no build step and no framework; the page talks to the
//! public JSON API only, like any other client. It is served at `GET /` (a
//! form to open a sale by number) and at `GET /sales/{id}` for a browser
//! (see `crate::web::negotiate`). The answers forbid inline script and
//! any other origin (`Content-Security-Policy`), and carry an `ETag` so that
//! a reload costs a `304`.

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// The page, for `/` and `/sales/{id}` alike (it reads the sale from its URL).
const PAGE: &str = include_str!("storefront/index.html");
const SCRIPT: &str = include_str!("storefront/app.js");
const STYLE: &str = include_str!("storefront/style.css");

/// Same origin only, no inline script or style, no framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// FNV-1a, 64 bits (the offset basis and prime of the FNV reference,
/// draft-eastlake-fnv): a content hash for the `ETag` of an embedded file,
/// computed at compile time. Not a security hash; a validator only needs
/// the files of one build to differ when their bytes do.
const fn fnv1a(text: &str) -> u64 {
    let bytes = text.as_bytes();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    hash
}

/// An embedded file: its body, media type and content hash.
struct Asset {
    body: &'static str,
    content_type: &'static str,
    hash: u64,
}

const PAGE_ASSET: Asset =
    Asset { body: PAGE, content_type: "text/html; charset=utf-8", hash: fnv1a(PAGE) };
const SCRIPT_ASSET: Asset =
    Asset { body: SCRIPT, content_type: "text/javascript; charset=utf-8", hash: fnv1a(SCRIPT) };
const STYLE_ASSET: Asset =
    Asset { body: STYLE, content_type: "text/css; charset=utf-8", hash: fnv1a(STYLE) };

impl Asset {
    /// `200` with the file, or `304` when `If-None-Match` names its `ETag`;
    /// either way revalidated on every use (`no-cache`), which costs a `304`
    /// while the binary is the same.
    fn answer(&self, request: &HeaderMap) -> Response {
        let etag = format!("\"{:016x}\"", self.hash);
        let headers = [
            (header::ETAG, etag.clone()),
            (header::CACHE_CONTROL, "no-cache".to_owned()),
            (header::CONTENT_SECURITY_POLICY, CSP.to_owned()),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff".to_owned()),
            (header::REFERRER_POLICY, "no-referrer".to_owned()),
        ];
        if matches_etag(request.get(header::IF_NONE_MATCH), &etag) {
            return (StatusCode::NOT_MODIFIED, headers).into_response();
        }
        let mut response = (headers, self.body).into_response();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(self.content_type));
        response
    }
}

/// Whether `If-None-Match` lists `etag` or is `*` (RFC 9110, section
/// 13.1.2; weak comparison).
fn matches_etag(if_none_match: Option<&HeaderValue>, etag: &str) -> bool {
    let Some(value) = if_none_match.and_then(|v| v.to_str().ok()) else { return false };
    value.split(',').map(str::trim).any(|tag| tag == "*" || tag.trim_start_matches("W/") == etag)
}

/// The storefront page, answered to `request`.
pub fn page(request: &HeaderMap) -> Response {
    PAGE_ASSET.answer(request)
}

/// `GET /`: the storefront page; without a sale in its URL (`/sales/{id}`
/// or `/?sale={id}`) it asks for a sale number.
#[utoipa::path(
    get,
    path = "/",
    tag = "storefront",
    responses(
        (status = 200, description = "The storefront page", body = String,
            content_type = "text/html"),
        (status = 304, description = "Not modified (`If-None-Match`)"),
    ),
)]
pub async fn index(headers: HeaderMap) -> Response {
    page(&headers)
}

/// `GET /storefront/app.js`: the storefront's script.
#[utoipa::path(
    get,
    path = "/storefront/app.js",
    tag = "storefront",
    responses(
        (status = 200, description = "The storefront's script", body = String,
            content_type = "text/javascript"),
        (status = 304, description = "Not modified (`If-None-Match`)"),
    ),
)]
pub async fn script(headers: HeaderMap) -> Response {
    SCRIPT_ASSET.answer(&headers)
}

/// `GET /storefront/style.css`: the storefront's style sheet.
#[utoipa::path(
    get,
    path = "/storefront/style.css",
    tag = "storefront",
    responses(
        (status = 200, description = "The storefront's style sheet", body = String,
            content_type = "text/css"),
        (status = 304, description = "Not modified (`If-None-Match`)"),
    ),
)]
pub async fn style(headers: HeaderMap) -> Response {
    STYLE_ASSET.answer(&headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where the page loads its script and style from: the paths of
    /// [`script`] and [`style`].
    const SCRIPT_PATH: &str = "/storefront/app.js";
    const STYLE_PATH: &str = "/storefront/style.css";

    #[test]
    fn the_page_loads_its_own_script_and_style_and_nothing_else() {
        assert!(PAGE.contains(&format!("<script src=\"{SCRIPT_PATH}\" defer></script>")));
        assert!(PAGE.contains(&format!("<link rel=\"stylesheet\" href=\"{STYLE_PATH}\">")));
        assert_eq!(PAGE.matches("<script").count(), 1, "no inline script (the CSP forbids it)");
        assert!(!PAGE.contains("style=\""), "no inline style (the CSP forbids it)");
        for text in [PAGE, SCRIPT, STYLE] {
            assert!(!text.contains("http://") && !text.contains("https://"), "same origin only");
        }
    }

    #[test]
    fn a_known_etag_is_answered_not_modified() {
        let etag = format!("\"{:016x}\"", SCRIPT_ASSET.hash);
        let mut request = HeaderMap::new();
        assert_eq!(script_answer(&request).status(), StatusCode::OK);
        request.insert(header::IF_NONE_MATCH, HeaderValue::from_str(&etag).unwrap());
        assert_eq!(script_answer(&request).status(), StatusCode::NOT_MODIFIED);
        let weak = format!("\"other\", W/{etag}");
        request.insert(header::IF_NONE_MATCH, HeaderValue::from_str(&weak).unwrap());
        assert_eq!(script_answer(&request).status(), StatusCode::NOT_MODIFIED);
        request.insert(header::IF_NONE_MATCH, HeaderValue::from_static("\"other\""));
        assert_eq!(script_answer(&request).status(), StatusCode::OK);
        assert_ne!(PAGE_ASSET.hash, SCRIPT_ASSET.hash);
        assert_eq!(fnv1a(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a("a"), 0xaf63_dc4c_8601_ec8c, "the reference's test vector");
    }

    fn script_answer(request: &HeaderMap) -> Response {
        SCRIPT_ASSET.answer(request)
    }
}
