//! The storefront page in headless Chromium against a running service (the
//! browser is driven over the DevTools protocol, `test_support::Browser`):
//! a buyer buys from a `sql` sale and sees the order; from a `queue` sale
//! sees "queued", then the order once a consumer settles it; is told "sold
//! out" when someone else took the last unit; waits out a `503 busy` as its
//! `Retry-After` asks and then buys; sees a countdown that follows the
//! service's clock — not the browser's, which is set an hour ahead — and a
//! button that opens at the start; and an answer lost on the network is
//! retried without a second order. Behind a waiting room, a buyer joins the
//! line, sees the place and the wait, joins again by itself when the
//! service loses the place, is let in without a reload and buys with the
//! admission; or, waiting behind the buyer who takes the last unit, is told
//! "sold out" and stops asking. The page is read by what it shows
//! (`data-status`, `data-outcome`, `data-kind`, `data-state` and the text),
//! and each step leaves a screenshot in `target/screenshots/storefront-*.png`.
//!
//! Plus, without a browser: the content negotiation of `GET /sales/{id}`
//! (JSON stays the default), the page's files and their validators, and the
//! buyer's order route.

use std::path::PathBuf;
use std::time::Duration;

use chrono::{SecondsFormat, Utc};
use reqwest::StatusCode;
use seckill::config::Config;
use seckill::strategy::queue::Topology;
use serde_json::{Value, json};
use test_support::Browser;

use crate::support::TestApp;

/// How long a step of the page may take to show (the page reads the sale
/// every 2 s; a queued purchase is polled with `wait_ms`).
const STEP: Duration = Duration::from_secs(20);

const STATUS: &str = "document.getElementById('status').dataset.status";
const OUTCOME: &str = "document.getElementById('result').dataset.outcome";
const RESULT_TEXT: &str = "document.getElementById('result').textContent";
const NOTE_KIND: &str = "document.getElementById('note').dataset.kind";
const BUY_ENABLED: &str = "!document.getElementById('buy').disabled";
const STOCK_TEXT: &str = "document.getElementById('stock').textContent";
const BUY_TEXT: &str = "document.getElementById('buy').textContent";
const LINE_STATE: &str = "document.getElementById('line').dataset.state";
const LINE_HIDDEN: &str = "document.getElementById('line').hidden";
const POSITION: &str = "document.getElementById('position').textContent";
const WAIT_TEXT: &str = "document.getElementById('wait').textContent";
const TURN_TEXT: &str = "document.getElementById('turn').textContent";
/// How many times the page has asked for its place in line so far.
const LINE_ASKS: &str = "performance.getEntriesByType('resource')\
    .filter(e => /\\/line\\/\\d+$/.test(e.name)).length";

/// `target/screenshots/storefront-{name}.png`.
fn artifact(name: &str) -> PathBuf {
    let tmp = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent()
        .expect("target/tmp has a parent")
        .join("screenshots")
        .join(format!("storefront-{name}.png"))
}

/// A screenshot of the page as `name`, which must be a real picture.
async fn shoot(browser: &Browser, name: &str) {
    let bytes = browser.screenshot(&artifact(name)).await;
    assert!(bytes > 10_000, "the screenshot {name} is almost empty ({bytes} bytes)");
}

/// A browser on the storefront page of `sale`, once it shows the sale.
async fn open(app: &TestApp, sale: i64) -> Browser {
    let browser = Browser::start(900, 1000).await;
    browser.goto(&app.url(&format!("/sales/{sale}"))).await;
    browser.wait_for(&format!("{STATUS} !== 'loading'"), STEP).await;
    browser
}

/// Waits until the page shows `outcome`, and answers the result's text.
async fn outcome(browser: &Browser, outcome: &str) -> String {
    browser.wait_for(&format!("{OUTCOME} === '{outcome}'"), STEP).await;
    browser.eval(RESULT_TEXT).await.as_str().unwrap().to_owned()
}

/// Clicks the buy button, which must be enabled.
async fn click_buy(browser: &Browser) {
    let clicked = browser
        .eval(
            "(() => { const b = document.getElementById('buy'); if (b.disabled) return false; \
               b.click(); return true; })()",
        )
        .await;
    assert_eq!(clicked, true, "the buy button is enabled");
}

