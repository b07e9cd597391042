-- distlock's PostgreSQL schema, version 1: the tables, the sequence and the
-- functions the default lock needs. Idempotent: `build()` runs it when the
-- version row is missing, and a DBA may run it by hand (`distlock schema`
-- prints it) for a role that may not create objects.
--
-- Every object lives in one schema, whose name (a plain identifier checked by
-- the client, `distlock` unless the builder names another) is written into
-- this text before it is sent or printed.
--
-- Time is the server's: every expiry is compared with clock_timestamp(), the
-- real time, never now(), which is the start of the transaction. Every
-- function runs in its own short transaction on distlock's own connections.
--
-- The functions that change one lock (acquire, release, force_unlock) first
-- take a transaction-scoped advisory lock on the key (class 1684826880,
-- "dlk\0", and hashtext of the lock's name; the two-int4 form, apart from
-- the one-bigint keys most applications use): it serializes the lock's row
-- and its queue for the function's few milliseconds, also while the lock
-- has no row, and is gone at commit. A lock is never held by an advisory
-- lock. The client runs this file in one transaction under the same class's
-- key 0, so that managers starting together create the schema once.

CREATE SCHEMA IF NOT EXISTS __SCHEMA__;

-- One row: the schema version, so that a later release can migrate and an
-- older one can refuse a newer schema.
CREATE TABLE IF NOT EXISTS __SCHEMA__.version (
  one boolean PRIMARY KEY DEFAULT true CHECK (one),
  version integer NOT NULL
);

-- Fencing tokens of every lock: a sequence never goes back, across deleted
-- rows and server restarts, so a key's tokens only grow.
CREATE SEQUENCE IF NOT EXISTS __SCHEMA__.fencing;

-- A row per lock that is held, or was until its lease ran out (the sweep
-- deletes those). `name` is the lock's full name
-- ("<prefix>lock:{<tag>}:<key>"), `owner` the holder's owner token, `token`
-- its fencing token (0 until issued), `expires_at` the end of the lease,
-- `since_ms` the acquisition time (ms since the Unix epoch), `holder` the
-- holder's description, `queued` whether anyone queued while it was held (a
-- release then reads the queue and notifies), `handoff` the LISTEN channel of
-- the holder's manager (where the first waiter's notice goes). No index on
-- `expires_at`, so that renewals are HOT updates.
CREATE TABLE IF NOT EXISTS __SCHEMA__.locks (
  name text PRIMARY KEY,
  owner text NOT NULL,
  token bigint NOT NULL DEFAULT 0,
  expires_at timestamptz NOT NULL,
  since_ms bigint NOT NULL,
  holder text NOT NULL,
  queued boolean NOT NULL DEFAULT false,
  handoff text NOT NULL
) WITH (fillfactor = 70);

-- The default lock's FIFO queue: one row per waiting acquisition. `arrival`
-- orders it; `expires_at` ends the entry unless the waiter's next attempt
-- refreshes it; `ttl_ms` is the lease a hand-off gives, `fence` whether the
-- hand-off issues a token, `route` the waiter's manager's hand-off tag (hex)
-- and `handoff` its LISTEN channel, `attempt` the attempt that last
-- refreshed the entry (echoed by the hand-off), `holder` the description.
CREATE TABLE IF NOT EXISTS __SCHEMA__.waiters (
  name text NOT NULL,
  owner text NOT NULL,
  arrival bigint NOT NULL,
  expires_at timestamptz NOT NULL,
  ttl_ms bigint NOT NULL,
  fence boolean NOT NULL,
  route text NOT NULL,
  handoff text NOT NULL,
  attempt bigint NOT NULL,
  holder text NOT NULL,
  PRIMARY KEY (name, owner)
);
CREATE INDEX IF NOT EXISTS waiters_order ON __SCHEMA__.waiters (name, arrival);
CREATE SEQUENCE IF NOT EXISTS __SCHEMA__.arrivals;

