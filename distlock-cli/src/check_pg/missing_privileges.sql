-- distlock check (PostgreSQL): the privileges the current role lacks on
-- distlock's schema $1, as (privilege, object) rows; none when it has them
-- all. A manager needs USAGE on the schema; SELECT, INSERT, UPDATE and
-- DELETE on its tables (SELECT only on `version`, which it reads); USAGE on
-- its sequences (nextval); EXECUTE on its functions. The functions run with
-- the caller's rights (not SECURITY DEFINER), hence the table privileges.
SELECT 'USAGE', 'schema ' || $1::text
WHERE NOT has_schema_privilege($1::text, 'USAGE')
UNION ALL
SELECT p.priv, CASE c.relkind WHEN 'S' THEN 'sequence ' ELSE 'table ' END
         || $1::text || '.' || c.relname::text
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
CROSS JOIN LATERAL unnest(CASE
    WHEN c.relkind = 'S' THEN ARRAY['USAGE']
    WHEN c.relname = 'version' THEN ARRAY['SELECT']
    ELSE ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE'] END) AS p(priv)
WHERE n.nspname = $1::text AND c.relkind IN ('r', 'p', 'S')
  AND NOT CASE WHEN c.relkind = 'S' THEN has_sequence_privilege(c.oid, p.priv)
               ELSE has_table_privilege(c.oid, p.priv) END
UNION ALL
SELECT 'EXECUTE', 'function ' || $1::text || '.' || f.proname::text
         || '(' || pg_get_function_identity_arguments(f.oid) || ')'
FROM pg_proc f JOIN pg_namespace n ON n.oid = f.pronamespace
WHERE n.nspname = $1::text AND NOT has_function_privilege(f.oid, 'EXECUTE')
