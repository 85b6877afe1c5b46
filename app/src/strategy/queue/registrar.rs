//! Registering requests in groups: one statement for every purchase that
//! arrives while the previous statement runs.
//!
//! Every accepted purchase needs its row in `purchase_requests`, and every
//! purchase of a sold-out sale looks its buyer up there. One statement per
//! purchase would make Postgres' per-statement cost (a round trip, parse,
//! plan, a WAL record and a commit each) the price of every request. Instead
//! each worker task takes what is waiting in its channel, up to
//! [`MAX_GROUP`] requests, and answers all of them from one multi-row
//! statement — the group commit of the request path. Under no load a group is
//! one request and nothing waits; under load the groups grow by themselves.
//!
//! Requests go to worker `user mod WORKERS`, so a buyer's requests are
//! registered in order.

use std::collections::HashMap;
use std::sync::OnceLock;

use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use super::results::Registered;
use crate::sale::{Quantity, SaleId, UserId};
use crate::strategy::StrategyError;

/// Worker tasks, each with its own connection in use at a time.
const WORKERS: usize = 4;

/// Most requests in one statement.
const MAX_GROUP: usize = 256;

type Reply<T> = oneshot::Sender<Result<T, StrategyError>>;

enum Job {
    Register { sale: SaleId, user: UserId, quantity: Quantity, reply: Reply<Registered> },
    Find { sale: SaleId, user: UserId, reply: Reply<Option<Found>> },
}

/// A buyer's request, as [`Registrar::find`] finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    pub id: Uuid,
    /// Not settled yet.
    pub pending: bool,
    /// Units asked for.
    pub quantity: i32,
}

/// The group registrar of one process; workers start on first use.
pub struct Registrar {
    db: PgPool,
    workers: OnceLock<Vec<mpsc::UnboundedSender<Job>>>,
}

impl Registrar {
    pub fn new(db: PgPool) -> Self {
        Self { db, workers: OnceLock::new() }
    }

    /// Finds or creates the one request of (`sale`, `user`) (as
    /// [`super::results::register`], grouped).
    ///
    /// Errors: Postgres errors (connection failures are `Unavailable`).
    pub async fn register(
        &self,
        sale: SaleId,
        user: UserId,
        quantity: Quantity,
    ) -> Result<Registered, StrategyError> {
        let (reply, answer) = oneshot::channel();
        self.send(user, Job::Register { sale, user, quantity, reply });
        answer.await.map_err(|_| worker_gone())?
    }

    /// The request of (`sale`, `user`), if any (grouped).
    ///
    /// Errors: Postgres errors.
    pub async fn find(&self, sale: SaleId, user: UserId) -> Result<Option<Found>, StrategyError> {
        let (reply, answer) = oneshot::channel();
        self.send(user, Job::Find { sale, user, reply });
        answer.await.map_err(|_| worker_gone())?
    }

    fn send(&self, user: UserId, job: Job) {
        let workers = self.workers.get_or_init(|| {
            (0..WORKERS)
                .map(|_| {
                    let (tx, rx) = mpsc::unbounded_channel();
                    tokio::spawn(work(self.db.clone(), rx));
                    tx
                })
                .collect()
        });
        let worker = &workers[user.get().rem_euclid(WORKERS as i64) as usize];
        // A send fails only when the worker's runtime is gone; the caller's
        // `answer` then reports it.
        let _ = worker.send(job);
    }
}

fn worker_gone() -> StrategyError {
    StrategyError::Internal(anyhow::anyhow!("the request registrar stopped"))
}

/// One worker: take what is waiting, answer it with one statement per kind.
async fn work(db: PgPool, mut jobs: mpsc::UnboundedReceiver<Job>) {
    let mut group = Vec::with_capacity(MAX_GROUP);
    while jobs.recv_many(&mut group, MAX_GROUP).await > 0 {
        let (mut registers, mut finds) = (Vec::new(), Vec::new());
        for job in group.drain(..) {
            match job {
                Job::Register { sale, user, quantity, reply } => {
                    registers.push((sale, user, quantity, reply))
                }
                Job::Find { sale, user, reply } => finds.push((sale, user, reply)),
            }
        }
        if !registers.is_empty() {
            register_group(&db, registers).await;
        }
        if !finds.is_empty() {
            find_group(&db, finds).await;
        }
    }
}

type Key = (i64, i64);

/// Attempts at a group's statements when Postgres picks them as a deadlock's
/// victim (SQLSTATE 40P01). A group's insert can deadlock with a consumer's
/// batch that recreates the same (sale, user) rows in another order (after a
/// broker restart, for requests whose refused publish had landed); the
/// victim's statement is rolled back whole, so running it again is safe.
const DEADLOCK_ATTEMPTS: u32 = 3;

async fn register_group(db: &PgPool, jobs: Vec<(SaleId, UserId, Quantity, Reply<Registered>)>) {
    let rows = GroupRows {
        ids: jobs.iter().map(|_| Uuid::new_v4()).collect(),
        sales: jobs.iter().map(|j| j.0.0).collect(),
        users: jobs.iter().map(|j| j.1.get()).collect(),
        quantities: jobs.iter().map(|j| j.2.get()).collect(),
    };
    let mut attempt = 1;
    let result = loop {
        match register_rows(db, &rows).await {
            Err(err) if is_deadlock(&err) && attempt < DEADLOCK_ATTEMPTS => attempt += 1,
            other => break other,
        }
    };
    let (ids, sales, users) = (&rows.ids, &rows.sales, &rows.users);
    match result {
        Ok((fresh, existing)) => {
            for (i, (_, _, _, reply)) in jobs.into_iter().enumerate() {
                let key = (sales[i], users[i]);
                let answer = if fresh.get(&key) == Some(&ids[i]) {
                    Ok(Registered { id: ids[i], fresh: true, pending: true })
                } else if let Some(&(id, pending)) = existing.get(&key) {
                    Ok(Registered { id, fresh: false, pending })
                } else {
                    // Removed meanwhile by a refused publish: the buyer may
                    // try again.
                    Err(StrategyError::Busy {
                        reason: "the request was withdrawn; retry",
                        retry_after: super::publisher::RETRY_AFTER,
                    })
                };
                let _ = reply.send(answer);
            }
        }
        Err(err) => reply_all(jobs.into_iter().map(|j| j.3), err),
    }
}