-- Gives the lock `p_name` (free, or being released by its holder) to the
-- first waiter whose entry has not expired, dropping expired entries on the
-- way, and notifies "=<owner>:<token>:<attempt>" on its manager's channel.
-- With an events channel `p_events` (not ''), tells lock events subscribers
-- "expired" first when the row it replaces had run out, then "handed-over"
-- (see lock_event). The caller holds the key's transaction lock. True when
-- someone took it.
CREATE OR REPLACE FUNCTION __SCHEMA__.hand_off(p_name text, p_now timestamptz,
  p_events text DEFAULT '')
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
  w __SCHEMA__.waiters%ROWTYPE;
  v_token bigint := 0;
  v_since bigint;
BEGIN
  DELETE FROM __SCHEMA__.waiters WHERE name = p_name AND expires_at <= p_now;
  SELECT * INTO w FROM __SCHEMA__.waiters WHERE name = p_name ORDER BY arrival LIMIT 1;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  DELETE FROM __SCHEMA__.waiters WHERE name = p_name AND owner = w.owner;
  IF w.fence THEN
    v_token := nextval('__SCHEMA__.fencing');
  END IF;
  -- Nested, so that a manager without lock events never reads the row.
  IF p_events <> '' THEN
    IF EXISTS (SELECT 1 FROM __SCHEMA__.locks WHERE name = p_name AND expires_at <= p_now) THEN
      PERFORM __SCHEMA__.lock_event(p_events, p_name, 'expired');
    END IF;
  END IF;
  v_since := floor(extract(epoch FROM p_now) * 1000)::bigint;
  INSERT INTO __SCHEMA__.locks AS l
      (name, owner, token, expires_at, since_ms, holder, queued, handoff)
    VALUES (p_name, w.owner, v_token, p_now + w.ttl_ms * interval '1 millisecond',
      v_since, w.holder,
      EXISTS (SELECT 1 FROM __SCHEMA__.waiters WHERE name = p_name), w.handoff)
    ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, token = excluded.token,
      expires_at = excluded.expires_at, since_ms = excluded.since_ms,
      holder = excluded.holder, queued = excluded.queued, handoff = excluded.handoff;
  PERFORM pg_notify(w.handoff, '=' || w.owner || ':' || v_token || ':' || w.attempt);
  IF p_events <> '' THEN
    PERFORM __SCHEMA__.lock_event(p_events, p_name,
      'handed-over ' || v_token || ' ' || v_since || ' ' || w.holder);
  END IF;
  RETURN true;
END $$;

-- One attempt to take the default lock (see acquire.lua, whose protocol this
-- mirrors). Parameters: the lock's name; the owner token; the lease (ms);
-- whether to issue the fencing token now; whether the caller waits; its
-- acquisition time (ms since the epoch); its description; the queue lease
-- (ms); the lease a hand-off gives (ms); the caller's manager's hand-off tag
-- and LISTEN channel; the attempt's number; the events channel, '' for a
-- manager without lock events (a takeover of a lease that ran out then tells
-- "expired" before "acquired", see lock_event).
-- Returns (status, token, remaining_ms):
--   (1, token, 0)       ours, freshly taken or already ours (a hand-off, a
--                       retry whose reply was lost); our queue entry is gone
--   (0, 0, remaining)   busy, another owner holds it `remaining` more ms; a
--                       waiting caller is queued (or its entry refreshed)
-- A free lock with a live waiter ahead of the caller goes to that waiter.
CREATE OR REPLACE FUNCTION __SCHEMA__.acquire(
  p_name text, p_owner text, p_lease_ms bigint, p_fence boolean, p_waiting boolean,
  p_since_ms bigint, p_holder text, p_queue_lease_ms bigint, p_handoff_ttl_ms bigint,
  p_route text, p_handoff text, p_attempt bigint, p_events text DEFAULT '',
  OUT o_status integer, OUT o_token bigint, OUT o_remaining_ms bigint)
LANGUAGE plpgsql AS $$
DECLARE
  r __SCHEMA__.locks%ROWTYPE;
  v_now timestamptz;
  v_head text;
  v_found boolean;
