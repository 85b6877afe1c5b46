-- Issue 14: the order lifecycle — a payment window per sale, order statuses,
-- and units that come back when an order is cancelled or expires.
--
-- A sale may set `payment_window_ms`. Its orders then start
-- `pending_payment` with `expires_at = created_at + window`; paying makes them
-- `paid`; the buyer's cancel makes them `cancelled`; the expiry sweep makes
-- an order still unpaid at `expires_at` `expired` (app/src/lifecycle/).
-- Orders of a sale without a window are `paid` when written, as before: their
-- books and answers are unchanged.
--
-- Cancelled and expired orders have returned their units: the status change
-- and the stock return are one transaction, guarded by `status =
-- 'pending_payment'`, so a unit comes back at most once. The ledger
-- invariant becomes
--     sales.total_stock = sale_stock.remaining_stock
--                         + sum(quantity of live orders: pending_payment, paid)
-- (docs/report-format.md states it with the returned units).
ALTER TABLE sales ADD COLUMN payment_window_ms integer
    CHECK (payment_window_ms BETWEEN 1 AND 604800000);

ALTER TABLE orders
    ADD COLUMN status text NOT NULL DEFAULT 'paid'
        CHECK (status IN ('pending_payment', 'paid', 'cancelled', 'expired')),
    -- When an unpaid order expires; NULL for a sale without a window.
    ADD COLUMN expires_at timestamptz,
    -- When it was paid, and the Idempotency-Key of that payment (if any).
    ADD COLUMN paid_at timestamptz,
    ADD COLUMN payment_key text CHECK (length(payment_key) BETWEEN 1 AND 255),
    -- When it was cancelled or expired, i.e. when its units came back.
    ADD COLUMN ended_at timestamptz;

-- One live order per buyer and sale; a buyer whose order was cancelled or
-- expired may buy again. Same name as the constraint it replaces: the
-- service maps a violation of it to `409 already-purchased` by this name.
ALTER TABLE orders DROP CONSTRAINT orders_sale_user_key;
CREATE UNIQUE INDEX orders_sale_user_key ON orders (sale_id, user_id)
    WHERE status IN ('pending_payment', 'paid');
-- Every (sale, user) lookup, live or not (a buyer's latest order).
CREATE INDEX orders_sale_user_idx ON orders (sale_id, user_id);

-- What the expiry sweep looks for: pending orders, soonest expiry first.
CREATE INDEX orders_pending_expiry_idx ON orders (expires_at)
    WHERE status = 'pending_payment';

-- Every strategy writes its orders with the same `INSERT INTO orders
-- (sale_id, user_id, quantity)`; this trigger gives the order of a sale with
-- a payment window its status and expiry, so that no strategy's statement
-- has to know about payment. It reads the sale row its transaction has
-- usually just updated (a primary-key lookup, no lock).
CREATE FUNCTION orders_payment_window() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    window_ms integer;
BEGIN
    SELECT payment_window_ms INTO window_ms FROM sales WHERE id = NEW.sale_id;
    IF window_ms IS NOT NULL THEN
        NEW.status := 'pending_payment';
        NEW.expires_at := NEW.created_at + window_ms * interval '1 millisecond';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER orders_payment_window BEFORE INSERT ON orders
    FOR EACH ROW EXECUTE FUNCTION orders_payment_window();

-- `queue` sales: a buyer's request row stands for their order. When that
-- order ends unpaid, its request becomes `returned` (in the same transaction
-- as the order's end) and no longer holds the buyer's place: the buyer may
-- send a new request, and one request per buyer and sale holds among the
-- others. A message of the old request redelivered later finds it settled.
ALTER TABLE purchase_requests DROP CONSTRAINT purchase_requests_status_check;
ALTER TABLE purchase_requests ADD CONSTRAINT purchase_requests_status_check
    CHECK (status IN ('pending', 'placed', 'sold_out', 'already_purchased', 'rejected',
                      'returned'));
ALTER TABLE purchase_requests DROP CONSTRAINT purchase_requests_sale_user_key;
CREATE UNIQUE INDEX purchase_requests_sale_user_key ON purchase_requests (sale_id, user_id)
    WHERE status <> 'returned';
