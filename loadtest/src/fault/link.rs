//! The network between the started instances and a server, for the faults
//! that act on a link rather than on a process: each instance reaches Redis
//! (for `partition-redis`) or Postgres (for `slow-postgres`) through a TCP
//! relay of its own, and the fault cuts or slows that relay.
//!
//! - **Cut** (a partition): the relay stops reading and writing in both
//!   directions. What the instance sends stays in the kernels' buffers and
//!   nothing comes back; a connection opened meanwhile is accepted but gets
//!   no further. On healing, whatever was held flows on in order — what a
//!   TCP connection does when a partition heals before its retransmissions
//!   give up — including a command its client has given up on: it executes
//!   late, which is the hazard a partition poses for a lock or a gate.
//! - **Slow**: every chunk read in either direction is written half the
//!   added round-trip latency later, in order; chunks in flight when the
//!   link recovers arrive at their time.
//!
//! Our own rather than a library: toxiproxy, the usual tool, is a Go server
//! that would have to be installed beside the project, and what is needed
//! here is a relay with three states on tokio.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// The state of a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    /// Bytes pass as they come.
    Open,
    /// Nothing passes in either direction (a partition).
    Cut,
    /// Every round trip takes this much longer (half of it each way).
    Slow(Duration),
}

impl Condition {
    fn passes(&self) -> bool {
        !matches!(self, Condition::Cut)
    }

    /// How long a chunk read now is held before it is written.
    fn one_way_delay(&self) -> Duration {
        match self {
            Condition::Slow(round_trip) => *round_trip / 2,
            Condition::Open | Condition::Cut => Duration::ZERO,
        }
    }
}

/// A relay from a local port to a server's address; stops (with every
/// connection through it) when dropped.
pub struct Link {
    /// Where the instance connects instead of the server.
    pub local: SocketAddr,
    condition: watch::Sender<Condition>,
    relay: tokio::task::JoinHandle<()>,
}

impl Link {
    /// Listens on a free local port and relays each connection to
    /// `upstream` (`host:port`), open.
    pub async fn start(upstream: String) -> anyhow::Result<Link> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let local = listener.local_addr()?;
        let (condition, watching) = watch::channel(Condition::Open);
        let relay = tokio::spawn(accept(listener, upstream, watching));
        Ok(Link { local, condition, relay })
    }

    /// Sets the link's state for every connection, open or future.
    pub fn set(&self, condition: Condition) {
        self.condition.send_replace(condition);
    }

    /// `url` (a `postgres://` or `redis://` URL of the server) pointed at
    /// this link instead.
    pub fn url_through(&self, url: &str) -> anyhow::Result<String> {
        through(url, self.local)
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.relay.abort();
    }
}

/// `url` with its host and port replaced by `addr`.
fn through(url: &str, addr: SocketAddr) -> anyhow::Result<String> {
    let mut url = url::Url::parse(url).with_context(|| format!("parsing {url}"))?;
    url.set_ip_host(addr.ip()).map_err(|()| anyhow::anyhow!("{url} cannot have a host"))?;
    url.set_port(Some(addr.port())).map_err(|()| anyhow::anyhow!("{url} cannot have a port"))?;
    Ok(url.into())
}

/// The server's `host:port` in `url` (port 5432 or 6379 by default, as the
/// clients assume).
pub fn address_of(url: &str) -> anyhow::Result<String> {
    let parsed = url::Url::parse(url).with_context(|| format!("parsing {url}"))?;
    let host = parsed.host_str().filter(|h| !h.is_empty()).unwrap_or("127.0.0.1");
    let default_port = match parsed.scheme() {
        "redis" | "rediss" => 6379,
        _ => 5432,
    };
    Ok(format!("{host}:{}", parsed.port().unwrap_or(default_port)))
}

