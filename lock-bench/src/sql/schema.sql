-- lock-bench, PostgreSQL pass: the lease-row floor's table and token sequence.
-- A stand-in for distlock's own schema until its PostgreSQL backend lands: one row
-- per lock key (owner, fencing token, expiry by the server's clock); a free lock is a
-- row with no owner or an expired lease. Logged (durable) like distlock's table, so a
-- cycle pays the two commits' WAL flushes distlock pays.
CREATE SEQUENCE IF NOT EXISTS bench_token;
CREATE TABLE IF NOT EXISTS bench_lease (
    key text PRIMARY KEY,
    owner text,
    token bigint NOT NULL,
    expires_at timestamptz NOT NULL
);
