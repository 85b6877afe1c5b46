-- Fencing and concurrency measurement for the `lock/*` strategies.
--
-- Fencing (lock/fenced, lock/redlock): a holder first claims its sale with a
-- fencing token, then reads, and its write applies only while its claim still
-- stands (app/src/strategy/lock/fence.rs). Tokens come from a Postgres
-- sequence, taken while the lock is held: it is as durable as the stock it
-- guards, so it stays monotonic when a Redis that keeps nothing on disk
-- restarts and forgets its own counters (docs/locks.md).
CREATE SEQUENCE lock_fencing_tokens AS bigint;

CREATE TABLE sale_fences (
    sale_id     bigint      PRIMARY KEY REFERENCES sales (id),
    -- The highest fencing token that has claimed the sale; it only grows.
    token       bigint      NOT NULL,
    claimed_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- One row per critical section a `lock/*` strategy entered: wall-clock times
-- taken in the app right after the lock was acquired and right before it was
-- released. Rows are written in batches, outside the critical section; the
-- maximum number of overlapping intervals of a sale is its measured
-- max_concurrency (GET /admin/sales/{id}/lock-stats). Times from different
-- instances are comparable because they read the same host clock (or
-- NTP-disciplined clocks, within their skew).
--
-- A measurement table: no foreign key and no check, so that a batch can never
-- be refused (the app writes ended_at >= started_at).
CREATE TABLE lock_intervals (
    sale_id     bigint      NOT NULL,
    -- Which app process ran the critical section (a random id per process).
    instance    text        NOT NULL,
    started_at  timestamptz NOT NULL,
    ended_at    timestamptz NOT NULL
);
CREATE INDEX lock_intervals_sale_idx ON lock_intervals (sale_id);
