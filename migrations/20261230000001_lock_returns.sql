-- Issue 29: units a `lock/*` strategy returns outside the sale's lock.
--
-- A lock strategy's purchase writes the stock as an absolute value computed
-- from its read (the naive steps run under a lock, app/src/strategy/naive.rs),
-- so a return cannot add to `remaining_stock` without the lock: a holder that
-- read before the return would overwrite it. Taking the lock for a return
-- made it queue behind every buyer of the sale, and lose under load. A
-- return therefore adds its units to `returned_stock` instead, in the order's
-- claim transaction and without the lock; the next holder folds them in:
--     units for sale on the sale row = remaining_stock + returned_stock - folded_stock
-- A holder reads the three, decides from their sum, and writes
-- `remaining_stock = sum - q` with `folded_stock = <returned_stock it read>`.
-- Both counters only grow, and `folded_stock` never passes what was
-- returned: a return that commits between a holder's read and its write is
-- above what that holder folds, so it stays for sale. A stale holder of an
-- unfenced variant (two holders at once: the breakage those variants
-- demonstrate) writes both columns from its old read, which loses the other
-- holder's purchase (ledger drift, as before) and never a return. Behind the
-- fence, a stale holder's write is refused whole.
--
-- Every other strategy returns onto `remaining_stock` as before, and leaves
-- both columns at 0.
ALTER TABLE sales
    ADD COLUMN returned_stock bigint NOT NULL DEFAULT 0 CHECK (returned_stock >= 0),
    ADD COLUMN folded_stock   bigint NOT NULL DEFAULT 0,
    ADD CONSTRAINT sales_folded_returned CHECK (folded_stock BETWEEN 0 AND returned_stock);

-- The stock figures of every sale, buckets and unfolded returns included:
-- what `GET /sales/{id}`, the audit and the load test's series read. The
-- ledger invariant stays
--     sales.total_stock = sale_stock.remaining_stock + sum(quantity of live orders)
CREATE OR REPLACE VIEW sale_stock AS
SELECT s.id AS sale_id,
       s.total_stock,
       s.remaining_stock + (s.returned_stock - s.folded_stock)
         + coalesce((SELECT sum(b.remaining_stock) FROM sale_buckets b WHERE b.sale_id = s.id), 0)
         ::bigint AS remaining_stock
FROM sales s;
