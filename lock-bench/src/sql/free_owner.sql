-- lock-bench, PostgreSQL pass: the renewal scenario's cleanup, one statement.
-- $1 owner. Deletes every row the owner holds, so that the table does not grow run
-- after run (the other scenarios reuse their few keys).
DELETE FROM bench_lease WHERE owner = $1
