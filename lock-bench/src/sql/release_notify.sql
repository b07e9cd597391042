-- lock-bench, PostgreSQL pass: the NOTIFY hand-off floor's release, one statement.
-- $1 key, $2 owner, $3 token, $4 the waiter's channel, $5 the payload. Frees the row
-- and, only when it did, queues a notification to the waiter, delivered at this
-- statement's commit (so the waiter never wakes before the row is free).
WITH freed AS (
    UPDATE bench_lease SET owner = NULL
    WHERE key = $1 AND owner = $2 AND token = $3
    RETURNING key
)
SELECT pg_notify($4, $5) FROM freed
