//! A TCP proxy that can cut a connection right after a chosen command ran.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// Forwards every connection to `upstream` both ways. Once
/// [`cut_after`](Self::cut_after) is armed with a byte pattern, the next
/// chunk a client sends that contains it is forwarded, the server's reply is
/// read and thrown away, and that connection is closed both ways: the
/// command ran, and its client never hears how. Later connections (a
/// client's reconnection) are forwarded as before. Stops on drop.
pub struct CutProxy {
    addr: SocketAddr,
    armed: Arc<Mutex<Option<Vec<u8>>>>,
    cut: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl CutProxy {
    /// A proxy on a free loopback port in front of `upstream`.
    pub async fn start(upstream: SocketAddr) -> CutProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a loopback port");
        let addr = listener.local_addr().expect("bound");
        let armed: Arc<Mutex<Option<Vec<u8>>>> = Arc::default();
        let cut = Arc::new(Notify::new());
        let (armed_, cut_) = (armed.clone(), cut.clone());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(upstream).await else { continue };
                tokio::spawn(forward(client, server, armed_.clone(), cut_.clone()));
            }
        });
        CutProxy { addr, armed, cut, task }
    }

    /// `host:port` of the proxy.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Arms the cut for the next client chunk containing `pattern`.
    pub fn cut_after(&self, pattern: &[u8]) {
        *self.armed.lock().expect("proxy") = Some(pattern.to_vec());
    }

    /// Waits until an armed cut has happened.
    pub async fn cut(&self) {
        self.cut.notified().await;
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn forward(
    client: TcpStream,
    server: TcpStream,
    armed: Arc<Mutex<Option<Vec<u8>>>>,
    cut: Arc<Notify>,
) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let swallow = Arc::new(AtomicBool::new(false));
    let swallowing = swallow.clone();
    let replies = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match server_read.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if swallowing.load(Ordering::SeqCst) {
                // The cut command's reply: dropped, and the client's side
                // closed with `client_write`.
                cut.notify_one();
                return;
            }
            if client_write.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match client_read.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let chunk = &buf[..n];
        let hit = {
            let mut armed = armed.lock().expect("proxy");
            let hit = armed.as_ref().is_some_and(|pattern| contains(chunk, pattern));
            if hit {
                *armed = None;
            }
            hit
        };
        if hit {
            swallow.store(true, Ordering::SeqCst);
        }
        if server_write.write_all(chunk).await.is_err() || hit {
            break;
        }
    }
    if swallow.load(Ordering::SeqCst) {
        let _ = replies.await;
    } else {
        replies.abort();
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|window| window == needle)
}
