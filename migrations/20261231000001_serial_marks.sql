-- Marks of the serial hold (app/src/strategy/serial.rs): each purchase or
-- batch that takes a stock row's lock writes, in the same UPDATE, the moment
-- it held the lock by Postgres' clock (`held_at`) and the units it took
-- (`held_units`), and moves the previous holder's to `held_before` and
-- `held_units_before`. A purchase whose statement began before the previous
-- holder's mark waited through that holder's whole hold, so the gap between
-- the two marks is that hold: the row's serial time for the previous
-- holder's units, read from Postgres' own clock. Nothing reads the columns
-- back but the statement that writes them; NULL until the row's first
-- purchase.
ALTER TABLE sales
    ADD COLUMN held_at timestamptz, ADD COLUMN held_before timestamptz,
    ADD COLUMN held_units integer, ADD COLUMN held_units_before integer;
ALTER TABLE sale_buckets
    ADD COLUMN held_at timestamptz, ADD COLUMN held_before timestamptz,
    ADD COLUMN held_units integer, ADD COLUMN held_units_before integer;
