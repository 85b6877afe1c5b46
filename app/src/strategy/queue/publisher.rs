//! Publishing a purchase with a publisher confirm.
//!
//! A few channels in confirm mode, used round-robin (a channel serializes its
//! frames; one per request would cost an open/close round trip each). A
//! publish is `mandatory` and persistent (`delivery_mode = 2`) and goes to
//! the sale's partition queue through the default exchange. Only a broker
//! `ack` without a returned message counts as accepted:
//!
//! | broker answer | meaning | answer to the client |
//! |---|---|---|
//! | ack | stored in the quorum queue (a majority of its replicas) | `202` |
//! | ack + returned message | unroutable (no such queue) | `503 busy` |
//! | nack, [`NACKED_ATTEMPTS`] times in a row | refused: the queue is at `x-max-length` (`reject-publish`), or not available (a quorum queue declared moments before has been seen to nack a first publish) | `503 busy` |
//! | no answer within 5 s | unknown: an overloaded broker, or one that is gone | the probe decides (`crate::backend_probe`): `503 busy` when the broker answers a fresh connection, else `503 unavailable` |
//! | no connection or channel, or one lost mid-publish | unknown: the broker is gone or restarting | `503 unavailable` (`backend: rabbitmq`) |
//!
//! A `503` after an unknown outcome is safe: the client retries, finds the
//! same request, and the consumer settles a request id once.
//!
//! A refusal also retires the channels (at most once per
//! [`REPLACE_AFTER`]): the next publish opens fresh ones on the same
//! connection, and the old ones are closed once their publishes have had
//! their [`CONFIRM_TIMEOUT`]. A nack may be the channel's own, not the
//! queue's: RabbitMQ 3.10's channel keeps, per quorum queue, the replicas it
//! learnt at its first publish there, leader first, and registers with the
//! queue by asking the first one; a channel whose first publish came after
//! the leader's node died and before a new leader was recorded asks the
//! dead node, which fails and nacks, and asks it again at every later
//! publish: nacked for good. `failover::rabbitmq_cluster` saw it after a
//! cluster node's `SIGKILL`: every purchase through the new connections
//! answered `503 busy` for 35 s while the queue had a leader and room.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Channel, Confirmation, Connection};
use tokio::sync::RwLock;

use super::{PurchaseMessage, Topology};
use crate::backend_probe::NoAnswerWithin;
use crate::backends::{AmqpHandle, amqp_unavailable, count_amqp_messages};
use crate::strategy::StrategyError;

/// Channels in confirm mode per process.
const PUBLISH_CHANNELS: usize = 8;

/// How long a publish waits for its confirm.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(5);

/// Publishes of one message the broker may nack before the client is told
/// `503 busy`, [`NACK_PAUSE`] apart, all within [`CONFIRM_TIMEOUT`]. A nack is
/// not only a full queue: a quorum queue declared moments before nacked the
/// first purchase published into it in two test runs on a 2-core machine
/// (the broker logged no reason), a purchase a later publish could store. A full queue costs a
/// refused buyer the two pauses (200 ms). A nacked message is not stored;
/// were one kept after all, the consumer settles its request id once.
const NACKED_ATTEMPTS: u32 = 3;

/// The pause after a nack before publishing again.
const NACK_PAUSE: Duration = Duration::from_millis(100);

/// What the client is told to wait before retrying a refused publish.
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

/// How long a set of channels is used before a refusal may retire it: a
/// full queue refuses every publish, and a set per refusal would cost eight
/// channel opens each time.
const REPLACE_AFTER: Duration = Duration::from_secs(1);

/// The publishing half of the strategy.
pub struct Publisher {
    amqp: AmqpHandle,
    topology: Topology,
    channels: RwLock<Option<Arc<Channels>>>,
}

/// Confirm-mode channels of one connection.
struct Channels {
    conn: Arc<Connection>,
    channels: Vec<Channel>,
    next: AtomicUsize,
    opened: std::time::Instant,
}

impl Publisher {
    pub fn new(amqp: AmqpHandle, topology: Topology) -> Self {
        Self { amqp, topology, channels: RwLock::new(None) }
    }

