//! The engines' own failovers, mid-sale: a server of a replicated engine
//! (a Redis Cluster master, a RabbitMQ cluster node) lost while buyers buy,
//! on servers of the test's own.

mod rabbitmq_cluster;
mod redis_cluster;
