-- Purchase requests of the `queue` strategy (app/src/strategy/queue/).
--
-- A purchase on a queue sale is accepted (202) with a request id and settled
-- later by the sale's single active consumer; this table is where the client
-- finds the result (GET /sales/{id}/requests/{request_id}) and where the
-- consumer makes a redelivered message idempotent (same id → same result).
--
-- The durable record of an accepted request is its message in a quorum queue
-- (published with a confirm); this row is an index over it. The consumer
-- upserts the row when it settles the request, so a row that never reached
-- disk is recreated from the message.
CREATE TABLE purchase_requests (
    id          uuid        PRIMARY KEY,
    sale_id     bigint      NOT NULL REFERENCES sales (id),
    user_id     bigint      NOT NULL CHECK (user_id >= 0),
    quantity    integer     NOT NULL CHECK (quantity >= 1),
    -- pending | placed | sold_out | already_purchased | rejected
    status      text        NOT NULL DEFAULT 'pending'
                CHECK (status IN ('pending', 'placed', 'sold_out', 'already_purchased', 'rejected')),
    order_id    bigint,
    -- clock_timestamp(): the moment the instance accepted the request (before
    -- its publish), and the moment the consumer's transaction settled it.
    accepted_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    resolved_at timestamptz,
    -- The consumer batch that settled the request (a random id per batch) and
    -- the number of messages in that batch, for the batch-size statistics.
    batch_id    bigint,
    batch_size  integer,
    -- One request per buyer and sale: a resubmission finds the same request.
    CONSTRAINT purchase_requests_sale_user_key UNIQUE (sale_id, user_id)
);

-- The drain check of the load test counts the unresolved requests of a sale.
CREATE INDEX purchase_requests_pending_idx ON purchase_requests (sale_id) WHERE status = 'pending';
