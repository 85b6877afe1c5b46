-- Flash sales and their orders.
--
-- The ledger invariant every correct strategy keeps:
--     sales.total_stock = sales.remaining_stock + sum(orders.quantity)
-- The audit (app/src/audit.rs) measures how far a run strays from it.

CREATE TABLE sales (
    id              bigserial   PRIMARY KEY,
    name            text        NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    -- Units ever put on sale: the initial stock plus every restock.
    total_stock     bigint      NOT NULL CHECK (total_stock >= 0),
    -- Units still for sale. `naive` may drive it below the truth, but never below 0:
    -- a lost update shows up as ledger drift, not as a negative stock.
    remaining_stock bigint      NOT NULL CHECK (remaining_stock >= 0),
    per_user_limit  integer     NOT NULL DEFAULT 1 CHECK (per_user_limit >= 1),
    strategy        text        NOT NULL,
    starts_at       timestamptz,
    ends_at         timestamptz,
    -- Demonstration knobs (milliseconds / fraction); see docs/api.md.
    lock_lease_ms   integer     NOT NULL DEFAULT 2000 CHECK (lock_lease_ms > 0),
    work_ms         integer     NOT NULL DEFAULT 0 CHECK (work_ms >= 0),
    pause_ms        integer     NOT NULL DEFAULT 0 CHECK (pause_ms >= 0),
    pause_ratio     double precision NOT NULL DEFAULT 0 CHECK (pause_ratio >= 0 AND pause_ratio <= 1),
    created_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT sales_window_ordered CHECK (starts_at IS NULL OR ends_at IS NULL OR starts_at < ends_at)
);

-- Keep the hot column out of every index so that stock updates stay HOT updates,
-- and leave room on the page for the new row versions.
ALTER TABLE sales SET (fillfactor = 50);

CREATE TABLE orders (
    id          bigserial   PRIMARY KEY,
    sale_id     bigint      NOT NULL REFERENCES sales (id),
    user_id     bigint      NOT NULL CHECK (user_id >= 0),
    quantity    integer     NOT NULL CHECK (quantity >= 1),
    -- clock_timestamp(), not now(): now() is the transaction start, and the
    -- load test measures sell-through up to the moment the last unit was written.
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT orders_sale_user_key UNIQUE (sale_id, user_id)
);
