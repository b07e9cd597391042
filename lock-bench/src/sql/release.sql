-- lock-bench, PostgreSQL pass: the lease-row floor's release, one statement.
-- $1 key, $2 owner, $3 token. Frees the row only for the hold that owns it (a lease
-- that expired and was taken since is left alone). The row stays: the next acquire
-- updates it instead of inserting.
UPDATE bench_lease SET owner = NULL
WHERE key = $1 AND owner = $2 AND token = $3
