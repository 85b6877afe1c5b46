//! The OpenAPI 3.1 document of the API, served at `GET /openapi.json`.
//!
//! It is generated, not written. Every route is mounted with
//! `utoipa_axum::routes!` from a handler annotated `#[utoipa::path]` (path,
//! method, parameters, request body, the answers particular to it), so the
//! router and the document are built by the same calls; the bodies are the
//! handlers' own types, which derive `utoipa::ToSchema` with the limits the
//! handlers check. [`finish`] then adds what routes share, by the same rules
//! as `crate::web`'s error mapping: which problem answers each kind of route
//! can give, the admin token, and — when buyer authentication is on — the
//! buyer token of the buyer routes. The document describes the service as
//! configured: with buyer authentication off its buyer routes declare no
//! security (they need none).

use axum::Extension;
use axum::body::Bytes;
use axum::http::header;
use axum::response::IntoResponse;
use utoipa::OpenApi;
use utoipa::openapi::path::{Operation, ParameterIn, PathItem};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{
    ContentBuilder, HeaderBuilder, Ref, RefOr, Response, ResponseBuilder, Schema, Type,
};

use crate::web::Problem;

/// The document before the routes are added: what the API is, its tags, and
/// the problem schema every error answer uses.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "seckill",
        description = "Flash-sale service with interchangeable stock-deduction strategies. \
            Every error is an RFC 9457 problem document (`application/problem+json`) whose \
            `type` is stable per kind of failure. Routes under `/admin/` need \
            `Authorization: Bearer <SECKILL_ADMIN_TOKEN>`; with buyer authentication on \
            (`SECKILL_BUYER_AUTH`), the buyer routes under `/sales/{id}/` need \
            `Authorization: Bearer <buyer token>`, a JWT whose `sub` is the buyer's user id.",
        license(name = "MIT OR Apache-2.0")
    ),
    tags(
        (name = "sales", description = "Buying: a sale's stock, purchases and their results"),
        (name = "orders", description = "An order's status, its payment and its cancel"),
        (name = "admin", description = "Creating, restocking and auditing sales (bearer token)"),
        (name = "operations", description = "Liveness, readiness, metrics and this document"),
        (name = "storefront", description = "The storefront page and its files (for browsers)"),
    ),
    components(schemas(Problem))
)]
pub struct ApiDoc;

/// The problem answers routes share: status, component name, what it means.
/// `crate::web::AppError` is the one place they are produced.
const PROBLEMS: &[(&str, &str, &str)] = &[
    ("400", "MalformedRequest", "`malformed-request`: the body is not JSON"),
    (
        "401",
        "Unauthorized",
        "`unauthorized`: no bearer token, or a buyer token that is invalid or expired \
         (`WWW-Authenticate: Bearer`)",
    ),
    (
        "403",
        "Forbidden",
        "`forbidden`: a wrong admin token; or `buyer-mismatch`: a purchase whose `user_id` is \
         not the buyer token's `sub`",
    ),
    ("404", "NotFound", "`not-found`: no such sale or request (the path is never echoed)"),
    ("413", "PayloadTooLarge", "`payload-too-large`: a body over 16 KiB"),
    (
        "429",
        "TooManyAttempts",
        "`too-many-attempts`: this client address sent 10 wrong admin tokens within a \
         minute; `Retry-After` says when the minute ends",
    ),
    (
        "415",
        "UnsupportedMediaType",
        "`unsupported-media-type`: no `Content-Type: application/json`; or \
         `unsupported-encoding`: a `Content-Encoding` other than `identity` \
         (`Accept-Encoding: identity`)",
    ),
    (
        "422",
        "InvalidField",
        "`invalid-field`: a body that is not a JSON object, or a field or query parameter \
         missing, unknown, of the wrong type or out of range; `detail` names it",
    ),
    ("500", "Internal", "`internal`: a bug; the details are logged, not returned"),
    (
        "503",
        "Unavailable",
        "`busy`: back-pressure (a lock wait ran out, a full queue, every Postgres connection \
         in use, too many open connections); or `unavailable`: a backing server is down, \
         named in `backend`. `Retry-After` says when to retry. Or `misconfigured`: the \
         server named in `backend` refuses this service's account or rights (no \
         `Retry-After`: retrying does not help until an operator corrects it)",
    ),
    (
        "504",
        "Timeout",
        "`timeout`: no answer within `SECKILL_REQUEST_TIMEOUT_MS`; what the request started \
         may still complete, and a retry is safe",
    ),
];

/// Name of the admin token's security scheme.
const BEARER: &str = "bearer";

/// Name of the buyer token's security scheme (declared only when buyer
/// authentication is on).
const BUYER: &str = "buyer";

