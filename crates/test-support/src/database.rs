//! The tests' Postgres: the shared test database, scratch databases beside
//! it, and names no other test (or run) uses.

use sqlx::Postgres;
use sqlx::migrate::MigrateDatabase;

/// The database of the tests: `TEST_DATABASE_URL`, else
/// `postgres://postgres@127.0.0.1:5432/seckill_test`. Tests share it and
/// keep apart by creating sales of their own.
pub fn test_database_url() -> String {
    std::env::var("TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/seckill_test".to_owned())
}

/// The URL of a database beside the test database (same server), named
/// `<test database>_<purpose>`, dropped first if a failed run left it; the
/// service given it creates it. For a test whose service must meet no other
/// test's rows (a job over every sale, a sweep of every order), or that must
/// start from an empty database. `purpose` must be unique among the tests;
/// the test drops the database at its end ([`drop_scratch_database`]).
pub async fn scratch_database(purpose: &str) -> String {
    let base = test_database_url();
    let (server, rest) = base.rsplit_once('/').expect("a database URL ends in /name");
    let (name, query) = match rest.split_once('?') {
        Some((name, query)) => (name, format!("?{query}")),
        None => (rest, String::new()),
    };
    let url = format!("{server}/{name}_{purpose}{query}");
    Postgres::force_drop_database(&url).await.expect("dropping the scratch database");
    url
}

/// Drops a database made by [`scratch_database`], closing its connections;
/// best effort. A service of the test may still be running over it and
/// open a connection between the drop's termination of the others and the
/// drop itself, so the drop is tried a few times; a database still left is
/// reported on stderr and dropped by [`scratch_database`] on the next run.
pub async fn drop_scratch_database(url: &str) {
    let mut last = None;
    for _ in 0..10 {
        match Postgres::force_drop_database(url).await {
            Ok(()) => return,
            Err(err) => last = Some(err),
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    use std::io::Write as _;
    let name = url.rsplit('/').next().unwrap_or(url);
    let error = last.map(|err| err.to_string()).unwrap_or_default();
    let _ = writeln!(std::io::stderr(), "note: scratch database {name} left behind: {error}");
}

/// `test-<random hex>`: a prefix for Redis keys, RabbitMQ queues or any
/// other name on a shared server that no other test (or run) uses.
pub fn unique_prefix() -> String {
    format!("test-{}", uuid::Uuid::new_v4().simple())
}