/// The buyer id the page buys as.
async fn buyer(browser: &Browser) -> i64 {
    let text = browser.eval("document.getElementById('buyer-id').textContent").await;
    text.as_str().and_then(|t| t.parse().ok()).expect("a numeric buyer id")
}

/// The order id `user` holds in `sale`, from Postgres.
async fn order_id(app: &TestApp, sale: i64, user: i64) -> i64 {
    sqlx::query_scalar("SELECT id FROM orders WHERE sale_id = $1 AND user_id = $2")
        .bind(sale)
        .bind(user)
        .fetch_one(&app.db)
        .await
        .expect("the buyer's order is in Postgres")
}

async fn sale(app: &TestApp, body: Value) -> i64 {
    app.create_sale(body).await["id"].as_i64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sql_sale_is_bought_with_the_keyboard_and_its_order_shown() {
    let app = TestApp::spawn().await;
    let sale =
        sale(&app, json!({ "name": "Launch sneakers", "stock": 5, "strategy": "sql" })).await;
    let browser = open(&app, sale).await;
    browser.wait_for(BUY_ENABLED, STEP).await;
    assert_eq!(browser.eval(STATUS).await, "open");
    assert_eq!(browser.eval(STOCK_TEXT).await, "5 of 5 left");
    assert_eq!(browser.eval("document.title").await, "Launch sneakers — flash sale");
    assert_eq!(browser.eval(BUY_TEXT).await, "Buy now");
    assert_eq!(browser.eval(LINE_HIDDEN).await, true, "no waiting room, no line");
    shoot(&browser, "sql-open").await;

    // The button is reached and pressed with the keyboard.
    browser.eval("document.getElementById('buy').focus()").await;
    for kind in ["keyDown", "keyUp"] {
        let key = json!({ "type": kind, "key": "Enter", "code": "Enter",
                          "windowsVirtualKeyCode": 13, "text": "\r" });
        browser.call("Input.dispatchKeyEvent", key).await;
    }
    let text = outcome(&browser, "placed").await;
    let user = buyer(&browser).await;
    let order = order_id(&app, sale, user).await;
    assert!(text.contains(&format!("Order #{order} placed")), "{text}");
    browser.wait_for(&format!("{STOCK_TEXT} === '4 of 5 left'"), STEP).await;
    assert_eq!(browser.eval(BUY_ENABLED).await, false, "one unit per buyer");
    shoot(&browser, "sql-placed").await;

    // A reload finds the order (the buyer id is kept in the browser).
    browser.goto(&app.url(&format!("/sales/{sale}"))).await;
    let text = outcome(&browser, "already-purchased").await;
    assert!(text.contains(&format!("order #{order}")), "{text}");
    assert_eq!(buyer(&browser).await, user);
    assert_eq!(app.audit(sale).await.orders, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_lost_on_the_network_is_retried_without_a_second_order() {
    let app = TestApp::spawn().await;
    let sale = sale(&app, json!({ "name": "Retry", "stock": 5, "strategy": "sql" })).await;
    let browser = open(&app, sale).await;
    browser.wait_for(BUY_ENABLED, STEP).await;
    // The service places the order, and its answer never reaches the page.
    browser.lose_answers(&format!("*/sales/{sale}/orders"), 1).await;
    click_buy(&browser).await;
    let text = outcome(&browser, "already-purchased").await;
    assert_eq!(browser.answers_lost(), 1);
    let order = order_id(&app, sale, buyer(&browser).await).await;
    assert!(text.contains(&format!("order #{order}")), "the retry shows the first order: {text}");
    let audit = app.audit(sale).await;
    assert_eq!((audit.orders, audit.units_sold), (1, 1), "never a double purchase");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_purchase_shows_queued_then_the_order_once_settled() {
    let prefix = test_support::unique_prefix();
    let queue_config = |consume: bool| {
        let prefix = prefix.clone();
        move |config: &mut Config| {
            config.backends.amqp_prefix = prefix;
            config.strategies.queue.partitions = 1;
            config.strategies.queue.consume = consume;
        }
    };
    // The page's instance runs no consumer: the purchase stays queued.
    let app = TestApp::spawn_with(queue_config(false)).await;
    let sale = sale(&app, json!({ "name": "Queued drop", "stock": 3, "strategy": "queue" })).await;
    let browser = open(&app, sale).await;
    browser.wait_for(BUY_ENABLED, STEP).await;
    click_buy(&browser).await;
    let text = outcome(&browser, "queued").await;
    assert!(text.contains("in the queue"), "{text}");
    shoot(&browser, "queue-queued").await;

    // A second instance with the consumer on settles it; the page, polling
    // the request with wait_ms, shows the order.
    let _consumer = TestApp::spawn_with(queue_config(true)).await;
    let text = outcome(&browser, "placed").await;
    let order = order_id(&app, sale, buyer(&browser).await).await;
    assert!(text.contains(&format!("Order #{order} placed")), "{text}");
    browser.wait_for(&format!("{STOCK_TEXT} === '2 of 3 left'"), STEP).await;
    shoot(&browser, "queue-placed").await;

    let config = Config::from_env();
    let topology = Topology::new(
        &prefix,
        1,
        config.strategies.queue.max_length,
        config.strategies.queue.delivery_limit,
    );
    topology.delete_at(&config.backends.amqp_url).await.expect("the test's queues are deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_unit_taken_by_someone_else_is_told_sold_out_on_a_phone() {
    let app = TestApp::spawn().await;
    let sale = sale(&app, json!({ "name": "Last pair", "stock": 1, "strategy": "sql" })).await;
    let browser = Browser::start(900, 1000).await;
    browser.emulate_phone(360, 740).await;
    browser.goto(&app.url(&format!("/sales/{sale}"))).await;
    browser.wait_for(BUY_ENABLED, STEP).await;
    let wider = "[...document.querySelectorAll('body *')].filter(e => \
                 e.getBoundingClientRect().right > window.innerWidth + 0.5) \
                 .map(e => `${e.tagName}#${e.id}.${e.className}`)";
    assert_eq!(browser.eval(wider).await, json!([]), "nothing wider than a phone");
    // The page keeps showing the sale open (its reads of the sale are lost
    // from now on) while another buyer takes the last unit.
    browser.lose_answers(&format!("*/sales/{sale}"), u32::MAX).await;
    assert_eq!(app.buy(sale, 1).await.status(), StatusCode::CREATED);
    click_buy(&browser).await;
    let text = outcome(&browser, "sold-out").await;
    assert!(text.starts_with("Sold out"), "{text}");
    assert_eq!(browser.eval(BUY_ENABLED).await, false);

    // Opened again, the page shows the sale sold out, its button off.
    let browser = Browser::start(900, 1000).await;
    browser.emulate_phone(360, 740).await;
    browser.goto(&app.url(&format!("/sales/{sale}"))).await;
    browser.wait_for(&format!("{STATUS} === 'sold_out'"), STEP).await;
    assert_eq!(browser.eval(BUY_ENABLED).await, false);
    assert_eq!(browser.eval(STOCK_TEXT).await, "0 of 1 left");
    shoot(&browser, "sold-out-phone").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_answer_is_retried_after_its_retry_after_and_then_placed() {
    let prefix = test_support::unique_prefix();
    let redis_prefix = prefix.clone();
    let app = TestApp::spawn_with(move |config| {
        config.backends.redis_prefix = redis_prefix;
        config.strategies.lock.wait_ms = 100;
    })
    .await;
    let sale = sale(&app, json!({ "name": "Busy", "stock": 3, "strategy": "lock/setnx" })).await;
    // Someone holds the sale's lock: a purchase waits 100 ms for it, then is
    // answered `503 busy` with `Retry-After: 1`.
    let redis = redis::Client::open(Config::from_env().backends.redis_url).unwrap();
    let mut redis = redis.get_multiplexed_async_connection().await.unwrap();
    let key = format!("{prefix}:{{sale:{sale}}}:lock:setnx");
    let _: () = redis::cmd("SET").arg(&key).arg(1).query_async(&mut redis).await.unwrap();

    let browser = open(&app, sale).await;
    browser.wait_for(BUY_ENABLED, STEP).await;
    click_buy(&browser).await;
    browser.wait_for(&format!("{NOTE_KIND} === 'busy'"), STEP).await;
    let note = browser.eval("document.getElementById('note').textContent").await;
    // Retry-After: 1, plus up to 25 % jitter, counted down in whole seconds.
    let note = note.as_str().unwrap();
    assert!(
        ["1", "2"].iter().any(|s| note.contains(&format!("busy — trying again in {s} s"))),
        "{note}"
    );
    shoot(&browser, "busy").await;
    assert_eq!(app.audit(sale).await.orders, 0, "nothing is bought while the lock is held");

    let _: () = redis::cmd("DEL").arg(&key).query_async(&mut redis).await.unwrap();
    let text = outcome(&browser, "placed").await;
    let order = order_id(&app, sale, buyer(&browser).await).await;
    assert!(text.contains(&format!("Order #{order} placed")), "{text}");
    assert_eq!(browser.eval(NOTE_KIND).await, "", "the note is gone");
    shoot(&browser, "busy-placed").await;
}

/// Sets the page's `Date` an hour ahead of the real time: a countdown that
/// used the browser's clock would find the sale long started.
const CLOCK_AN_HOUR_AHEAD: &str = "(() => { const Real = Date; const skew = 3600e3; \
    class Skewed extends Real { constructor(...a) { super(...(a.length ? a : [Real.now() + skew])); } \
    static now() { return Real.now() + skew; } } globalThis.Date = Skewed; })();";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_countdown_follows_the_services_clock_and_the_button_opens_at_the_start() {
    let app = TestApp::spawn().await;
    // Far enough ahead that a slow browser start still sees the countdown.
    let starts_at = Utc::now() + chrono::TimeDelta::seconds(8);
    let sale = sale(
        &app,
        json!({ "name": "Midnight drop", "stock": 2, "strategy": "sql",
                "starts_at": starts_at.to_rfc3339_opts(SecondsFormat::Millis, true) }),
    )
    .await;
    let browser = Browser::start(900, 1000).await;
    browser.before_every_document(CLOCK_AN_HOUR_AHEAD).await;
    browser.goto(&app.url(&format!("/sales/{sale}"))).await;
    let skewed = browser.eval("Date.now() - performance.timeOrigin - performance.now()").await;
    assert!(skewed.as_f64().unwrap() > 3_000_000.0, "the browser's clock is ahead: {skewed}");
    browser.wait_for(&format!("{STATUS} === 'not_started'"), STEP).await;
    let countdown = browser.eval("document.getElementById('countdown').textContent").await;
    let countdown = countdown.as_str().unwrap().to_owned();
    assert!((1..=8).any(|s| countdown == format!("Starts in 0:0{s}")), "{countdown}");
    assert_eq!(browser.eval(BUY_ENABLED).await, false, "closed before the start");
    shoot(&browser, "countdown").await;

    browser.wait_for(BUY_ENABLED, Duration::from_secs(15)).await;
    let opened = Utc::now();
    assert!(
        opened > starts_at - chrono::TimeDelta::milliseconds(500),
        "the button opened at {opened}, before the start {starts_at}"
    );
    assert_eq!(browser.eval(STATUS).await, "open");
    click_buy(&browser).await;
    outcome(&browser, "placed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_gets_the_page_and_every_other_client_the_json() {
    let app = TestApp::spawn().await;
    let sale = app.sale("sql", 3).await;
    let get = |path: String, accept: Option<&'static str>| {
        let mut request = app.client.get(app.url(&path));
        if let Some(accept) = accept {
            request = request.header("Accept", accept);
        }
        request.send()
    };
    let navigation = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";
    let page = get(format!("/sales/{sale}"), Some(navigation)).await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    assert_eq!(page.headers()["content-type"], "text/html; charset=utf-8");
    assert!(page.headers()["content-security-policy"].to_str().unwrap().contains("'self'"));
    let etag = page.headers()["etag"].clone();
    assert!(page.text().await.unwrap().contains("/storefront/app.js"));
    for accept in [None, Some("*/*"), Some("application/json")] {
        let answer = get(format!("/sales/{sale}"), accept).await.unwrap();
        assert_eq!(answer.headers()["content-type"], "application/json", "{accept:?}");
        assert_eq!(answer.headers()["cache-control"], "no-store");
        let body: Value = answer.json().await.unwrap();
        assert_eq!(
            (body["status"].as_str(), body["remaining_stock"].as_i64()),
            (Some("open"), Some(3))
        );
        let now = chrono::DateTime::parse_from_rfc3339(body["now"].as_str().unwrap()).unwrap();
        assert!((Utc::now() - now.to_utc()).abs() < chrono::TimeDelta::seconds(5), "{body}");
        assert!(body["starts_at"].is_null() && body["ends_at"].is_null(), "{body}");
    }
    for (path, kind) in [
        ("/", "text/html"),
        ("/storefront/app.js", "text/javascript"),
        ("/storefront/style.css", "text/css"),
    ] {
        let answer = get(path.to_owned(), None).await.unwrap();
        assert_eq!(answer.status(), StatusCode::OK, "{path}");
        assert!(answer.headers()["content-type"].to_str().unwrap().starts_with(kind), "{path}");
    }
    let again = app.client.get(app.url("/")).header("If-None-Match", etag).send().await.unwrap();
    assert_eq!(again.status(), StatusCode::NOT_MODIFIED, "the page is the same file at /");

    // The buyer's order: none, then the one a purchase placed.
    let order_path = format!("/sales/{sale}/buyers/42/order");
    assert_eq!(get(order_path.clone(), None).await.unwrap().status(), StatusCode::NOT_FOUND);
    let placed: Value = app.buy(sale, 42).await.json().await.unwrap();
    let order: Value = get(order_path, None).await.unwrap().json().await.unwrap();
    assert_eq!(order["order_id"], placed["order_id"]);
    assert_eq!((order["user_id"].as_i64(), order["quantity"].as_i64()), (Some(42), Some(1)));
    for path in [format!("/sales/{sale}/buyers/-1/order"), format!("/sales/{sale}/buyers/x/order")]
    {
        assert_eq!(
            get(path.clone(), None).await.unwrap().status(),
            StatusCode::NOT_FOUND,
            "{path}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_buyer_auth_on_the_page_buys_as_the_buyer_of_its_token_and_asks_for_one_without() {
    let app = TestApp::spawn_with(crate::support::with_buyer_auth).await;
    let sale = sale(&app, json!({ "name": "Members only", "stock": 5, "strategy": "sql" })).await;

    // Without a token: the buy is refused and the page asks to sign in.
    let anonymous = open(&app, sale).await;
    anonymous.wait_for(BUY_ENABLED, STEP).await;
    click_buy(&anonymous).await;
    let text = outcome(&anonymous, "sign-in").await;
    assert!(text.contains("Sign in to buy"), "{text}");
    drop(anonymous);

    // With a token in the fragment: the page buys as its `sub`, and the token
    // leaves the address bar.
    let browser = Browser::start(900, 1000).await;
    let token = crate::support::buyer_token(4242);
    browser.goto(&app.url(&format!("/sales/{sale}#token={token}"))).await;
    browser.wait_for(&format!("{STATUS} !== 'loading'"), STEP).await;
    assert_eq!(browser.eval("location.hash").await, "");
    assert_eq!(buyer(&browser).await, 4242);
    browser.wait_for(BUY_ENABLED, STEP).await;
    click_buy(&browser).await;
    let text = outcome(&browser, "placed").await;
    let order = order_id(&app, sale, 4242).await;
    assert!(text.contains(&format!("#{order}")), "{text}");
    shoot(&browser, "signed-in-placed").await;
    let audit = app.audit(sale).await;
    assert_eq!((audit.orders, audit.units_sold), (1, 1));
}

/// A sale of one unit behind a waiting room that lets one buyer in at a
/// time (the only permit), two a second at most, for a minute each: longer
/// than a test's steps, so that an admission only ends when a test says so.
async fn room_sale(app: &TestApp, name: &str) -> i64 {
    sale(
        app,
        json!({ "name": name, "stock": 1, "strategy": "sql",
                "waiting_room": { "admissions_per_s": 2, "concurrency": 1,
                                  "admission_ttl_ms": 60_000 } }),
    )
    .await
}

fn line_url(app: &TestApp, sale: i64, user: i64) -> String {
    app.url(&format!("/sales/{sale}/line/{user}"))
}

/// `user`'s place in `sale`'s line, as the API answers it: status and body.
async fn place(app: &TestApp, sale: i64, user: i64) -> (StatusCode, Value) {
    let answer = app.client.get(line_url(app, sale, user)).send().await.unwrap();
    let status = answer.status();
    (status, answer.json().await.unwrap_or(Value::Null))
}

/// `user` joins `sale`'s line through the API: status and place.
async fn join(app: &TestApp, sale: i64, user: i64) -> (StatusCode, Value) {
    let answer = app
        .client
        .post(app.url(&format!("/sales/{sale}/line")))
        .json(&json!({ "user_id": user }))
        .send()
        .await
        .unwrap();
    let status = answer.status();
    (status, answer.json().await.unwrap_or(Value::Null))
}

/// `user` leaves `sale`'s line (or gives up an admission) through the API.
async fn leave(app: &TestApp, sale: i64, user: i64) {
    let answer = app.client.delete(line_url(app, sale, user)).send().await.unwrap();
    assert_eq!(answer.status(), StatusCode::NO_CONTENT, "leaving the line");
}

/// `user` joins `sale`'s line through the API and asks for its place until
/// it is let in; answers the admission.
async fn admitted(app: &TestApp, sale: i64, user: i64) -> String {
    let (status, mut current) = join(app, sale, user).await;
    assert_eq!(status, StatusCode::OK, "joining the line: {current}");
    let deadline = tokio::time::Instant::now() + STEP;
    while current["state"] != "admitted" {
        assert_eq!(current["state"], "waiting", "{current}");
        assert!(tokio::time::Instant::now() < deadline, "never let in: {current}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (status, body) = place(app, sale, user).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        current = body;
    }
    current["admission"].as_str().expect("an admission token").to_owned()
}

/// A buyer of the API that asks for its place every 500 ms, as the page
/// does, so that the service keeps it; stops when dropped.
struct KeepsPlace(tokio::task::JoinHandle<()>);

impl KeepsPlace {
    fn start(app: &TestApp, sale: i64, user: i64) -> KeepsPlace {
        let (client, url) = (app.client.clone(), line_url(app, sale, user));
        KeepsPlace(tokio::spawn(async move {
            loop {
                let _ = client.get(&url).send().await;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }))
    }
}

impl Drop for KeepsPlace {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_waiting_room_the_page_waits_its_turn_in_line_and_buys_with_the_admission() {
    let app = TestApp::spawn().await;
    let sale = room_sale(&app, "Waiting room drop").await;
    // Ahead of the page: a buyer the line let in, who holds the only permit
    // and does not buy (an admitted buyer has left the line), and one who
    // waits in line.
    let (admitted_ahead, waiting_ahead) = (9_001, 9_002);
    admitted(&app, sale, admitted_ahead).await;
    let (status, first) = join(&app, sale, waiting_ahead).await;
    assert_eq!((status, first["position"].as_i64()), (StatusCode::OK, Some(1)), "{first}");
    let keeps_place = KeepsPlace::start(&app, sale, waiting_ahead);

    let browser = open(&app, sale).await;
    browser.wait_for(BUY_ENABLED, STEP).await;
    assert_eq!(browser.eval(BUY_TEXT).await, "Join the line");
    assert_eq!(browser.eval(LINE_HIDDEN).await, false);
    assert_eq!(browser.eval(LINE_STATE).await, "", "not in line yet");
    shoot(&browser, "room-join").await;
    // Gone if anything reloads the page from here on.
    browser.eval("window.sameDocument = true").await;

    click_buy(&browser).await;
    browser.wait_for(&format!("{LINE_STATE} === 'waiting' && {POSITION} === '2'"), STEP).await;
    assert_eq!(browser.eval(BUY_ENABLED).await, false, "no buying before the turn");
    assert_eq!(browser.eval(BUY_TEXT).await, "Waiting for your turn…");
    let wait = browser.eval(WAIT_TEXT).await;
    let wait = wait.as_str().unwrap();
    assert!(
        wait == "estimating…" || wait == "under a second" || wait.starts_with("about "),
        "{wait}"
    );
    let user = buyer(&browser).await;
    let (status, mine) = place(&app, sale, user).await;
    assert_eq!((status, mine["position"].as_i64()), (StatusCode::OK, Some(2)), "{mine}");
    shoot(&browser, "room-waiting").await;

    // The service loses the page's place (as when Redis loses the line): the
    // page joins again by itself, at the back, and says so.
    leave(&app, sale, user).await;
    browser.wait_for(&format!("{LINE_STATE} === 'rejoined' && {POSITION} === '2'"), STEP).await;
    let status_text = browser.eval("document.getElementById('line-status').textContent").await;
    assert!(status_text.as_str().unwrap().contains("joined the line again"), "{status_text}");
    shoot(&browser, "room-rejoined").await;

    // The buyer waiting ahead leaves: the page moves up, without a reload.
    drop(keeps_place);
    leave(&app, sale, waiting_ahead).await;
    browser.wait_for(&format!("{POSITION} === '1'"), STEP).await;
    assert_eq!(
        browser.eval("document.getElementById('ahead').textContent").await,
        " — you're next"
    );
    // The admitted buyer gives the permit up: the page's buyer is let in,
    // with a countdown of the admission's minute.
    leave(&app, sale, admitted_ahead).await;
    browser.wait_for(&format!("{LINE_STATE} === 'admitted'"), STEP).await;
    assert_eq!(browser.eval("window.sameDocument === true").await, true, "no reload");
    browser.wait_for(BUY_ENABLED, STEP).await;
    assert_eq!(browser.eval(BUY_TEXT).await, "Buy now");
    let turn = browser.eval(TURN_TEXT).await;
    let turn = turn.as_str().unwrap();
    assert!(
        turn == "Your turn: 1:00 left to buy"
            || (45..=59).any(|s| turn == format!("Your turn: 0:{s} left to buy")),
        "{turn}"
    );
    shoot(&browser, "room-admitted").await;

    click_buy(&browser).await;
    let text = outcome(&browser, "placed").await;
    let order = order_id(&app, sale, user).await;
    assert!(text.contains(&format!("Order #{order} placed")), "{text}");
    assert_eq!(browser.eval(LINE_HIDDEN).await, true, "the line is behind the buyer");
    browser.wait_for(&format!("{STOCK_TEXT} === '0 of 1 left'"), STEP).await;
    shoot(&browser, "room-placed").await;
    let audit = app.audit(sale).await;
    assert_eq!((audit.orders, audit.units_sold), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buyer_waiting_in_line_is_told_sold_out_when_the_buyer_ahead_takes_the_last_unit() {
    let app = TestApp::spawn().await;
    let sale = room_sale(&app, "Last one, in line").await;
    let ahead = 9_003;
    let admission = admitted(&app, sale, ahead).await;

    let browser = open(&app, sale).await;
    browser.wait_for(BUY_ENABLED, STEP).await;
    click_buy(&browser).await;
    browser.wait_for(&format!("{LINE_STATE} === 'waiting' && {POSITION} === '1'"), STEP).await;
    shoot(&browser, "room-behind").await;

    // The buyer ahead takes the last unit with its admission.
    let bought = app.order(sale, json!({ "user_id": ahead, "admission": admission })).await;
    assert_eq!(bought.status(), StatusCode::CREATED);
    let at = tokio::time::Instant::now();
    browser.wait_for(&format!("{LINE_STATE} === 'sold_out'"), STEP).await;
    // The page asks for its place every 500 ms; its reads of the sale come
    // every 2 s and do not set the line's state.
    let took = at.elapsed();
    assert!(took < Duration::from_secs(3), "sold out reached the page after {took:?}");
    let text = outcome(&browser, "sold-out").await;
    assert!(text.starts_with("Sold out"), "{text}");
    assert_eq!(browser.eval(BUY_ENABLED).await, false);
    browser.wait_for(&format!("{STATUS} === 'sold_out'"), STEP).await;

    // Sold out is final: the page stops asking for its place.
    let asked = browser.eval(LINE_ASKS).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(browser.eval(LINE_ASKS).await, asked, "no asking after sold out");
    assert_eq!(browser.eval(LINE_STATE).await, "sold_out");
    shoot(&browser, "room-sold-out").await;
    let audit = app.audit(sale).await;
    assert_eq!((audit.orders, audit.units_sold), (1, 1));
}
