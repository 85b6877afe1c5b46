//! Headless Chromium driven over the Chrome DevTools Protocol (CDP), for
//! tests of pages in a real browser: open a URL, evaluate JavaScript in the
//! page, wait for a condition of the page, take a screenshot, run a script
//! before every page's own, emulate a phone's screen, and make the network
//! fail chosen answers after the server sent them.
//!
//! The protocol is JSON over a WebSocket
//! (<https://chromedevtools.github.io/devtools-protocol/>): Chromium is
//! started with `--remote-debugging-port=0` and writes the port it chose
//! into `DevToolsActivePort` in its profile directory; the test attaches to
//! the first page target with a flat session and sends commands (`id`,
//! `method`, `params`, `sessionId`) whose answers carry the same `id`. A
//! reader task sorts the answers from the events; the one event handled is
//! `Fetch.requestPaused`, answered at once (failed or continued).
//!
//! Chromium is required: without it the helper panics with how to install
//! it (Debian's `chromium` package; `CHROMIUM` names another binary).
//!
//! Our own client rather than a maintained one (`chromiumoxide`): that crate
//! generates the whole protocol's types, and it added about 850 s to a cold
//! build of the tests (timed on a loaded machine) for the few commands and
//! the one event used here.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use futures_util::stream::SplitSink;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// How long one CDP command may take to be answered.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// The Chromium binary: `CHROMIUM`, else the first of `chromium`,
/// `chromium-browser`, `google-chrome` on the `PATH`. Panics when none is
/// found.
pub fn chromium() -> PathBuf {
    if let Some(path) = std::env::var_os("CHROMIUM") {
        return PathBuf::from(path);
    }
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        if let Ok(out) = Command::new("which").arg(name).output()
            && out.status.success()
        {
            return PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        }
    }
    panic!(
        "headless Chromium is required for this test and was not found; install Debian's \
         `chromium` package (`apt-get install -y chromium`) or set CHROMIUM"
    );
}

/// The command-line flags of a quiet headless Chromium that fetches nothing
/// by itself.
pub const HEADLESS_FLAGS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
];

type Sink = SplitSink<WebSocketStream<MaybeTlsStream<TcpStream>>, Message>;

/// What the test and the reader task share.
struct Connection {
    sink: tokio::sync::Mutex<Sink>,
    pending: Mutex<HashMap<u64, oneshot::Sender<Value>>>,
    next_id: AtomicU64,
    /// Paused answers still to fail (then the rest are continued).
    to_fail: AtomicU32,
    /// Answers failed so far.
    failed: AtomicU32,
}

impl Connection {
    /// Sends `method` (to the page session `session`, or to the browser)
    /// and answers its `result`; panics on an error answer or none within
    /// [`COMMAND_TIMEOUT`].
    async fn call(&self, session: Option<&str>, method: &str, params: Value) -> Value {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap().insert(id, tx);
        let mut message = json!({ "id": id, "method": method, "params": params });
        if let Some(session) = session {
            message["sessionId"] = json!(session);
        }
        let sent = self.sink.lock().await.send(Message::text(message.to_string())).await;
        sent.unwrap_or_else(|err| panic!("sending {method} to Chromium: {err}"));
        let answer = tokio::time::timeout(COMMAND_TIMEOUT, rx)
            .await
            .unwrap_or_else(|_| panic!("Chromium did not answer {method} within 30 s"))
            .unwrap_or_else(|_| panic!("Chromium closed the connection during {method}"));
        if let Some(error) = answer.get("error") {
            panic!("Chromium refused {method}: {error}");
        }
        answer["result"].clone()
    }
}

/// A headless Chromium with one page, killed (and its profile removed) on
/// drop.
pub struct Browser {
    child: Child,
    profile: PathBuf,
    connection: Arc<Connection>,
    session: String,
    reader: tokio::task::JoinHandle<()>,
}

