-- distlock check (PostgreSQL): the server's version, role and the settings
-- that bear on locks, as the current session sees them (so per-role and
-- per-database overrides count). Timeouts in milliseconds; NULL for a
-- setting this server version does not have (idle_session_timeout is 14+).
SELECT current_setting('server_version_num')::int,
       current_setting('server_version'),
       pg_is_in_recovery(),
       current_user::text,
       current_database()::text,
       current_setting('synchronous_commit'),
       current_setting('synchronous_standby_names'),
       (SELECT count(*) FROM pg_stat_replication),
       -- Standbys a commit can wait for now, and those whose state this
       -- role may not read (NULL without pg_read_all_stats / pg_monitor).
       (SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum')),
       (SELECT count(*) FROM pg_stat_replication WHERE sync_state IS NULL),
       (SELECT setting::bigint FROM pg_settings WHERE name = 'idle_session_timeout'),
       (SELECT setting::bigint FROM pg_settings
         WHERE name = 'idle_in_transaction_session_timeout'),
       has_database_privilege(current_database(), 'CREATE'),
       current_setting('default_transaction_isolation'),
       current_setting('default_transaction_read_only')
