-- lock-bench, PostgreSQL pass: the renewal scenario's setup, one statement.
-- $1 keys (text[]), $2 owner, $3 lease in seconds (float8). Takes every listed lock
-- (the keys are fresh), each with its own token, and returns key and token.
INSERT INTO bench_lease (key, owner, token, expires_at)
SELECT k, $2, nextval('bench_token'), clock_timestamp() + make_interval(secs => $3)
FROM unnest($1::text[]) AS k
RETURNING key, token