/// Accepts connections until the link is dropped (which aborts this task
/// and, with its `JoinSet`, every relayed connection).
async fn accept(listener: TcpListener, upstream: String, condition: watch::Receiver<Condition>) {
    let mut connections = JoinSet::new();
    loop {
        let Ok((client, _)) = listener.accept().await else {
            // Out of descriptors, most likely: let connections close.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        connections.spawn(relay(client, upstream.clone(), condition.clone()));
        while connections.try_join_next().is_some() {}
    }
}

/// One connection: to the server once the link passes, then both
/// directions until each side has closed.
async fn relay(client: TcpStream, upstream: String, mut condition: watch::Receiver<Condition>) {
    if condition.wait_for(Condition::passes).await.is_err() {
        return;
    }
    let Ok(server) = TcpStream::connect(&upstream).await else { return };
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::join!(
        direction(client_read, server_write, condition.clone()),
        direction(server_read, client_write, condition),
    );
}

/// Chunks read but not yet written, per direction: beyond it the reader
/// waits (the relay's own buffer, as a socket's).
const IN_FLIGHT: usize = 256;

/// Copies `from` to `to` under the link's condition: a reader that stops
/// while the link is cut, and a writer that holds each chunk until its
/// time and while the link is cut.
async fn direction(
    mut from: impl AsyncReadExt + Unpin,
    mut to: impl AsyncWriteExt + Unpin,
    condition: watch::Receiver<Condition>,
) {
    let (chunks, mut due) = mpsc::channel::<(Instant, Vec<u8>)>(IN_FLIGHT);
    let mut reading = condition.clone();
    let read = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            if reading.wait_for(Condition::passes).await.is_err() {
                return;
            }
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let at = Instant::now() + reading.borrow().one_way_delay();
            if chunks.send((at, buf[..n].to_vec())).await.is_err() {
                return;
            }
        }
    };
    let mut writing = condition;
    let write = async move {
        while let Some((at, bytes)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            if writing.wait_for(Condition::passes).await.is_err()
                || to.write_all(&bytes).await.is_err()
            {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(read, write);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_through_the_link_keeps_all_but_its_address() {
        let addr: SocketAddr = "127.0.0.1:41234".parse().unwrap();
        assert_eq!(
            through("postgres://postgres@db.internal:5432/seckill?sslmode=disable", addr).unwrap(),
            "postgres://postgres@127.0.0.1:41234/seckill?sslmode=disable"
        );
        assert_eq!(through("redis://127.0.0.1/2", addr).unwrap(), "redis://127.0.0.1:41234/2");
        assert_eq!(address_of("redis://127.0.0.1/2").unwrap(), "127.0.0.1:6379");
        assert_eq!(address_of("postgres://u@db:6000/x").unwrap(), "db:6000");
        assert_eq!(address_of("postgres://u@localhost/x").unwrap(), "localhost:5432");
    }

    /// An echo server on a free port.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = socket.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    /// Sends `bytes` and reads as many back, or times out after `within`.
    async fn round_trip(stream: &mut TcpStream, bytes: &[u8], within: Duration) -> Option<Vec<u8>> {
        stream.write_all(bytes).await.unwrap();
        let mut back = vec![0u8; bytes.len()];
        tokio::time::timeout(within, stream.read_exact(&mut back)).await.ok()?.ok()?;
        Some(back)
    }

    #[tokio::test]
    async fn an_open_link_relays_a_cut_one_holds_until_healed_and_a_slow_one_delays() {
        let link = Link::start(echo().await.to_string()).await.unwrap();
        let mut stream = TcpStream::connect(link.local).await.unwrap();
        let short = Duration::from_millis(300);
        assert_eq!(round_trip(&mut stream, b"open", short).await.as_deref(), Some(&b"open"[..]));

        link.set(Condition::Cut);
        assert_eq!(
            round_trip(&mut stream, b"held", short).await,
            None,
            "a cut link passes nothing"
        );
        let mut opened_while_cut = TcpStream::connect(link.local).await.unwrap();
        assert_eq!(round_trip(&mut opened_while_cut, b"new", short).await, None);

        link.set(Condition::Open);
        let mut back = [0u8; 4];
        stream.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"held", "what was sent during the cut arrives once healed");
        let mut back = [0u8; 3];
        opened_while_cut.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"new");

        link.set(Condition::Slow(Duration::from_millis(400)));
        let started = std::time::Instant::now();
        let slow = round_trip(&mut stream, b"slow", Duration::from_secs(5)).await;
        assert_eq!(slow.as_deref(), Some(&b"slow"[..]));
        assert!(started.elapsed() >= Duration::from_millis(400), "{:?}", started.elapsed());
    }
}