/// `document` with what its routes share: the [`PROBLEMS`] as response
/// components, and on each operation the ones it can answer — `500`, `503`
/// and `504` on every route (a panic, the connection cap or a backing
/// server, the request timeout); `400`, `413`, `415` and `422` on a route
/// with a body; `422` on one with query parameters; `404` on one with path
/// parameters; `401`, `403` and `429`, and the bearer token, under `/admin/`
/// and on every route that declares the token (`/metrics`); with
/// `buyer_auth`, `401` and the buyer token on the buyer routes (every route
/// under `/sales/{id}/`), and `403` on the purchase.
pub fn finish(
    mut document: utoipa::openapi::OpenApi,
    buyer_auth: bool,
) -> utoipa::openapi::OpenApi {
    let components = document.components.get_or_insert_with(Default::default);
    for &(status, name, description) in PROBLEMS {
        components.responses.insert(name.to_owned(), RefOr::T(problem(status, description)));
    }
    let scheme = SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer));
    components.security_schemes.insert(BEARER.to_owned(), RefOr::T(scheme));
    if buyer_auth {
        let mut jwt = Http::new(HttpAuthScheme::Bearer);
        jwt.bearer_format = Some("JWT".to_owned());
        jwt.description = Some(
            "A buyer token: a JWT whose `sub` is the buyer's user id and whose `exp` is checked"
                .to_owned(),
        );
        components.security_schemes.insert(BUYER.to_owned(), RefOr::T(SecurityScheme::Http(jwt)));
    }
    for (path, item) in document.paths.paths.iter_mut() {
        for operation in operations(item) {
            let mut shared = vec!["500", "503", "504"];
            if operation.request_body.is_some() {
                shared.extend(["400", "413", "415", "422"]);
            }
            if has_parameter(operation, ParameterIn::Query) {
                shared.push("422");
            }
            if has_parameter(operation, ParameterIn::Path) {
                shared.push("404");
            }
            if path.starts_with("/admin/") || operation.security.is_some() {
                shared.extend(["401", "403", "429"]);
                let token = SecurityRequirement::new(BEARER, Vec::<String>::new());
                operation.security = Some(vec![token]);
            }
            if buyer_auth && is_buyer_route(path) {
                shared.push("401");
                if operation.request_body.is_some() {
                    shared.push("403");
                }
                let token = SecurityRequirement::new(BUYER, Vec::<String>::new());
                operation.security = Some(vec![token]);
            }
            for status in shared {
                let name = PROBLEMS.iter().find(|(s, ..)| *s == status).expect("listed").1;
                let answer = RefOr::Ref(Ref::from_response_name(name));
                operation.responses.responses.entry(status.to_owned()).or_insert(answer);
            }
        }
    }
    document
}

/// Whether `path` acts for a buyer: every route below a sale,
/// `/sales/{id}/…` (the purchase, a request's result, a buyer's order), not
/// the sale itself, and every order route, `/orders/{id}…`.
fn is_buyer_route(path: &str) -> bool {
    path.strip_prefix("/sales/{id}/").is_some_and(|rest| !rest.is_empty())
        || path.starts_with("/orders/")
}

/// The operations of one path, whatever their method.
fn operations(item: &mut PathItem) -> impl Iterator<Item = &mut Operation> {
    [
        &mut item.get,
        &mut item.put,
        &mut item.post,
        &mut item.delete,
        &mut item.options,
        &mut item.head,
        &mut item.patch,
        &mut item.trace,
    ]
    .into_iter()
    .filter_map(Option::as_mut)
}

/// Whether `operation` has a parameter in `location`.
fn has_parameter(operation: &Operation, location: ParameterIn) -> bool {
    operation.parameters.iter().flatten().any(|parameter| match parameter {
        RefOr::T(parameter) => parameter.parameter_in == location,
        RefOr::Ref(_) => false,
    })
}

/// A problem answer: `application/problem+json` with the [`Problem`] schema,
/// and the headers its status carries.
fn problem(status: &str, description: &str) -> Response {
    let content = ContentBuilder::new().schema(Some(Ref::from_schema_name("Problem"))).build();
    let mut answer = ResponseBuilder::new()
        .description(description)
        .content("application/problem+json", content);
    let string = || Schema::Object(utoipa::openapi::Object::with_type(Type::String));
    let header = match status {
        "401" => Some(("WWW-Authenticate", "`Bearer`")),
        "503" => Some(("Retry-After", "Whole seconds to wait before retrying")),
        "415" => Some(("Accept-Encoding", "`identity`, for an unsupported content coding")),
        _ => None,
    };
    if let Some((name, about)) = header {
        answer = answer.header(
            name,
            HeaderBuilder::new().schema(Some(string())).description(Some(about)).build(),
        );
    }
    answer.build()
}

/// The finished document as served, serialized once.
#[derive(Clone)]
pub struct Served(Bytes);

impl Served {
    pub fn new(document: &utoipa::openapi::OpenApi) -> Self {
        Self(Bytes::from(document.to_json().expect("the document serializes")))
    }
}

/// `GET /openapi.json`: this document.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "operations",
    responses((status = 200, description = "The OpenAPI 3.1 document of this API",
        body = Object, content_type = "application/json")),
)]
pub async fn openapi_json(Extension(served): Extension<Served>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], served.0)
}
