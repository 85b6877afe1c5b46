//! Content negotiation between the API's JSON and the storefront's HTML on
//! a route that serves both (`GET /sales/{id}`): JSON stays the default, so
//! that every API client — one that sends no `Accept`, `*/*`, or
//! `application/json` — gets what it got before; a browser, whose navigation
//! asks for `text/html` by name, gets the page.
//!
//! The rule is RFC 9110, section 12.5.1, reduced to the two types in play:
//! each type gets the quality (`q`, default 1) of the most specific media
//! range that matches it (`text/html` before `text/*` before `*/*`), and the
//! page is served only when `text/html` is strictly preferred to
//! `application/json`. A tie goes to JSON.

use axum::http::{HeaderMap, header};

/// Whether the `Accept` header(s) prefer `text/html` to `application/json`.
pub fn prefers_html(headers: &HeaderMap) -> bool {
    let accept: Vec<&str> =
        headers.get_all(header::ACCEPT).iter().filter_map(|v| v.to_str().ok()).collect();
    let accept = accept.join(",");
    quality(&accept, "text", "html") > quality(&accept, "application", "json")
}

/// The quality `accept` gives `kind/subtype`, in thousandths (RFC 9110's
/// `qvalue` has three decimals): that of the most specific matching range,
/// 0 when none matches; 0 as well for an empty header (no preference is
/// read as "JSON", the default, by the caller's strict comparison).
fn quality(accept: &str, kind: &str, subtype: &str) -> u32 {
    let mut best: Option<(u8, u32)> = None;
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let Some((range_kind, range_subtype)) = parts.next().and_then(|m| m.split_once('/')) else {
            continue;
        };
        let specificity = match (range_kind, range_subtype) {
            (k, s) if k.eq_ignore_ascii_case(kind) && s.eq_ignore_ascii_case(subtype) => 2,
            (k, "*") if k.eq_ignore_ascii_case(kind) => 1,
            ("*", "*") => 0,
            _ => continue,
        };
        let q = parts
            .filter_map(|p| p.split_once('='))
            .find(|(name, _)| name.trim().eq_ignore_ascii_case("q"))
            .map_or(1000, |(_, value)| thousandths(value.trim()));
        if best.is_none_or(|(s, _)| specificity > s) {
            best = Some((specificity, q));
        }
    }
    best.map_or(0, |(_, q)| q)
}

/// A `qvalue` (`0`, `0.5`, `1.000`) in thousandths; a malformed one is 0.
fn thousandths(value: &str) -> u32 {
    value.parse::<f64>().ok().filter(|q| (0.0..=1.0).contains(q)).map_or(0, |q| {
        // Three decimals at most: the rounding is exact.
        (q * 1000.0).round() as u32
    })
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
        assert!(!prefers_html(&accept("application/json, text/html")), "a tie is JSON");
        assert!(!prefers_html(&accept("text/html;q=0.5, application/json")));
        assert!(!prefers_html(&accept("text/html;q=0, */*")), "html refused");
        assert!(!prefers_html(&accept("text/html;q=banana")), "a malformed q is 0");
        assert!(!prefers_html(&accept("garbage, ,;;")));
    }

    #[test]
    fn the_most_specific_range_sets_the_quality() {
        assert_eq!(quality("text/*;q=0.3, text/html;q=0.7, */*", "text", "html"), 700);
        assert_eq!(quality("text/*;q=0.3, */*", "text", "html"), 300);
        assert_eq!(quality("*/*;q=0.25", "application", "json"), 250);
        assert_eq!(quality("image/png", "application", "json"), 0);
    }
}
