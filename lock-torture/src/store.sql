-- The torture suite's fenced store on PostgreSQL: the role `FENCED_WRITE`
-- (store.rs) plays on Redis. A write is accepted only when its fencing token
-- is at least the highest one accepted before (equal: the same holder writing
-- again); a lower one is rejected and counted. Every write, accepted or not, is
-- appended to a log in the order the server ran it, so the checker can tell
-- which writes took effect whatever the clients saw.
--
-- Run once per store by the test (`PgStore::create`), before any worker
-- connects: concurrent CREATE ... IF NOT EXISTS may fail on a race.

CREATE TABLE IF NOT EXISTS torture_store (
  key text PRIMARY KEY,
  token bigint NOT NULL DEFAULT 0,
  value bigint NOT NULL DEFAULT 0,
  accepted bigint NOT NULL DEFAULT 0,
  rejected bigint NOT NULL DEFAULT 0
);

-- `seq` is taken while the key's row is locked (below), and that lock is held
-- to the commit, so per key the log's order is the order the writes ran in.
CREATE TABLE IF NOT EXISTS torture_store_log (
  seq bigserial PRIMARY KEY,
  key text NOT NULL,
  token bigint NOT NULL,
  value bigint NOT NULL,
  accepted boolean NOT NULL
);

-- Writes `p_value` to `p_key` with fencing token `p_token`; true when it took
-- effect. `p_check` false turns the token check off (the sabotage that the
-- checker must catch): every write is then accepted.
CREATE OR REPLACE FUNCTION torture_fenced_write(
  p_key text, p_token bigint, p_value bigint, p_check boolean)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
  v_seen bigint;
  v_first boolean;
BEGIN
  INSERT INTO torture_store (key) VALUES (p_key) ON CONFLICT (key) DO NOTHING;
  SELECT token, accepted = 0 INTO v_seen, v_first
    FROM torture_store WHERE key = p_key FOR UPDATE;
  -- As on Redis: before any accepted write there is no token to compare with.
  IF p_check AND NOT v_first AND p_token < v_seen THEN
    UPDATE torture_store SET rejected = rejected + 1 WHERE key = p_key;
    INSERT INTO torture_store_log (key, token, value, accepted)
      VALUES (p_key, p_token, p_value, false);
    RETURN false;
  END IF;
  UPDATE torture_store SET token = p_token, value = p_value, accepted = accepted + 1
    WHERE key = p_key;
  INSERT INTO torture_store_log (key, token, value, accepted)
    VALUES (p_key, p_token, p_value, true);
  RETURN true;
END $$;
