-- lock-bench, PostgreSQL pass: the lease-row floor's acquire, one statement.
-- $1 key, $2 owner, $3 lease in seconds (float8). Takes the row when it is missing,
-- free, or expired by clock_timestamp() (the statement's own time: now() is the
-- transaction's start, which held one lock twice in ShedLock). Returns the new fencing
-- token from the sequence, or no row when the lock is held.
INSERT INTO bench_lease AS l (key, owner, token, expires_at)
VALUES ($1, $2, nextval('bench_token'), clock_timestamp() + make_interval(secs => $3))
ON CONFLICT (key) DO UPDATE
    SET owner = EXCLUDED.owner, token = EXCLUDED.token, expires_at = EXCLUDED.expires_at
    WHERE l.owner IS NULL OR l.expires_at <= clock_timestamp()
RETURNING token
