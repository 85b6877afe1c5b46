//! The shipped edge: `deploy/haproxy.cfg`, its addresses replaced by free
//! loopback ports, in front of two instances that trust it
//! (`SECKILL_TRUSTED_PROXIES`). Buyers buy through its public frontend, and
//! neither the admin routes nor `/metrics` answer there, even with the admin
//! token; operators reach the admin routes through its operators' frontend,
//! where each client's wrong tokens are counted apart.

use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::PgPool;
use test_support::{Haproxy, free_port};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{ADMIN_TOKEN, TestApp, assert_problem, client_from};

/// The file docker-compose.yml mounts into its `lb` service.
const SHIPPED: &str = include_str!("../../../deploy/haproxy.cfg");

/// The shipped HAProxy in front of two instances.
struct Edge {
    /// The buyers' frontend, `http://127.0.0.1:<port>`.
    public: String,
    /// The operators' frontend.
    operators: String,
    stats: String,
    apps: [TestApp; 2],
    db: PgPool,
    _haproxy: Haproxy,
}

impl Edge {
    async fn start() -> Edge {
        // The balancer connects to the instances from 127.0.0.1; clients of
        // the tests come from other loopback addresses ([`client_from`]).
        let trust = |config: &mut seckill::config::Config| {
            config.auth.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
        };
        // No metrics listener of their own: `/metrics` is on the main port,
        // behind the admin token, so that only the edge can keep it private.
        let apps = [TestApp::spawn_with(trust).await, TestApp::spawn_with(trust).await];
        let (public, operators, stats) = (free_port(), free_port(), free_port());
        let config = replaced_once(
            SHIPPED,
            &[
                ("bind :8080", format!("bind 127.0.0.1:{public}")),
                ("bind :8081", format!("bind 127.0.0.1:{operators}")),
                ("bind :8404", format!("bind 127.0.0.1:{stats}")),
                ("app-1:8080", apps[0].addr.to_string()),
                ("app-2:8080", apps[1].addr.to_string()),
            ],
        );
        let haproxy = Haproxy::start(&config, public).await;
        let db = apps[0].db.clone();
        Edge {
            public: format!("http://127.0.0.1:{public}"),
            operators: format!("http://127.0.0.1:{operators}"),
            stats: format!("http://127.0.0.1:{stats}/stats;csv"),
            apps,
            db,
            _haproxy: haproxy,
        }
    }

    /// Requests HAProxy passed to each instance so far, from its statistics.
    async fn requests_per_instance(&self) -> Vec<u64> {
        let csv = reqwest::get(&self.stats).await.unwrap().text().await.unwrap();
        let header: Vec<&str> =
            csv.lines().next().unwrap().trim_start_matches("# ").split(',').collect();
        let column = |name: &str| header.iter().position(|h| *h == name).unwrap();
        let (proxy, server, requests) = (column("pxname"), column("svname"), column("req_tot"));
        csv.lines()
            .skip(1)
            .map(|line| line.split(',').collect::<Vec<_>>())
            .filter(|f| f[proxy] == "replicas" && f[server].starts_with("app-"))
            .map(|f| f[requests].parse().unwrap_or(0))
            .collect()
    }

    async fn sales_named(&self, name: &str) -> i64 {
        let count = sqlx::query_scalar("SELECT count(*) FROM sales WHERE name = $1");
        count.bind(name).fetch_one(&self.db).await.unwrap()
    }
}

/// `text` with each `(from, to)` made, each `from` found exactly once: when
/// the shipped file changes shape, this test must be told, not pass by
/// testing something else.
fn replaced_once(text: &str, replacements: &[(&str, String)]) -> String {
    let mut text = text.to_owned();
    for (from, to) in replacements {
        assert_eq!(text.matches(from).count(), 1, "`{from}` once in deploy/haproxy.cfg");
        text = text.replace(from, to);
    }
    text
}

