-- Issue 34: a waiting room in front of a sale (app/src/waiting_room/).
--
-- A sale with a waiting room admits its buyers from a line in arrival
-- order: at most `room_admissions_per_s` a second, at most
-- `room_concurrency` admitted and not yet served at once (the permits of the
-- lock library's semaphore), each admission valid for
-- `room_admission_ttl_ms`. The line itself lives in Redis; these columns are
-- the sale's settings, fixed at creation like the others.
ALTER TABLE sales
    ADD COLUMN room_admissions_per_s integer
        CHECK (room_admissions_per_s BETWEEN 1 AND 1000000),
    ADD COLUMN room_concurrency integer CHECK (room_concurrency BETWEEN 1 AND 1000000),
    ADD COLUMN room_admission_ttl_ms integer
        CHECK (room_admission_ttl_ms BETWEEN 100 AND 600000),
    -- A room has its admission lifetime and at least one of its two bounds;
    -- a sale without one has none of the three.
    ADD CONSTRAINT sales_waiting_room_complete CHECK (
        (room_admission_ttl_ms IS NULL)
        = (room_admissions_per_s IS NULL AND room_concurrency IS NULL));
