-- lock-bench, PostgreSQL pass: the lease-row floor's renewal of a batch, one statement.
-- $1 keys (text[]), $2 their tokens (int8[]), $3 owner, $4 lease in seconds (float8).
-- Extends every listed hold still owned (same owner and token); the rows it touched
-- are the holds renewed, the others were lost.
UPDATE bench_lease AS l
SET expires_at = clock_timestamp() + make_interval(secs => $4)
FROM unnest($1::text[], $2::int8[]) AS h(key, token)
WHERE l.key = h.key AND l.token = h.token AND l.owner = $3