/// `POST /admin/sales` of a `sql` sale named `name` with `stock` units at
/// `base` with the admin token.
fn new_sale(
    client: &reqwest::Client,
    base: &str,
    name: &str,
    stock: i64,
) -> reqwest::RequestBuilder {
    let body = json!({ "name": name, "stock": stock, "strategy": "sql" });
    client.post(format!("{base}/admin/sales")).bearer_auth(ADMIN_TOKEN).json(&body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_the_shipped_balancer_buyers_buy_and_neither_admin_routes_nor_metrics_answer() {
    let edge = Edge::start().await;
    let client = client_from("127.0.0.2");
    let name = format!("edge {}", uuid::Uuid::new_v4());
    let created = new_sale(&client, &edge.operators, &name, 3).send().await.unwrap();
    assert_eq!(created.status(), StatusCode::CREATED, "through the operators' frontend");
    let sale = created.json::<Value>().await.unwrap()["id"].as_i64().unwrap();

    // The buyers' side: the storefront, the sale, six buyers for 3 units.
    for path in ["/".to_owned(), format!("/sales/{sale}"), "/openapi.json".to_owned()] {
        let page = client.get(format!("{}{path}", edge.public)).send().await.unwrap();
        assert_eq!(page.status(), StatusCode::OK, "{path}");
    }
    let mut statuses = Vec::new();
    for user in 1..=6 {
        let url = format!("{}/sales/{sale}/orders", edge.public);
        let answer = client.post(url).json(&json!({ "user_id": user })).send().await.unwrap();
        statuses.push(answer.status().as_u16());
    }
    statuses.sort();
    assert_eq!(statuses, [201, 201, 201, 409, 409, 409], "3 units, 6 buyers");
    let shares = edge.requests_per_instance().await;
    assert!(shares.len() == 2 && shares.iter().all(|&n| n >= 3), "round robin: {shares:?}");

    // Not on the public frontend, right token or not: the edge answers 404
    // and nothing reaches an instance.
    let refused = format!("refused {name}");
    let public_admin = new_sale(&client, &edge.public, &refused, 1).send().await.unwrap();
    assert_problem(public_admin, StatusCode::NOT_FOUND, "not-found").await;
    for path in [format!("/admin/sales/{sale}/audit"), "/metrics".to_owned(), "/healthz".to_owned()]
    {
        let url = format!("{}{path}", edge.public);
        let answer = client.get(url).bearer_auth(ADMIN_TOKEN).send().await.unwrap();
        assert_problem(answer, StatusCode::NOT_FOUND, "not-found").await;
    }
    // A dot segment under an allowed prefix reaches an instance as it is,
    // which routes no such path.
    let sneaked = raw_post(&edge.public, "/sales/../admin/sales", &refused).await;
    assert!(!sneaked.starts_with("HTTP/1.1 201"), "{sneaked}");
    assert_eq!(edge.sales_named(&refused).await, 0, "no sale was created through the edge");
    // The instances do serve `/metrics` to the token: the edge is what keeps
    // it private.
    let direct = format!("{}/metrics", edge.apps[0].base);
    let metrics = client.get(direct).bearer_auth(ADMIN_TOKEN).send().await.unwrap();
    assert_eq!(metrics.status(), StatusCode::OK);
    // The operators' frontend serves the admin routes only.
    let operators_metrics = format!("{}/metrics", edge.operators);
    let answer = client.get(operators_metrics).bearer_auth(ADMIN_TOKEN).send().await.unwrap();
    assert_problem(answer, StatusCode::NOT_FOUND, "not-found").await;
    let audit = format!("{}/admin/sales/{sale}/audit", edge.operators);
    let audit: Value =
        client.get(audit).bearer_auth(ADMIN_TOKEN).send().await.unwrap().json().await.unwrap();
    assert_eq!((audit["orders"].as_i64(), audit["oversold"].as_i64()), (Some(3), Some(0)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_the_shipped_balancer_wrong_tokens_lock_out_their_own_client_only() {
    let edge = Edge::start().await;
    let (guesser, operator) = (client_from("127.0.0.2"), client_from("127.0.0.3"));
    let name = format!("edge {}", uuid::Uuid::new_v4());
    let created = new_sale(&operator, &edge.operators, &name, 1).send().await.unwrap();
    let sale = created.json::<Value>().await.unwrap()["id"].as_i64().unwrap();
    let audit = format!("{}/admin/sales/{sale}/audit", edge.operators);
    // Each instance counts its own failures, and round robin alternates: the
    // guesser is refused by both once they have seen ten each.
    let mut refused_in_a_row = 0;
    for _ in 0..40 {
        let answer = guesser.get(&audit).bearer_auth("guess").send().await.unwrap();
        match answer.status() {
            StatusCode::FORBIDDEN => refused_in_a_row = 0,
            StatusCode::TOO_MANY_REQUESTS => refused_in_a_row += 1,
            other => panic!("a wrong token answered {other}"),
        }
        if refused_in_a_row == 2 {
            break;
        }
    }
    assert_eq!(refused_in_a_row, 2, "both instances block the guesser");
    // Two requests of each client in a row: one to each instance.
    for _ in 0..2 {
        let blocked = guesser.get(&audit).bearer_auth(ADMIN_TOKEN).send().await.unwrap();
        assert_problem(blocked, StatusCode::TOO_MANY_REQUESTS, "too-many-attempts").await;
    }
    // Another client behind the same balancer is not locked out.
    for _ in 0..2 {
        let other = operator.get(&audit).bearer_auth(ADMIN_TOKEN).send().await.unwrap();
        assert_eq!(other.status(), StatusCode::OK, "the operator, from another address");
    }
}

/// The head of the answer to `POST path` with the admin token and a sale
/// body, sent over a plain connection so that the path goes out as written
/// (an HTTP client would resolve its dot segments first).
async fn raw_post(base: &str, path: &str, name: &str) -> String {
    let authority = base.trim_start_matches("http://");
    let body = json!({ "name": name, "stock": 1, "strategy": "sql" }).to_string();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {authority}\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(authority).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    String::from_utf8_lossy(&answer).lines().next().unwrap_or("").to_owned()
}
