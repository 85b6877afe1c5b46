-- Units of stock a reconciler had to return or correct for a sale, over its
-- whole life (see docs/redis-decr.md). NULL for a sale whose strategy keeps no
-- stock outside Postgres and so has nothing to reconcile; the `redis-decr`
-- strategy sets it to 0 when the sale is created. The audit reports it as is.
ALTER TABLE sales ADD COLUMN reconcile_fixes bigint CHECK (reconcile_fixes >= 0);
