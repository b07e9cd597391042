-- distlock check (PostgreSQL): the tables, sequences and functions that exist
-- in the schema $1, as (kind, name) with kind 'table', 'sequence' or
-- 'function', to compare with the objects distlock's schema SQL creates.
-- Reads the catalogs only, which every role may read.
SELECT CASE c.relkind WHEN 'S' THEN 'sequence' ELSE 'table' END, c.relname::text
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1::text AND c.relkind IN ('r', 'p', 'S')
UNION ALL
SELECT 'function', p.proname::text
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = $1::text