BEGIN
  PERFORM pg_advisory_xact_lock(1684826880, hashtext(p_name));
  v_now := clock_timestamp();
  SELECT * INTO r FROM __SCHEMA__.locks WHERE name = p_name FOR UPDATE;
  v_found := FOUND;
  IF v_found AND r.expires_at > v_now THEN
    IF r.owner = p_owner THEN
      UPDATE __SCHEMA__.locks SET expires_at = v_now + p_lease_ms * interval '1 millisecond'
        WHERE name = p_name;
      DELETE FROM __SCHEMA__.waiters WHERE name = p_name AND owner = p_owner;
      o_status := 1; o_token := r.token; o_remaining_ms := 0;
      RETURN;
    END IF;
  ELSE
    DELETE FROM __SCHEMA__.waiters WHERE name = p_name AND expires_at <= v_now;
    SELECT w.owner INTO v_head FROM __SCHEMA__.waiters w WHERE w.name = p_name
      ORDER BY w.arrival LIMIT 1;
    IF v_head IS NULL OR v_head = p_owner THEN
      DELETE FROM __SCHEMA__.waiters WHERE name = p_name AND owner = p_owner;
      o_token := CASE WHEN p_fence THEN nextval('__SCHEMA__.fencing') ELSE 0 END;
      INSERT INTO __SCHEMA__.locks AS l
          (name, owner, token, expires_at, since_ms, holder, queued, handoff)
        VALUES (p_name, p_owner, o_token, v_now + p_lease_ms * interval '1 millisecond',
          p_since_ms, p_holder, EXISTS (SELECT 1 FROM __SCHEMA__.waiters WHERE name = p_name),
          p_handoff)
        ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, token = excluded.token,
          expires_at = excluded.expires_at, since_ms = excluded.since_ms,
          holder = excluded.holder, queued = excluded.queued, handoff = excluded.handoff;
      IF p_events <> '' THEN
        IF v_found THEN
          PERFORM __SCHEMA__.lock_event(p_events, p_name, 'expired');
        END IF;
        PERFORM __SCHEMA__.lock_event(p_events, p_name,
          'acquired ' || o_token || ' ' || p_since_ms || ' ' || p_holder);
      END IF;
      o_status := 1; o_remaining_ms := 0;
      RETURN;
    END IF;
    PERFORM __SCHEMA__.hand_off(p_name, v_now, p_events);
    SELECT * INTO r FROM __SCHEMA__.locks WHERE name = p_name;
  END IF;
  IF p_waiting THEN
    INSERT INTO __SCHEMA__.waiters AS w
        (name, owner, arrival, expires_at, ttl_ms, fence, route, handoff, attempt, holder)
      VALUES (p_name, p_owner, nextval('__SCHEMA__.arrivals'),
        v_now + p_queue_lease_ms * interval '1 millisecond', p_handoff_ttl_ms, p_fence,
        p_route, p_handoff, p_attempt, p_holder)
      ON CONFLICT (name, owner) DO UPDATE SET expires_at = excluded.expires_at,
        ttl_ms = excluded.ttl_ms, fence = excluded.fence, route = excluded.route,
        handoff = excluded.handoff, attempt = excluded.attempt, holder = excluded.holder;
    IF NOT r.queued THEN
      UPDATE __SCHEMA__.locks SET queued = true WHERE name = p_name;
      -- The first waiter of a hold tells the holder's manager, so that its
      -- release hands over at once (see waiting/waited_for.rs).
      PERFORM pg_notify(r.handoff, '!' || r.owner);
    END IF;
  END IF;
  o_status := 0; o_token := 0;
  o_remaining_ms := greatest(0, ceil(extract(epoch FROM r.expires_at - v_now) * 1000))::bigint;
END $$;

-- Releases the lock if `p_owner` holds it (see release.lua): deletes it, or
-- hands it to the first live waiter; with `p_keep_ms` above 0 (the rest of a
-- min_hold) keeps it that long instead. Not ours: withdraws our queue entry,
-- and hands a free lock on. Notifies only when someone queued: the hand-off,
-- or a wake-up "<owner>" on `p_wake` when nobody live is left. With an
-- events channel `p_events` (not ''), tells "released <token>" or the
-- hand-off (see lock_event).
-- Returns true when the lock was ours.
CREATE OR REPLACE FUNCTION __SCHEMA__.release(
  p_name text, p_owner text, p_keep_ms bigint, p_wake text, p_events text DEFAULT '')
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
  r __SCHEMA__.locks%ROWTYPE;
  v_now timestamptz;
  v_held boolean;
