-- Issue 18: why a request was rejected, and the retention of request rows.
--
-- `rejection_reason`: set with `status = 'rejected'`, by the consumer when a
-- request failed `SECKILL_QUEUE_DELIVERY_LIMIT` times, or by the dead-letter
-- consumer for a message the broker dead-lettered (`delivery_limit`, …).
ALTER TABLE purchase_requests ADD COLUMN rejection_reason text;

-- The retention job deletes resolved requests accepted more than
-- `SECKILL_QUEUE_RETENTION_MS` ago, oldest first. Rows are inserted in
-- accept order and `accepted_at` never changes, so a block-range index
-- finds them at the cost of one summary per 128 pages, not one entry per
-- request on the registration path.
CREATE INDEX purchase_requests_accepted_at_brin ON purchase_requests USING brin (accepted_at);