    /// Publishes `message` to its sale's partition queue and waits for the
    /// confirm.
    ///
    /// Errors: `Busy` (with [`RETRY_AFTER`]) for [`NACKED_ATTEMPTS`] nacks
    /// or an unroutable message; `Unavailable { backend: Rabbitmq }` for a
    /// broker that cannot be reached or a connection lost mid-publish, and
    /// for a confirm that did not come within 5 s, with a
    /// [`NoAnswerWithin`] source, which the purchase path's probe sorts
    /// into `busy` or `unavailable`.
    pub async fn publish(&self, message: &PurchaseMessage) -> Result<(), StrategyError> {
        let (set, channel) = self.channel().await?;
        let payload =
            serde_json::to_vec(message).map_err(|err| StrategyError::Internal(err.into()))?;
        let queue = self.topology.queue_of(crate::sale::SaleId(message.sale_id));
        let message_id = message.request_id.to_string();
        let published = async {
            for _ in 1..NACKED_ATTEMPTS {
                match publish_confirmed(&channel, &queue, &payload, &message_id).await? {
                    PublishOutcome::Refused => tokio::time::sleep(NACK_PAUSE).await,
                    outcome => return Ok(outcome),
                }
            }
            publish_confirmed(&channel, &queue, &payload, &message_id).await
        };
        match tokio::time::timeout(CONFIRM_TIMEOUT, published).await {
            Ok(Ok(PublishOutcome::Stored)) => {
                count_amqp_messages("published", 1);
                Ok(())
            }
            Ok(Ok(PublishOutcome::Refused)) => {
                self.retire(&set).await;
                Err(busy(
                    "the broker refused the request: the sale's queue is full or not available",
                ))
            }
            Ok(Ok(PublishOutcome::Unroutable)) => Err(busy("the sale's queue does not exist")),
            Ok(Err(err)) => Err(amqp_unavailable(err.into())),
            Err(_) => Err(amqp_unavailable(NoAnswerWithin(CONFIRM_TIMEOUT).into())),
        }
    }

    /// The next confirm-mode channel and the set it belongs to, opening
    /// them (and declaring the topology) on a new connection, or after
    /// [`Self::retire`].
    async fn channel(&self) -> Result<(Arc<Channels>, Channel), StrategyError> {
        let conn = self.amqp.connection().await?;
        if let Some(channels) = self.channels.read().await.as_ref()
            && Arc::ptr_eq(&channels.conn, &conn)
        {
            return Ok((channels.clone(), channels.pick()));
        }
        let mut slot = self.channels.write().await;
        if let Some(channels) = slot.as_ref()
            && Arc::ptr_eq(&channels.conn, &conn)
        {
            return Ok((channels.clone(), channels.pick()));
        }
        let unavailable = |err: lapin::Error| amqp_unavailable(err.into());
        let mut channels = Vec::with_capacity(PUBLISH_CHANNELS);
        for i in 0..PUBLISH_CHANNELS {
            let channel = conn.create_channel().await.map_err(unavailable)?;
            if i == 0 {
                self.topology.declare_queues(&channel).await.map_err(unavailable)?;
            }
            channel.confirm_select(ConfirmSelectOptions::default()).await.map_err(unavailable)?;
            channels.push(channel);
        }
        let opened = std::time::Instant::now();
        let fresh = Arc::new(Channels { conn, channels, next: AtomicUsize::new(0), opened });
        *slot = Some(fresh.clone());
        Ok((fresh.clone(), fresh.pick()))
    }

    /// After a refused publish on a channel of `set`: unless `set` was
    /// already replaced or is younger than [`REPLACE_AFTER`], the next
    /// publish opens fresh channels (see the module documentation), and
    /// `set`'s channels are closed once the publishes still on them have
    /// had their [`CONFIRM_TIMEOUT`].
    async fn retire(&self, set: &Arc<Channels>) {
        let mut slot = self.channels.write().await;
        let current = slot.as_ref().is_some_and(|now| Arc::ptr_eq(now, set));
        if !current || set.opened.elapsed() < REPLACE_AFTER {
            return;
        }
        *slot = None;
        let retired = set.clone();
        tokio::spawn(async move {
            tokio::time::sleep(CONFIRM_TIMEOUT).await;
            for channel in &retired.channels {
                let _ = channel.close(200, "replaced after a refusal".into()).await;
            }
        });
    }
}

impl Channels {
    fn pick(&self) -> Channel {
        let i = self.next.fetch_add(1, Relaxed) % self.channels.len();
        self.channels[i].clone()
    }
}

/// How the broker answered one confirmed publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishOutcome {
    /// Acked: the queue has it.
    Stored,
    /// Nacked (e.g. `reject-publish` at `x-max-length`).
    Refused,
    /// Acked but returned: no queue of that name.
    Unroutable,
}

/// Publishes `payload` to `queue` (default exchange, `mandatory`,
/// persistent, `message_id` = `message_id`) on a confirm-mode `channel` and
/// waits for the broker's answer.
pub async fn publish_confirmed(
    channel: &Channel,
    queue: &str,
    payload: &[u8],
    message_id: &str,
) -> lapin::Result<PublishOutcome> {
    let properties = BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type("application/json".into())
        .with_message_id(message_id.into());
    let confirm = channel
        .basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions { mandatory: true, ..BasicPublishOptions::default() },
            payload,
            properties,
        )
        .await?
        .await?;
    Ok(match confirm {
        Confirmation::Ack(None) => PublishOutcome::Stored,
        Confirmation::Ack(Some(_)) => PublishOutcome::Unroutable,
        Confirmation::Nack(_) => PublishOutcome::Refused,
        // Confirm mode is on for every channel this module opens.
        Confirmation::NotRequested => PublishOutcome::Refused,
    })
}

fn busy(reason: &'static str) -> StrategyError {
    StrategyError::Busy { reason, retry_after: RETRY_AFTER }
}
