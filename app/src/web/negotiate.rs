//! Content negotiation between the API's JSON and the storefront's HTML on
//! a route that serves both (`GET /sales/{id}`): JSON stays the default, so
//! that every API client — one that sends no `Accept`, `*/*`, or
//! `application/json` — gets what it got before; a browser, whose navigation
//! asks for `text/html` by name, gets the page.
//!
//! The rule is RFC 9110, section 12.5.1, as `headers-accept` implements it:
//! the header's ranges are ordered most specific first (`text/html` before
//! `text/*` before `*/*`), then by quality (`q`, default 1, a malformed one
//! read as 1); each served type takes the quality of the first range in
//! that order that matches it. The higher quality wins; between equal
//! qualities, the type whose range comes first in that order (so
//! `*/*, text/html` is the page: the client named it), and when one range
//! matches both (`*/*`) the server's order, which puts JSON first. A header
//! that does not parse is no preference: JSON.

use std::str::FromStr;

use axum::http::{HeaderMap, header};
use headers_accept::Accept;
use mediatype::MediaType;
use mediatype::names::{APPLICATION, HTML, JSON, TEXT};

const APPLICATION_JSON: MediaType<'static> = MediaType::new(APPLICATION, JSON);
const TEXT_HTML: MediaType<'static> = MediaType::new(TEXT, HTML);
/// What the route serves, in the server's order of preference.
const SERVED: [MediaType<'static>; 2] = [APPLICATION_JSON, TEXT_HTML];

/// Whether the `Accept` header(s) prefer `text/html` to `application/json`.
pub fn prefers_html(headers: &HeaderMap) -> bool {
    let accept: Vec<&str> =
        headers.get_all(header::ACCEPT).iter().filter_map(|v| v.to_str().ok()).collect();
    Accept::from_str(&accept.join(","))
        .ok()
        .and_then(|accept| accept.negotiate(&SERVED).cloned())
        .is_some_and(|chosen| chosen == TEXT_HTML)
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn accept(value: &'static str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::ACCEPT, HeaderValue::from_static(value));
        headers
    }

    #[test]
    fn a_browser_navigation_gets_the_page() {
        // Chromium's and Firefox's navigation headers.
        let chromium = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,\
                        image/webp,image/apng,*/*;q=0.8,application/signed-exchange;v=b3;q=0.7";
        let firefox = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";
        assert!(prefers_html(&accept(chromium)));
        assert!(prefers_html(&accept(firefox)));
        assert!(prefers_html(&accept("text/html")));
        assert!(prefers_html(&accept("TEXT/*;q=0.9, application/json;q=0.5")));
    }

    #[test]
    fn api_clients_keep_getting_json() {
        assert!(!prefers_html(&HeaderMap::new()), "no Accept");
        assert!(!prefers_html(&accept("*/*")), "curl");
        assert!(!prefers_html(&accept("application/json")));
        assert!(!prefers_html(&accept("application/json, text/html")), "a tie, JSON first");
        assert!(!prefers_html(&accept("text/html;q=0.5, application/json")));
        assert!(!prefers_html(&accept("text/html;q=0, */*")), "html refused");
        assert!(!prefers_html(&accept("garbage, ,;;")), "no preference");
        assert!(!prefers_html(&accept("image/png")), "neither: the route's default");
    }

    #[test]
    fn the_most_specific_range_sets_the_quality() {
        assert!(prefers_html(&accept("text/*;q=0.3, text/html;q=0.7, application/json;q=0.5")));
        assert!(!prefers_html(&accept("text/html;q=0.3, text/*;q=0.7, application/json;q=0.5")));
        assert!(!prefers_html(&accept("*/*;q=0.9, application/json;q=0.2, text/html;q=0.1")));
    }

    #[test]
    fn between_equal_qualities_the_more_specific_then_the_first_listed_range_wins() {
        assert!(prefers_html(&accept("text/html, application/json")));
        assert!(!prefers_html(&accept("application/json;q=0.8, text/html;q=0.8")));
        assert!(prefers_html(&accept("*/*, text/html")), "the client named the page");
    }
}