/// The rows of one group, column by column.
struct GroupRows {
    ids: Vec<Uuid>,
    sales: Vec<i64>,
    users: Vec<i64>,
    quantities: Vec<i32>,
}

/// Inserts the group's requests and looks up those that existed: the
/// requests inserted (by key, with the id given) and the existing ones (by
/// key, with whether they are pending).
async fn register_rows(
    db: &PgPool,
    rows: &GroupRows,
) -> Result<(HashMap<Key, Uuid>, HashMap<Key, (Uuid, bool)>), sqlx::Error> {
    // A buyer twice in one group: the second row conflicts with the first
    // and is skipped, and finds the first below.
    let inserted: Vec<(Uuid, i64, i64)> = sqlx::query_as(
        "INSERT INTO purchase_requests (id, sale_id, user_id, quantity)
         SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::bigint[], $4::int[])
         ON CONFLICT (sale_id, user_id) WHERE status <> 'returned' DO NOTHING
         RETURNING id, sale_id, user_id",
    )
    .bind(&rows.ids)
    .bind(&rows.sales)
    .bind(&rows.users)
    .bind(&rows.quantities)
    .fetch_all(db)
    .await?;
    let fresh: HashMap<Key, Uuid> = inserted.into_iter().map(|(id, s, u)| ((s, u), id)).collect();
    let (mut missing_sales, mut missing_users) = (Vec::new(), Vec::new());
    for (i, (&sale, &user)) in rows.sales.iter().zip(&rows.users).enumerate() {
        if fresh.get(&(sale, user)) != Some(&rows.ids[i]) {
            missing_sales.push(sale);
            missing_users.push(user);
        }
    }
    // ON CONFLICT waited for any conflicting insert to commit, so this
    // later statement sees it.
    let existing = if missing_sales.is_empty() {
        Vec::new()
    } else {
        lookup(db, &missing_sales, &missing_users).await?
    };
    let existing = existing
        .into_iter()
        .map(|(id, s, u, status)| ((s, u), (id, status == "pending")))
        .collect();
    Ok((fresh, existing))
}

/// Whether Postgres aborted the statement to break a deadlock (40P01).
fn is_deadlock(err: &sqlx::Error) -> bool {
    err.as_database_error().and_then(|e| e.code()).as_deref() == Some("40P01")
}

/// `(id, sale_id, user_id, status, quantity)` of a request found.
type FoundRow = (Uuid, i64, i64, String, i32);

async fn find_group(db: &PgPool, jobs: Vec<(SaleId, UserId, Reply<Option<Found>>)>) {
    let sales: Vec<i64> = jobs.iter().map(|j| j.0.0).collect();
    let users: Vec<i64> = jobs.iter().map(|j| j.1.get()).collect();
    let found: Result<Vec<FoundRow>, sqlx::Error> = sqlx::query_as(
        "SELECT r.id, r.sale_id, r.user_id, r.status, r.quantity
         FROM purchase_requests r
         JOIN unnest($1::bigint[], $2::bigint[]) AS k(s, u)
           ON r.sale_id = k.s AND r.user_id = k.u AND r.status <> 'returned'",
    )
    .bind(&sales)
    .bind(&users)
    .fetch_all(db)
    .await;
    match found {
        Ok(rows) => {
            let by_key: HashMap<Key, Found> = rows
                .into_iter()
                .map(|(id, s, u, status, quantity)| {
                    ((s, u), Found { id, pending: status == "pending", quantity })
                })
                .collect();
            for (i, (_, _, reply)) in jobs.into_iter().enumerate() {
                let _ = reply.send(Ok(by_key.get(&(sales[i], users[i])).copied()));
            }
        }
        Err(err) => reply_all(jobs.into_iter().map(|j| j.2), err),
    }
}

/// The requests of the (sale, user) pairs `sales[i], users[i]`: `(id,
/// sale_id, user_id, status)` of each that exists.
async fn lookup(
    db: &PgPool,
    sales: &[i64],
    users: &[i64],
) -> Result<Vec<(Uuid, i64, i64, String)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT r.id, r.sale_id, r.user_id, r.status
         FROM purchase_requests r
         JOIN unnest($1::bigint[], $2::bigint[]) AS k(s, u)
           ON r.sale_id = k.s AND r.user_id = k.u AND r.status <> 'returned'",
    )
    .bind(sales)
    .bind(users)
    .fetch_all(db)
    .await
}

/// Answers every reply with `err`, classified as `From<sqlx::Error>` does
/// (`unavailable`, `misconfigured`, `busy` or `internal`).
fn reply_all<T>(replies: impl Iterator<Item = Reply<T>>, err: sqlx::Error) {
    let err = StrategyError::from(err);
    for reply in replies {
        let _ = reply.send(Err(err.duplicate()));
    }
}