BEGIN
  PERFORM pg_advisory_xact_lock(1684826880, hashtext(p_name));
  v_now := clock_timestamp();
  SELECT * INTO r FROM __SCHEMA__.locks WHERE name = p_name FOR UPDATE;
  v_held := FOUND AND r.expires_at > v_now;
  IF v_held AND r.owner = p_owner THEN
    IF p_keep_ms > 0 THEN
      UPDATE __SCHEMA__.locks SET expires_at = v_now + p_keep_ms * interval '1 millisecond'
        WHERE name = p_name;
    ELSIF NOT r.queued THEN
      DELETE FROM __SCHEMA__.locks WHERE name = p_name;
      IF p_events <> '' THEN
        PERFORM __SCHEMA__.lock_event(p_events, p_name, 'released ' || r.token);
      END IF;
    ELSIF NOT __SCHEMA__.hand_off(p_name, v_now, p_events) THEN
      DELETE FROM __SCHEMA__.locks WHERE name = p_name;
      PERFORM pg_notify(p_wake, p_owner);
      IF p_events <> '' THEN
        PERFORM __SCHEMA__.lock_event(p_events, p_name, 'released ' || r.token);
      END IF;
    END IF;
    RETURN true;
  END IF;
  DELETE FROM __SCHEMA__.waiters WHERE name = p_name AND owner = p_owner;
  IF NOT v_held THEN
    PERFORM __SCHEMA__.hand_off(p_name, v_now, p_events);
  END IF;
  RETURN false;
END $$;

-- Frees the lock whoever holds it (or only if `p_only` does, when not ''),
-- then hands it to the first live waiter, or notifies `p_payload` on
-- `p_wake` when nobody is queued. The fencing sequence is untouched, so the
-- next holder's token is larger. With an events channel `p_events` (not
-- ''), tells "force-unlocked <token>", then the hand-off (see lock_event).
-- True when it was held.
CREATE OR REPLACE FUNCTION __SCHEMA__.force_unlock(
  p_name text, p_only text, p_wake text, p_payload text, p_events text DEFAULT '')
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
  r __SCHEMA__.locks%ROWTYPE;
  v_now timestamptz;
BEGIN
  PERFORM pg_advisory_xact_lock(1684826880, hashtext(p_name));
  v_now := clock_timestamp();
  SELECT * INTO r FROM __SCHEMA__.locks WHERE name = p_name FOR UPDATE;
  IF NOT FOUND OR r.expires_at <= v_now OR (p_only <> '' AND r.owner <> p_only) THEN
    RETURN false;
  END IF;
  DELETE FROM __SCHEMA__.locks WHERE name = p_name;
  IF p_events <> '' THEN
    PERFORM __SCHEMA__.lock_event(p_events, p_name, 'force-unlocked ' || r.token);
  END IF;
  IF NOT __SCHEMA__.hand_off(p_name, v_now, p_events) THEN
    PERFORM pg_notify(p_wake, p_payload);
  END IF;
  RETURN true;
END $$;

-- Deletes at most `p_limit` rows of each table that no longer matter: locks
-- whose lease ran out with nobody queued, and queue entries whose queue
-- lease ran out. Bounded, so that one call never holds many row locks.
-- With an events channel `p_events` (not ''), tells "expired" of each lock it
-- deletes (see lock_event): how lock events learn of an expiry that nobody
-- else came across. Returns how many rows went.
CREATE OR REPLACE FUNCTION __SCHEMA__.sweep(p_limit integer, p_events text DEFAULT '')
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
  v_locks bigint := 0;
  v_waiters bigint;
  v_name text;
