-- Stock split over several rows (the `sql/buckets` strategy,
-- app/src/strategy/sql_buckets.rs).
--
-- A sale whose strategy splits its stock has `buckets` set and one
-- `sale_buckets` row per bucket; its units sit in those rows and its
-- `sales.remaining_stock` stays 0. Every other sale has `buckets` NULL, no
-- bucket rows, and all its units on the sale row. Either way the units still
-- for sale are the sale row's plus its buckets', which is what the view
-- `sale_stock` reads, and the ledger invariant becomes
--     sales.total_stock = sale_stock.remaining_stock + sum(orders.quantity)
-- Creating a sale and restocking it write the sale row and its buckets in one
-- statement (app/src/http/admin.rs), so the invariant holds throughout.
ALTER TABLE sales ADD COLUMN buckets integer CHECK (buckets BETWEEN 1 AND 1024);

CREATE TABLE sale_buckets (
    sale_id         bigint  NOT NULL REFERENCES sales (id),
    -- 0 .. sales.buckets − 1.
    bucket          integer NOT NULL CHECK (bucket >= 0),
    remaining_stock bigint  NOT NULL CHECK (remaining_stock >= 0),
    PRIMARY KEY (sale_id, bucket)
);
-- As for `sales`: the hot column is in no index, so stock updates stay HOT
-- updates, and the page keeps room for the new row versions.
ALTER TABLE sale_buckets SET (fillfactor = 50);

-- The stock figures of every sale, buckets included: what `GET /sales/{id}`
-- and the audit read.
CREATE VIEW sale_stock AS
SELECT s.id AS sale_id,
       s.total_stock,
       s.remaining_stock
         + coalesce((SELECT sum(b.remaining_stock) FROM sale_buckets b WHERE b.sale_id = s.id), 0)
         ::bigint AS remaining_stock
FROM sales s;

-- The units bucket `bucket` (0-based) of `buckets` gets when `units` are
-- spread over them: an even share, and the remainder one each to the first
-- buckets. Creating a bucket sale and restocking it spread with it.
CREATE FUNCTION bucket_share(units bigint, buckets integer, bucket integer) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT
RETURN units / buckets + (bucket < units % buckets)::integer;