impl Browser {
    /// Starts Chromium with a window of `width × height` CSS pixels and
    /// attaches to its blank page.
    pub async fn start(width: u32, height: u32) -> Browser {
        let profile = std::env::temp_dir().join(format!("cdp-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&profile).expect("a profile directory");
        let child = Command::new(chromium())
            .args(HEADLESS_FLAGS)
            .arg("--remote-debugging-port=0")
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg(format!("--window-size={width},{height}"))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("Chromium starts");
        let endpoint = devtools_endpoint(&profile).await;
        let (socket, _) = tokio_tungstenite::connect_async(endpoint.as_str())
            .await
            .expect("a WebSocket to Chromium's DevTools endpoint");
        let (sink, mut stream) = socket.split();
        let connection = Arc::new(Connection {
            sink: tokio::sync::Mutex::new(sink),
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            to_fail: AtomicU32::new(0),
            failed: AtomicU32::new(0),
        });
        let shared = connection.clone();
        let reader = tokio::spawn(async move {
            while let Some(Ok(message)) = stream.next().await {
                let Message::Text(text) = message else { continue };
                let Ok(message) = serde_json::from_str::<Value>(&text) else { continue };
                if let Some(id) = message["id"].as_u64() {
                    if let Some(tx) = shared.pending.lock().unwrap().remove(&id) {
                        let _ = tx.send(message);
                    }
                } else if message["method"] == "Fetch.requestPaused" {
                    // Answered from a task of its own: this one must go on
                    // reading to receive the answer.
                    tokio::spawn(answer_paused(shared.clone(), message));
                }
            }
        });
        let targets = connection.call(None, "Target.getTargets", json!({})).await;
        let page = targets["targetInfos"]
            .as_array()
            .and_then(|targets| targets.iter().find(|t| t["type"] == "page"))
            .expect("Chromium has a page")["targetId"]
            .clone();
        let attached = connection
            .call(None, "Target.attachToTarget", json!({ "targetId": page, "flatten": true }))
            .await;
        let session = attached["sessionId"].as_str().expect("a session id").to_owned();
        let browser = Browser { child, profile, connection, session, reader };
        browser.call("Page.enable", json!({})).await;
        browser
    }

    /// Sends a CDP command to the page and answers its result.
    pub async fn call(&self, method: &str, params: Value) -> Value {
        self.connection.call(Some(&self.session), method, params).await
    }

    /// Opens `url` and waits until its document has loaded.
    pub async fn goto(&self, url: &str) {
        self.call("Page.navigate", json!({ "url": url })).await;
        self.wait_for(
            "document.readyState === 'complete' && location.href !== 'about:blank'",
            Duration::from_secs(30),
        )
        .await;
    }

    /// The value of the JavaScript `expression` in the page (a promise is
    /// awaited); panics when it throws.
    pub async fn eval(&self, expression: &str) -> Value {
        let params = json!({ "expression": expression, "awaitPromise": true,
                             "returnByValue": true });
        let result = self.call("Runtime.evaluate", params).await;
        if let Some(exception) = result.get("exceptionDetails") {
            panic!("{expression} threw: {exception}");
        }
        result["result"]["value"].clone()
    }

    /// Evaluates `expression` every 50 ms until its value is truthy, and
    /// answers it; panics after `within`, with the page's text.
    pub async fn wait_for(&self, expression: &str, within: Duration) -> Value {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let value = self.eval(expression).await;
            let truthy = match &value {
                Value::Null => false,
                Value::Bool(b) => *b,
                Value::Number(n) => n.as_f64() != Some(0.0),
                Value::String(s) => !s.is_empty(),
                _ => true,
            };
            if truthy {
                return value;
            }
            if tokio::time::Instant::now() >= deadline {
                let text = self.eval("document.body ? document.body.innerText : ''").await;
                panic!("`{expression}` did not hold within {within:?}; the page says:\n{text}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Writes a PNG of the page's viewport to `path` (its directory is
    /// created) and answers its size in bytes.
    pub async fn screenshot(&self, path: &Path) -> usize {
        let shot = self.call("Page.captureScreenshot", json!({ "format": "png" })).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().expect("screenshot data"))
            .expect("base64 screenshot");
        assert!(png.starts_with(b"\x89PNG"), "the screenshot is a PNG");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("the screenshot's directory");
        }
        std::fs::write(path, &png).expect("writing the screenshot");
        png.len()
    }

    /// Runs `source` in every document the page opens from now on, before
    /// the document's own scripts.
    pub async fn before_every_document(&self, source: &str) {
        self.call("Page.addScriptToEvaluateOnNewDocument", json!({ "source": source })).await;
    }

    /// Shows pages as a phone of `width × height` CSS pixels would.
    pub async fn emulate_phone(&self, width: u32, height: u32) {
        let params = json!({ "width": width, "height": height, "deviceScaleFactor": 2,
                             "mobile": true });
        self.call("Emulation.setDeviceMetricsOverride", params).await;
    }

    /// From now on, the next `count` answers to requests whose URL matches
    /// `url_pattern` (`*` wildcards) are lost after the server sent them:
    /// the page sees a network error (`ConnectionReset`) where the server
    /// did its work. Later answers pass.
    pub async fn lose_answers(&self, url_pattern: &str, count: u32) {
        self.connection.to_fail.store(count, Ordering::SeqCst);
        let patterns = json!([{ "urlPattern": url_pattern, "requestStage": "Response" }]);
        self.call("Fetch.enable", json!({ "patterns": patterns })).await;
    }

    /// Answers lost so far by [`Browser::lose_answers`].
    pub fn answers_lost(&self) -> u32 {
        self.connection.failed.load(Ordering::SeqCst)
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        self.reader.abort();
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// The browser's DevTools WebSocket URL, from `DevToolsActivePort` in the
/// profile (its port, then its path), once Chromium has written it.
async fn devtools_endpoint(profile: &Path) -> String {
    let file = profile.join("DevToolsActivePort");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(text) = std::fs::read_to_string(&file) {
            let mut lines = text.lines();
            if let (Some(port), Some(path)) = (lines.next(), lines.next()) {
                return format!("ws://127.0.0.1:{port}{path}");
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "Chromium wrote no DevToolsActivePort within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Fails a paused answer while [`Connection::to_fail`] says so, else lets
/// it through.
async fn answer_paused(connection: Arc<Connection>, event: Value) {
    let session = event["sessionId"].as_str().map(str::to_owned);
    let request = event["params"]["requestId"].clone();
    let fail = connection
        .to_fail
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    if fail {
        let params = json!({ "requestId": request, "errorReason": "ConnectionReset" });
        connection.call(session.as_deref(), "Fetch.failRequest", params).await;
        connection.failed.fetch_add(1, Ordering::SeqCst);
    } else {
        let params = json!({ "requestId": request });
        connection.call(session.as_deref(), "Fetch.continueRequest", params).await;
    }
}