BEGIN
  FOR v_name IN
    DELETE FROM __SCHEMA__.locks l
      USING (SELECT name FROM __SCHEMA__.locks
             WHERE expires_at <= clock_timestamp() LIMIT p_limit) d
      WHERE l.name = d.name AND l.expires_at <= clock_timestamp()
        AND NOT EXISTS (SELECT 1 FROM __SCHEMA__.waiters w
                        WHERE w.name = l.name AND w.expires_at > clock_timestamp())
      RETURNING l.name
  LOOP
    v_locks := v_locks + 1;
    IF p_events <> '' THEN
      PERFORM __SCHEMA__.lock_event(p_events, v_name, 'expired');
    END IF;
  END LOOP;
  DELETE FROM __SCHEMA__.waiters w
    USING (SELECT name, owner FROM __SCHEMA__.waiters
           WHERE expires_at <= clock_timestamp() LIMIT p_limit) d
    WHERE w.name = d.name AND w.owner = d.owner AND w.expires_at <= clock_timestamp();
  GET DIAGNOSTICS v_waiters = ROW_COUNT;
  RETURN v_locks + v_waiters;
END $$;

-- Renews a batch of leases in one statement: element i of the arrays is one
-- lease (the lock's name, its owner token, the lease in ms). Returns one row
-- per lease, in order: (i, renewed), renewed false when the lock is gone,
-- expired or another owner's (the holder has lost it).
CREATE OR REPLACE FUNCTION __SCHEMA__.renew(p_names text[], p_owners text[], p_lease_ms bigint[])
RETURNS TABLE (i bigint, renewed boolean) LANGUAGE sql AS $$
  WITH input AS (
    SELECT t.name, t.owner, t.lease_ms, t.i
    FROM unnest(p_names, p_owners, p_lease_ms) WITH ORDINALITY AS t(name, owner, lease_ms, i)),
  done AS (
    UPDATE __SCHEMA__.locks l
      SET expires_at = clock_timestamp() + input.lease_ms * interval '1 millisecond'
      FROM input
      WHERE l.name = input.name AND l.owner = input.owner AND l.expires_at > clock_timestamp()
      RETURNING input.i)
  SELECT input.i, EXISTS (SELECT 1 FROM done WHERE done.i = input.i)
  FROM input ORDER BY input.i
$$;

-- Issues `p_owner`'s fencing token if it holds the lock and has none, or
-- reads the one it has. NULL when the lock is not `p_owner`'s.
CREATE OR REPLACE FUNCTION __SCHEMA__.issue_token(p_name text, p_owner text)
RETURNS bigint LANGUAGE sql AS $$
  UPDATE __SCHEMA__.locks
    SET token = CASE WHEN token = 0 THEN nextval('__SCHEMA__.fencing') ELSE token END
    WHERE name = p_name AND owner = p_owner AND expires_at > clock_timestamp()
    RETURNING token
$$;

-- Reads a lock for an operator: its value in the Redis store's format
-- ("<owner><mark><token>:<since>:<holder>", mark '+' when someone queued)
-- and the ms left of its lease (both NULL when nobody holds it), its queue
-- in arrival order (owner tokens, and entries
-- "<expiry ms>:<ttl>:<fence 0|1>:<route>:<attempt>:<holder>"), and the
-- server clock in ms. Reads only.
CREATE OR REPLACE FUNCTION __SCHEMA__.inspect(p_name text)
RETURNS TABLE (value text, pttl bigint, queue_owners text[], queue_entries text[], now_ms bigint)
LANGUAGE sql AS $$
  SELECT l.owner || CASE WHEN l.queued THEN '+' ELSE '-' END || l.token || ':' || l.since_ms
           || ':' || l.holder,
         ceil(extract(epoch FROM l.expires_at - clock_timestamp()) * 1000)::bigint,
         ARRAY(SELECT w.owner FROM __SCHEMA__.waiters w WHERE w.name = p_name ORDER BY w.arrival),
         ARRAY(SELECT floor(extract(epoch FROM w.expires_at) * 1000)::bigint || ':' || w.ttl_ms
                 || ':' || CASE WHEN w.fence THEN 1 ELSE 0 END || ':' || w.route || ':'
                 || w.attempt || ':' || w.holder
               FROM __SCHEMA__.waiters w WHERE w.name = p_name ORDER BY w.arrival),
         floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint
  FROM (SELECT 1) one
  LEFT JOIN __SCHEMA__.locks l ON l.name = p_name AND l.expires_at > clock_timestamp()
$$;

-- The names of the held locks matching the regular expression `p_pattern`
-- (the client translates the Redis glob patterns of `list` into one).
CREATE OR REPLACE FUNCTION __SCHEMA__.scan(p_pattern text)
RETURNS SETOF text LANGUAGE sql AS $$
  SELECT name FROM __SCHEMA__.locks
  WHERE name ~ p_pattern AND expires_at > clock_timestamp() ORDER BY name
$$;

-- ---------------------------------------------------------------------------
-- Lock events (LockManager::events; managers built with lock_events(true)).
--
-- LISTEN takes no patterns, so every lock event of the schema goes on one
-- channel (the client passes its identifier, `p_events`; '' means the
-- manager publishes no events and costs one comparison), and its payload
-- names the lock: "<n> <name> <event>", `n` the number of characters of the
-- lock's stored name, `event` the text Redis publishes on the lock's own
-- events channel ("acquired <token> <since_ms> <holder>", "released
-- <token>", "handed-over <token> <since_ms> <holder>", "force-unlocked
-- <token>", "lost <token>") or "expired". Subscribers filter by prefix and
-- glob themselves.
--
-- An expiry is told by whoever removes or replaces a row whose lease ran
-- out: the periodic sweep (within its interval), or an acquisition or
-- hand-off that takes the lock over ("expired" then "acquired" or
-- "handed-over", in one transaction, so in that order).
--
-- A NOTIFY payload must be shorter than the block size less NAMEDATALEN and
-- 128 bytes (8000 on a stock build): an event whose payload would not fit (a
-- lock name of several kilobytes) is sent as "- <event word>" instead,
-- naming no lock, which subscribers report as one skipped event; the
-- function never fails for it. Returns whether the event was sent whole.
CREATE OR REPLACE FUNCTION __SCHEMA__.lock_event(p_events text, p_name text, p_event text)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
  v_payload text := char_length(p_name) || ' ' || p_name || ' ' || p_event;
BEGIN
  IF octet_length(v_payload) < current_setting('block_size')::integer
       - (current_setting('max_identifier_length')::integer + 1) - 128 THEN
    PERFORM pg_notify(p_events, v_payload);
    RETURN true;
  END IF;
  PERFORM pg_notify(p_events, '- ' || split_part(p_event, ' ', 1));
  RETURN false;
END $$;

-- ---------------------------------------------------------------------------
-- Multi-key locks (`lock_all`): several default locks taken in one call, all
-- or none.
-- ---------------------------------------------------------------------------

-- Takes every lock of `p_names` for `p_owner`, or none (see acquire_all.lua,
-- whose protocol this mirrors; the client sends at most MAX_LOCK_ALL_KEYS
-- names, de-duplicated). First the keys' transaction locks, all of them, in
-- one global order: ascending by the advisory key itself (hashtext of the
-- name), each distinct key once. Ordering by name would not do where names
-- share a hash: with a < b < c and hashtext(a) = hashtext(c), a call for
-- {a, b} would take that key first and one for {b, c} last. With every
-- multi-key call taking its keys in this order and every other function
-- taking one, no two calls wait for each other's keys in a cycle. Row locks, which renew and sweep
-- take in their own order, may still deadlock with this call (SQLSTATE
-- 40P01, the whole call rolled back): the client calls again.
-- A lock is busy when another owner holds it, or when it is free and a live
-- waiter of another owner heads its queue (the lock is handed to that waiter
-- here, as acquire does, and the caller waits for it one lock at a time).
-- Parameters: the locks' names; the owner token; the lease (ms); whether to
-- issue fencing tokens now; the acquisition time (ms since the epoch); the
-- holder's description; the LISTEN channel of the owner's manager (where
-- a first waiter's notice goes); the events channel (see lock_event: '' for
-- none), on which each lock taken is told as acquire tells it ("expired"
-- first where the call replaces an expired row).
-- Returns (status, index, remaining_ms, tokens):
--   (1, 0, 0, tokens)       every lock is ours, `tokens[i]` the fencing token
--                           of `p_names[i]` (0 without fencing): freshly
--                           taken, or already ours (a retried call whose
--                           reply was lost), every lease reset to p_lease_ms
--   (0, i, remaining, NULL) `p_names[i]` (1-based) is busy for `remaining`
--                           more ms; none was taken
CREATE OR REPLACE FUNCTION __SCHEMA__.acquire_all(
  p_names text[], p_owner text, p_lease_ms bigint, p_fence boolean, p_since_ms bigint,
  p_holder text, p_handoff text, p_events text DEFAULT '',
  OUT o_status integer, OUT o_index integer, OUT o_remaining_ms bigint, OUT o_tokens bigint[])
LANGUAGE plpgsql AS $$
DECLARE
  v_key integer;
  v_now timestamptz;
  v_head text;
  v_token bigint;
  v_count integer := coalesce(array_length(p_names, 1), 0);
  v_found boolean;
  r __SCHEMA__.locks%ROWTYPE;
BEGIN
  FOR v_key IN SELECT DISTINCT hashtext(n) FROM unnest(p_names) AS n ORDER BY 1 LOOP
    PERFORM pg_advisory_xact_lock(1684826880, v_key);
  END LOOP;
  v_now := clock_timestamp();
  o_remaining_ms := 0;
  FOR i IN 1 .. v_count LOOP
    SELECT * INTO r FROM __SCHEMA__.locks WHERE name = p_names[i];
    IF FOUND AND r.expires_at > v_now THEN
      CONTINUE WHEN r.owner = p_owner;
    ELSE
      DELETE FROM __SCHEMA__.waiters WHERE name = p_names[i] AND expires_at <= v_now;
      SELECT w.owner INTO v_head FROM __SCHEMA__.waiters w WHERE w.name = p_names[i]
        ORDER BY w.arrival LIMIT 1;
      CONTINUE WHEN v_head IS NULL OR v_head = p_owner;
      PERFORM __SCHEMA__.hand_off(p_names[i], v_now, p_events);
      SELECT * INTO r FROM __SCHEMA__.locks WHERE name = p_names[i];
    END IF;
    o_status := 0; o_index := i;
    o_remaining_ms := greatest(0, ceil(extract(epoch FROM r.expires_at - v_now) * 1000))::bigint;
    RETURN;
  END LOOP;
  o_tokens := '{}';
  FOR i IN 1 .. v_count LOOP
    DELETE FROM __SCHEMA__.waiters WHERE name = p_names[i] AND owner = p_owner;
    SELECT * INTO r FROM __SCHEMA__.locks WHERE name = p_names[i];
    v_found := FOUND;
    IF v_found AND r.expires_at > v_now THEN
      UPDATE __SCHEMA__.locks SET expires_at = v_now + p_lease_ms * interval '1 millisecond'
        WHERE name = p_names[i];
      v_token := r.token;
    ELSE
      v_token := CASE WHEN p_fence THEN nextval('__SCHEMA__.fencing') ELSE 0 END;
      INSERT INTO __SCHEMA__.locks AS l
          (name, owner, token, expires_at, since_ms, holder, queued, handoff)
        VALUES (p_names[i], p_owner, v_token, v_now + p_lease_ms * interval '1 millisecond',
          p_since_ms, p_holder,
          EXISTS (SELECT 1 FROM __SCHEMA__.waiters WHERE name = p_names[i]), p_handoff)
        ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, token = excluded.token,
          expires_at = excluded.expires_at, since_ms = excluded.since_ms,
          holder = excluded.holder, queued = excluded.queued, handoff = excluded.handoff;
      IF p_events <> '' THEN
        IF v_found THEN
          PERFORM __SCHEMA__.lock_event(p_events, p_names[i], 'expired');
        END IF;
        PERFORM __SCHEMA__.lock_event(p_events, p_names[i],
          'acquired ' || v_token || ' ' || p_since_ms || ' ' || p_holder);
      END IF;
    END IF;
    o_tokens := o_tokens || v_token;
  END LOOP;
  o_status := 1; o_index := 0;
END $$;

INSERT INTO __SCHEMA__.version (one, version) VALUES (true, 1) ON CONFLICT (one) DO NOTHING;
