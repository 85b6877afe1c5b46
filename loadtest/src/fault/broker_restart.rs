//! `broker-restart`: the invocation's own RabbitMQ node (see
//! [`super::servers`]) is stopped (`rabbitmqctl stop`: a clean shutdown,
//! its quorum queues kept on disk), kept down for `--fault-restart-ms`, and
//! started again on the same ports and directories; the repair ends once it
//! accepts AMQP again. Publishes meanwhile are refused (`503`), consumers
//! lose their channels and reconnect; what was confirmed must survive.
//! Strategies that do not use RabbitMQ run through it unchanged.

use anyhow::{Context, anyhow};

use super::{Landed, Target};

/// Stops the owned node, waits, starts it again.
pub async fn inject(on: &Target<'_>) -> anyhow::Result<Landed> {
    let broker = on.servers.broker.as_ref().context("no owned RabbitMQ node was started")?;
    let mut broker = broker.lock().await;
    // The clean shutdown takes seconds, and the node stops serving at its
    // start: the fault lands when it begins.
    let landed = Landed::now(None);
    broker.stop();
    tokio::time::sleep(on.settings.restart_after).await;
    broker.try_restart().await.map_err(|e| anyhow!(e))?;
    Ok(landed)
}
