-- distlock's PostgreSQL schema, version 6: the tables, the sequence and the
-- functions the default lock needs. Idempotent: `build()` runs it when the
-- version row is missing or older, and a DBA may run it by hand (`distlock
-- schema` prints it) for a role that may not create objects. Version 2
-- replaces functions of version 1 (same tables): write_acquire, read_acquire
-- and acquire_all wait for a renewal of the lock that is in flight before
-- judging it (see write_acquire), and the sweeps take each key's
-- transaction lock. Version 3 (same tables) does the same in shared_release,
-- permit_give_back and permit_split, which read their own hold: a renewal in
-- flight across the lease's end made them report the hold lost and leave it
-- held for the renewed lease. Version 4 (same tables) adds renew and
-- shared_renew with a fourth argument, p_exact: false for a renewal, which
-- never shortens a lease (one run late, after an extend to a longer lease,
-- must not end the lock before its holder's deadline), true for an extend,
-- which sets the lease it is given; their three-argument forms, which a
-- running version-3 library calls, now renew without shortening. Version 5
-- (same tables) replaces the sweeps: each tries the transaction locks of
-- the rows it chose (at most its limit) and no others, whatever the plan (a
-- hash join tried every expired row's, and could fill the server's lock
-- table), and a semaphore's family row goes only once no hold is left at
-- all, expired or not (one being renewed, uncommitted, looked expired).
-- Version 6 (same tables) replaces sweep_shared: it takes the families'
-- transaction locks before the statement that deletes them, whose check for
-- holds then sees every hold committed before those locks (a hold committed
-- while the delete waited for another row was invisible to it).
--
-- Every object lives in one schema, whose name (a plain identifier checked by
-- the client, `distlock` unless the builder names another) is written into
-- this text before it is sent or printed.
--
-- Time is the server's: every expiry is compared with clock_timestamp(), the
-- real time, never now(), which is the start of the transaction. Every
-- function runs in its own short transaction on distlock's own connections.
--
-- Every function that reads a table is PL/pgSQL, even a one-statement read:
-- PostgreSQL 15 plans the body of a LANGUAGE sql function that it cannot
-- inline (these are volatile: clock_timestamp()) at every call, about 0.6 ms
-- for inspect, where PL/pgSQL keeps each statement's plan for the session.
-- `#variable_conflict use_column`: a name that is both a column and an
-- output column means the table's column.
--
-- The functions that change one lock (acquire, release, force_unlock) first
-- take a transaction-scoped advisory lock on the key (class 1684826880,
-- "dlk\0", and hashtext of the lock's name; the two-int4 form, apart from
-- the one-bigint keys most applications use): it serializes the lock's row
-- and its queue for the function's few milliseconds, also while the lock
-- has no row, and is gone at commit. A lock is never held by an advisory
-- lock. The client runs this file in one transaction under the same class's
-- key 0, so that managers starting together create the schema once.
--
-- The renewals (renew, shared_renew) take no advisory lock (one per lease,
-- up to 512 a batch on every renewal, would keep the server's shared lock
-- table busy): they lock the rows they extend. A renewal may check a lease just before it ends and
-- commit just after (a late one, or one whose batch is long). A function
-- that judges a lock free by its expiry must therefore read the row under
-- a row lock (FOR UPDATE by the key alone, not by its expiry: a row the
-- snapshot shows expired would not be locked), or after a statement that
-- took the row lock; then it sees the renewal's commit.

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
  v_token bigint;
  v_since bigint;
BEGIN
  -- One statement drops the expired entries and takes the first live one
  -- out of the queue: a hand-off sits between a holder's release and its
  -- waiter, so each statement saved here shortens it.
  WITH expired AS (
    DELETE FROM __SCHEMA__.waiters WHERE name = p_name AND expires_at <= p_now
  ), head AS (
    SELECT h.owner FROM __SCHEMA__.waiters h
      WHERE h.name = p_name AND h.expires_at > p_now ORDER BY h.arrival LIMIT 1
  )
  DELETE FROM __SCHEMA__.waiters x USING head
    WHERE x.name = p_name AND x.owner = head.owner
    RETURNING x.* INTO w;
  IF NOT FOUND THEN
    RETURN false;
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
    VALUES (p_name, w.owner, CASE WHEN w.fence THEN nextval('__SCHEMA__.fencing') ELSE 0 END,
      p_now + w.ttl_ms * interval '1 millisecond', v_since, w.holder,
      EXISTS (SELECT 1 FROM __SCHEMA__.waiters WHERE name = p_name), w.handoff)
    ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, token = excluded.token,
      expires_at = excluded.expires_at, since_ms = excluded.since_ms,
      holder = excluded.holder, queued = excluded.queued, handoff = excluded.handoff
    RETURNING l.token INTO v_token;
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
  v_queue boolean;
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
    IF p_waiting THEN
      -- Held by another, and this call grants nothing: it only queues the
      -- caller (and marks the lock waited for). That commit need not wait
      -- for its WAL flush, which would hold the key's advisory lock, and so
      -- the holder's release, for the flush. Lost in a crash, the entry is
      -- made again by the waiter's next attempt; a later commit that relied
      -- on it (a hand-off to this waiter) flushes it first, as WAL is
      -- flushed in order. A call that grants or hands the lock on commits
      -- as the session does.
      PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
  ELSE
    -- A free lock with an empty queue (every uncontended acquisition) reads
    -- the queue once; only a queue with entries is cleaned of expired ones
    -- and read again. The key's transaction lock keeps it as read.
    SELECT w.owner INTO v_head FROM __SCHEMA__.waiters w WHERE w.name = p_name
      ORDER BY w.arrival LIMIT 1;
    v_queue := FOUND;
    IF v_queue THEN
      DELETE FROM __SCHEMA__.waiters WHERE name = p_name AND expires_at <= v_now;
      SELECT w.owner INTO v_head FROM __SCHEMA__.waiters w WHERE w.name = p_name
        ORDER BY w.arrival LIMIT 1;
    END IF;
    IF v_head IS NULL OR v_head = p_owner THEN
      IF v_head IS NOT NULL THEN
        DELETE FROM __SCHEMA__.waiters WHERE name = p_name AND owner = p_owner;
      END IF;
      o_token := CASE WHEN p_fence THEN nextval('__SCHEMA__.fencing') ELSE 0 END;
      INSERT INTO __SCHEMA__.locks AS l
          (name, owner, token, expires_at, since_ms, holder, queued, handoff)
        VALUES (p_name, p_owner, o_token, v_now + p_lease_ms * interval '1 millisecond',
          p_since_ms, p_holder,
          v_queue AND EXISTS (SELECT 1 FROM __SCHEMA__.waiters WHERE name = p_name),
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
    -- Marked, so that the holder's release hands the lock over. Unlike
    -- acquire.lua, no notice to the holder's manager: one release function
    -- serves both cases here (the client has no free release to skip), and
    -- a NOTIFY wakes every listening session of the database and takes the
    -- instance-wide notification lock at commit.
    IF NOT r.queued THEN
      UPDATE __SCHEMA__.locks SET queued = true WHERE name = p_name;
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
-- lease ran out. Bounded, so that one call never holds many row locks. Each
-- row goes only under its key's transaction lock, tried rather than waited
-- for (a busy key is left for the next sweep), as in sweep_shared: a
-- hand-off never sees the queue entry it chose vanish under it (it would
-- then free the lock with live waiters queued behind), and the sweep's
-- deletes never meet a key's own in another order (a deadlock).
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
  -- Each DELETE tries the transaction locks in a CTE over the rows it chose
  -- (LIMIT p_limit), evaluated once (a CTE that calls a volatile function is
  -- never inlined; before PostgreSQL 12 none was): on those rows only, where
  -- a condition on the deleted table could be evaluated on every row its
  -- scan reads, as under a hash join.
  FOR v_name IN
    WITH d AS (
      SELECT c.name FROM (SELECT name FROM __SCHEMA__.locks
                          WHERE expires_at <= clock_timestamp() LIMIT p_limit) c
      WHERE pg_try_advisory_xact_lock(1684826880, hashtext(c.name)))
    DELETE FROM __SCHEMA__.locks l USING d
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
  WITH d AS (
    SELECT c.name, c.owner FROM (SELECT name, owner FROM __SCHEMA__.waiters
                                 WHERE expires_at <= clock_timestamp() LIMIT p_limit) c
    WHERE pg_try_advisory_xact_lock(1684826880, hashtext(c.name)))
  DELETE FROM __SCHEMA__.waiters w USING d
    WHERE w.name = d.name AND w.owner = d.owner AND w.expires_at <= clock_timestamp();
  GET DIAGNOSTICS v_waiters = ROW_COUNT;
  RETURN v_locks + v_waiters;
END $$;

-- Renews a batch of leases in one statement: element i of the arrays is one
-- lease (the lock's name, its owner token, the lease in ms). Returns one row
-- per lease, in order: (i, renewed), renewed false when the lock is gone,
-- expired or another owner's (the holder has lost it). With p_exact (an
-- extend) the lease ends the given time from now, sooner or later than it
-- did; without, at the later of that and the end it had (a renewal).
--
-- One UPDATE per lease, by its key, rather than one UPDATE joined with the
-- batch: the join's plan rests on the table's statistics, and a table that
-- grew since its last ANALYZE (a few rows when autovacuum looked, ten
-- thousand locks now) is thought tiny. The plan then scans the whole table
-- for every lease of the batch: 512 leases among 10,000 locks took 800 ms a
-- batch instead of 4, long enough to lose leases. A lookup by primary key
-- stays one index probe whatever the statistics say; it costs about 1.6x the
-- join at its best (5.8 against 3.5 ms for 512 leases), and never more.
CREATE OR REPLACE FUNCTION __SCHEMA__.renew(
  p_names text[], p_owners text[], p_lease_ms bigint[], p_exact boolean)
RETURNS TABLE (i bigint, renewed boolean) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  v record;
BEGIN
  FOR v IN SELECT t.name, t.owner, t.lease_ms, t.i
           FROM unnest(p_names, p_owners, p_lease_ms) WITH ORDINALITY AS t(name, owner, lease_ms, i)
           ORDER BY t.i
  LOOP
    UPDATE __SCHEMA__.locks l
      SET expires_at = CASE WHEN p_exact
                         THEN clock_timestamp() + v.lease_ms * interval '1 millisecond'
                         ELSE greatest(l.expires_at,
                                       clock_timestamp() + v.lease_ms * interval '1 millisecond')
                       END
      WHERE l.name = v.name AND l.owner = v.owner AND l.expires_at > clock_timestamp();
    i := v.i;
    renewed := FOUND;
    RETURN NEXT;
  END LOOP;
END $$;

-- Version 3's form, for a version-3 library still running while this one
-- migrates the schema: a renewal, which never shortens.
CREATE OR REPLACE FUNCTION __SCHEMA__.renew(p_names text[], p_owners text[], p_lease_ms bigint[])
RETURNS TABLE (i bigint, renewed boolean) LANGUAGE plpgsql AS $$
BEGIN
  RETURN QUERY SELECT * FROM __SCHEMA__.renew(p_names, p_owners, p_lease_ms, false);
END $$;

-- Issues `p_owner`'s fencing token if it holds the lock and has none, or
-- reads the one it has. NULL when the lock is not `p_owner`'s.
CREATE OR REPLACE FUNCTION __SCHEMA__.issue_token(p_name text, p_owner text)
RETURNS bigint LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  v_token bigint;
BEGIN
  UPDATE __SCHEMA__.locks
    SET token = CASE WHEN token = 0 THEN nextval('__SCHEMA__.fencing') ELSE token END
    WHERE name = p_name AND owner = p_owner AND expires_at > clock_timestamp()
    RETURNING token INTO v_token;
  RETURN v_token;
END $$;

-- Reads a lock for an operator: its value in the Redis store's format
-- ("<owner><mark><token>:<since>:<holder>", mark '+' when someone queued)
-- and the ms left of its lease (both NULL when nobody holds it), its queue
-- in arrival order (owner tokens, and entries
-- "<expiry ms>:<ttl>:<fence 0|1>:<route>:<attempt>:<holder>"), and the
-- server clock in ms. Reads only.
CREATE OR REPLACE FUNCTION __SCHEMA__.inspect(p_name text)
RETURNS TABLE (value text, pttl bigint, queue_owners text[], queue_entries text[], now_ms bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
  RETURN QUERY
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
  LEFT JOIN __SCHEMA__.locks l ON l.name = p_name AND l.expires_at > clock_timestamp();
END $$;

-- The names of the held locks matching the regular expression `p_pattern`
-- (the client translates the Redis glob patterns of `list` into one).
CREATE OR REPLACE FUNCTION __SCHEMA__.scan(p_pattern text)
RETURNS SETOF text LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
  RETURN QUERY
  SELECT name FROM __SCHEMA__.locks
  WHERE name ~ p_pattern AND expires_at > clock_timestamp() ORDER BY name;
END $$;

-- ---------------------------------------------------------------------------
-- Read-write locks and semaphores: shared holds.
--
-- The protocol is the Redis scripts' (write_acquire.lua, read_acquire.lua,
-- permit_acquire.lua and their releases), so that the waiting layer above is
-- the same: the same replies, the same wake-ups ('*<owner>' on a read-write
-- lock's channel, '<owner>' or '#<n>:<owner>' on a semaphore's), sent by
-- pg_notify on the channel identifiers the client passes.
--
-- Each function takes the key's transaction lock (class 1684826880, as above)
-- on the family's name: a read-write lock's writer name
-- ("<prefix>rw:{<tag>}:<key>", its readers included) or a semaphore's
-- ("<prefix>sem:{<tag>}:<key>"). force_unlock_shared takes both, the
-- read-write lock's first, and is the only function that takes two.

-- A row per hold: a read-write lock's writer (`kind` 'w') or a reader ('r'),
-- or a semaphore's holder ('p'). `name` is the family's name (above),
-- `owner` the owner token (a weighted permit hold's ends in ":<n>", and
-- `weight` is that n), `token` its fencing token (0 when none was issued),
-- `expires_at` the end of its lease, `since_ms` and `holder` what operators
-- see, `marked` (a writer's) whether someone waited while it held, so that
-- its release wakes them. No index on `expires_at`: renewals stay HOT.
CREATE TABLE IF NOT EXISTS __SCHEMA__.shared_holds (
  name text NOT NULL,
  owner text NOT NULL,
  kind text NOT NULL CHECK (kind IN ('w', 'r', 'p')),
  weight bigint NOT NULL DEFAULT 1,
  token bigint NOT NULL DEFAULT 0,
  expires_at timestamptz NOT NULL,
  since_ms bigint NOT NULL,
  holder text NOT NULL,
  marked boolean NOT NULL DEFAULT false,
  PRIMARY KEY (name, owner)
) WITH (fillfactor = 70);

-- A row per family that needs more than its holds: a read-write lock's
-- waiting writer (`intent_owner` until `intent_expires_at`: while it lasts
-- no new reader enters), a semaphore's permit count (`permits`, the count its
-- holders use; it lives as long as they do) and the largest weight a waiter
-- waits for (`waiting_weight`, see permit_acquire.lua's '?').
CREATE TABLE IF NOT EXISTS __SCHEMA__.shared_keys (
  name text PRIMARY KEY,
  permits bigint,
  waiting_weight bigint NOT NULL DEFAULT 1,
  intent_owner text,
  intent_expires_at timestamptz
);

-- The permits a semaphore holder's owner token stands for: "<owner>:<n>" is
-- a weighted hold of n, a plain owner token one (weight_of in
-- shared_prelude.lua). bigint: a semaphore may have up to 2^32 - 1 permits.
CREATE OR REPLACE FUNCTION __SCHEMA__.weight_of(p_owner text)
RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
  SELECT coalesce(substring(p_owner FROM ':([0-9]{1,18})$')::bigint, 1)
$$;

-- Milliseconds from `p_now` to `p_end`, rounded up, never below 0.
CREATE OR REPLACE FUNCTION __SCHEMA__.ms_until(p_end timestamptz, p_now timestamptz)
RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
  SELECT greatest(0, ceil(extract(epoch FROM p_end - p_now) * 1000))::bigint
$$;

-- One attempt to take the write side of a read-write lock (write_acquire.lua):
-- when no writer holds it and no reader's lease runs. Parameters: the
-- family's name, the owner token, the lease (ms), whether to issue the
-- fencing token, whether the caller waits, its acquisition time (ms since
-- the epoch) and description. Returns (status, token, remaining_ms):
--   (1, token, 0)      ours (fresh, or already ours: a retry whose reply was
--                      lost; its lease starts again)
--   (0, 0, remaining)  another writer holds it, or readers do, `remaining`
--                      more ms; a waiting caller marked the writer, or set
--                      its intent (which keeps new readers out for its lease)
-- Taking the lock clears any intent and marks the hold when there was one,
-- since readers may then wait.
CREATE OR REPLACE FUNCTION __SCHEMA__.write_acquire(
  p_name text, p_owner text, p_lease_ms bigint, p_fence boolean, p_waiting boolean,
  p_since_ms bigint, p_holder text,
  OUT o_status integer, OUT o_token bigint, OUT o_remaining_ms bigint)
LANGUAGE plpgsql AS $$
DECLARE
  w __SCHEMA__.shared_holds%ROWTYPE;
  v_now timestamptz;
  v_last timestamptz;
  v_mark boolean := p_waiting;
BEGIN
  PERFORM pg_advisory_xact_lock(1684826880, hashtext(p_name));
  v_now := clock_timestamp();
  o_token := 0; o_remaining_ms := 0;
  -- First, so that the reads below see a renewal in flight: this DELETE
  -- waits for the row lock of a hold being renewed, then leaves it alone if
  -- the renewal made it live (see the header).
  DELETE FROM __SCHEMA__.shared_holds WHERE name = p_name AND expires_at <= v_now;
  SELECT * INTO w FROM __SCHEMA__.shared_holds
    WHERE name = p_name AND kind = 'w' AND expires_at > v_now;
  IF FOUND THEN
    IF w.owner = p_owner THEN
      UPDATE __SCHEMA__.shared_holds
        SET expires_at = v_now + p_lease_ms * interval '1 millisecond'
        WHERE name = p_name AND owner = p_owner;
      o_status := 1; o_token := w.token;
      RETURN;
    END IF;
    IF p_waiting AND NOT w.marked THEN
      UPDATE __SCHEMA__.shared_holds SET marked = true
        WHERE name = p_name AND owner = w.owner;
    END IF;
    o_status := 0; o_remaining_ms := __SCHEMA__.ms_until(w.expires_at, v_now);
    RETURN;
  END IF;
  SELECT max(expires_at) INTO v_last FROM __SCHEMA__.shared_holds
    WHERE name = p_name AND kind = 'r';
  IF v_last IS NOT NULL THEN
    IF p_waiting THEN
      INSERT INTO __SCHEMA__.shared_keys AS k (name, intent_owner, intent_expires_at)
        VALUES (p_name, p_owner, v_now + p_lease_ms * interval '1 millisecond')
        ON CONFLICT (name) DO UPDATE SET intent_owner = excluded.intent_owner,
          intent_expires_at = excluded.intent_expires_at;
    END IF;
    o_status := 0; o_remaining_ms := __SCHEMA__.ms_until(v_last, v_now);
    RETURN;
  END IF;
  UPDATE __SCHEMA__.shared_keys SET intent_owner = NULL, intent_expires_at = NULL
    WHERE name = p_name AND intent_expires_at > v_now;
  IF FOUND THEN
    v_mark := true;
  END IF;
  o_token := CASE WHEN p_fence THEN nextval('__SCHEMA__.fencing') ELSE 0 END;
  INSERT INTO __SCHEMA__.shared_holds AS h
      (name, owner, kind, weight, token, expires_at, since_ms, holder, marked)
    VALUES (p_name, p_owner, 'w', 1, o_token, v_now + p_lease_ms * interval '1 millisecond',
      p_since_ms, p_holder, v_mark)
    ON CONFLICT (name, owner) DO UPDATE SET kind = excluded.kind, token = excluded.token,
      expires_at = excluded.expires_at, since_ms = excluded.since_ms,
      holder = excluded.holder, marked = excluded.marked;
  o_status := 1;
END $$;

-- One attempt to take a read hold (read_acquire.lua): when no writer holds
-- the lock and none waits (a reader that holds already keeps its place and
-- gets a fresh token). Parameters and reply as write_acquire; busy
-- `remaining` is the writer's lease left, or its intent's.
CREATE OR REPLACE FUNCTION __SCHEMA__.read_acquire(
  p_name text, p_owner text, p_lease_ms bigint, p_fence boolean, p_waiting boolean,
  p_since_ms bigint, p_holder text,
  OUT o_status integer, OUT o_token bigint, OUT o_remaining_ms bigint)
LANGUAGE plpgsql AS $$
DECLARE
  w __SCHEMA__.shared_holds%ROWTYPE;
  v_now timestamptz;
  v_intent timestamptz;
BEGIN
  PERFORM pg_advisory_xact_lock(1684826880, hashtext(p_name));
  v_now := clock_timestamp();
  o_token := 0; o_remaining_ms := 0;
  -- First, for the reason given in write_acquire.
  DELETE FROM __SCHEMA__.shared_holds WHERE name = p_name AND expires_at <= v_now;
  SELECT * INTO w FROM __SCHEMA__.shared_holds
    WHERE name = p_name AND kind = 'w' AND expires_at > v_now;
  IF FOUND THEN
    IF p_waiting AND NOT w.marked THEN
      UPDATE __SCHEMA__.shared_holds SET marked = true
        WHERE name = p_name AND owner = w.owner;
    END IF;
    o_status := 0; o_remaining_ms := __SCHEMA__.ms_until(w.expires_at, v_now);
    RETURN;
  END IF;
  IF NOT EXISTS (SELECT 1 FROM __SCHEMA__.shared_holds
                 WHERE name = p_name AND owner = p_owner AND expires_at > v_now) THEN
    SELECT intent_expires_at INTO v_intent FROM __SCHEMA__.shared_keys
      WHERE name = p_name AND intent_expires_at > v_now;
    IF FOUND THEN
      o_status := 0; o_remaining_ms := __SCHEMA__.ms_until(v_intent, v_now);
      RETURN;
    END IF;
  END IF;
  o_token := CASE WHEN p_fence THEN nextval('__SCHEMA__.fencing') ELSE 0 END;
  INSERT INTO __SCHEMA__.shared_holds AS h
      (name, owner, kind, weight, token, expires_at, since_ms, holder)
    VALUES (p_name, p_owner, 'r', 1, o_token, v_now + p_lease_ms * interval '1 millisecond',
      p_since_ms, p_holder)
    ON CONFLICT (name, owner) DO UPDATE SET kind = excluded.kind, token = excluded.token,
      expires_at = excluded.expires_at, since_ms = excluded.since_ms, holder = excluded.holder;
  o_status := 1;
END $$;

-- One attempt to take `weight_of(p_owner)` permits of a semaphore
-- (permit_acquire.lua): when the live holds leave room under `p_permits`.
-- `p_resize`: replace a different stored count rather than refuse it;
-- `p_waiting_weight`: the most permits a waiter of the caller's manager waits
-- for, recorded when the caller waits (a release wakes once that many may be
-- free). Returns (status, value, remaining_ms):
--   (1, token, left)   ours (a retry of ours keeps it and gets a fresh token),
--                      with `left` permits still free, so that the caller's
--                      manager wakes its next waiter
--   (0, 0, remaining)  too few permits are free; the first holder's lease
--                      ends in `remaining` ms
--   (2, count, 0)      the holders use `count` permits and the caller said
--                      otherwise without resizing
CREATE OR REPLACE FUNCTION __SCHEMA__.permit_acquire(
  p_name text, p_owner text, p_lease_ms bigint, p_fence boolean, p_waiting boolean,
  p_permits bigint, p_resize boolean, p_since_ms bigint, p_holder text,
  p_waiting_weight bigint,
  OUT o_status integer, OUT o_token bigint, OUT o_remaining_ms bigint)
LANGUAGE plpgsql AS $$
DECLARE
  v_now timestamptz;
  v_holders bigint;
  v_held bigint;
  v_first timestamptz;
  v_stored bigint;
  v_recorded bigint;
  v_wanted bigint := __SCHEMA__.weight_of(p_owner);
  v_mine boolean;
  v_count bigint;
BEGIN
  PERFORM pg_advisory_xact_lock(1684826880, hashtext(p_name));
  v_now := clock_timestamp();
  o_token := 0; o_remaining_ms := 0;
  DELETE FROM __SCHEMA__.shared_holds WHERE name = p_name AND expires_at <= v_now;
  SELECT count(*), coalesce(sum(weight), 0), min(expires_at),
         coalesce(bool_or(owner = p_owner), false)
    INTO v_holders, v_held, v_first, v_mine
    FROM __SCHEMA__.shared_holds WHERE name = p_name;
  -- The count and the recorded waiting weight live as long as the holders.
  IF v_holders > 0 THEN
    SELECT permits, waiting_weight INTO v_stored, v_recorded
      FROM __SCHEMA__.shared_keys WHERE name = p_name;
  END IF;
  v_recorded := coalesce(v_recorded, 1);
  IF v_stored IS NOT NULL AND v_stored <> p_permits AND NOT p_resize THEN
    o_status := 2; o_token := v_stored;
    RETURN;
  END IF;
  IF p_waiting THEN
    v_recorded := greatest(v_recorded, v_wanted, p_waiting_weight);
  END IF;
  IF v_mine OR v_held + v_wanted <= p_permits THEN
    o_token := CASE WHEN p_fence THEN nextval('__SCHEMA__.fencing') ELSE 0 END;
    INSERT INTO __SCHEMA__.shared_holds AS h
        (name, owner, kind, weight, token, expires_at, since_ms, holder)
      VALUES (p_name, p_owner, 'p', v_wanted, o_token,
        v_now + p_lease_ms * interval '1 millisecond', p_since_ms, p_holder)
      ON CONFLICT (name, owner) DO UPDATE SET kind = excluded.kind, weight = excluded.weight,
        token = excluded.token, expires_at = excluded.expires_at,
        since_ms = excluded.since_ms, holder = excluded.holder;
    v_count := p_permits;
    o_status := 1;
    -- v_held counts a hold of ours already: a retry replaces it.
    o_remaining_ms := greatest(p_permits - v_held - CASE WHEN v_mine THEN 0 ELSE v_wanted END, 0);
  ELSE
    v_count := CASE WHEN p_resize THEN p_permits ELSE coalesce(v_stored, p_permits) END;
    o_status := 0; o_remaining_ms := __SCHEMA__.ms_until(v_first, v_now);
  END IF;
  INSERT INTO __SCHEMA__.shared_keys AS k (name, permits, waiting_weight)
    VALUES (p_name, v_count, v_recorded)
    ON CONFLICT (name) DO UPDATE SET permits = excluded.permits,
      waiting_weight = excluded.waiting_weight;
END $$;

-- Releases `p_owner`'s hold of the family `p_name` (write_release.lua,
-- read_release.lua, permit_release.lua, after `p_kind`: 'w', 'r' or 'p');
-- with `p_keep_ms` above 0 (the rest of a min_hold) keeps it that long
-- instead. A writer also withdraws its intent. Wake-ups on `p_wake`: a
-- writer's release or withdrawn intent '*<owner>' when someone waited, the
-- last reader's when a writer waits; a permit's '<owner>' or '#<n>:<owner>'
-- when a waiter may now get in (the rule of permit_release.lua). True when
-- the hold was ours.
CREATE OR REPLACE FUNCTION __SCHEMA__.shared_release(
  p_name text, p_kind text, p_owner text, p_keep_ms bigint, p_wake text)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
  h __SCHEMA__.shared_holds%ROWTYPE;
  v_now timestamptz;
  v_holders bigint;
  v_held bigint;
  v_count bigint;
  v_recorded bigint;
BEGIN
  PERFORM pg_advisory_xact_lock(1684826880, hashtext(p_name));
  v_now := clock_timestamp();
  IF p_kind = 'w' THEN
    UPDATE __SCHEMA__.shared_keys SET intent_owner = NULL, intent_expires_at = NULL
      WHERE name = p_name AND intent_owner = p_owner AND intent_expires_at > v_now;
    IF FOUND THEN
      PERFORM pg_notify(p_wake, '*' || p_owner);
    END IF;
  END IF;
  -- The key's holds locked whatever their lease end, which is judged
  -- after: a renewal of this hold in flight is waited for (its commit may
  -- move the end past now; a condition on the end would skip the row as
  -- the snapshot has it, without waiting). All of them, in owner order as
  -- shared_renew locks a batch's rows: the clean-up of expired holds below
  -- then waits for no row, so a renewal batch holding one of them cannot
  -- deadlock with this.
  PERFORM 1 FROM __SCHEMA__.shared_holds WHERE name = p_name ORDER BY owner FOR UPDATE;
  SELECT * INTO h FROM __SCHEMA__.shared_holds
    WHERE name = p_name AND owner = p_owner AND kind = p_kind;
  v_now := clock_timestamp();
  IF h.owner IS NULL OR h.expires_at <= v_now THEN
    DELETE FROM __SCHEMA__.shared_holds WHERE name = p_name AND expires_at <= v_now;
    RETURN false;
  END IF;
  IF p_keep_ms > 0 THEN
    UPDATE __SCHEMA__.shared_holds
      SET expires_at = v_now + p_keep_ms * interval '1 millisecond'
      WHERE name = p_name AND owner = p_owner;
    RETURN true;
  END IF;
  IF p_kind = 'p' THEN
    SELECT count(*), coalesce(sum(weight), 0) INTO v_holders, v_held
      FROM __SCHEMA__.shared_holds WHERE name = p_name AND expires_at > v_now;
    SELECT permits, waiting_weight INTO v_count, v_recorded
      FROM __SCHEMA__.shared_keys WHERE name = p_name;
  END IF;
  DELETE FROM __SCHEMA__.shared_holds
    WHERE name = p_name AND (owner = p_owner OR expires_at <= v_now);
  IF p_kind = 'w' THEN
    IF h.marked THEN
      PERFORM pg_notify(p_wake, '*' || p_owner);
    END IF;
  ELSIF p_kind = 'r' THEN
    IF NOT EXISTS (SELECT 1 FROM __SCHEMA__.shared_holds WHERE name = p_name)
       AND EXISTS (SELECT 1 FROM __SCHEMA__.shared_keys
                   WHERE name = p_name AND intent_expires_at > v_now) THEN
      PERFORM pg_notify(p_wake, '*' || p_owner);
    END IF;
  ELSE
    IF NOT EXISTS (SELECT 1 FROM __SCHEMA__.shared_holds WHERE name = p_name) THEN
      DELETE FROM __SCHEMA__.shared_keys WHERE name = p_name;
    END IF;
    IF coalesce(v_count, 0) - v_held < coalesce(v_recorded, 1) OR v_held <> v_holders THEN
      PERFORM pg_notify(p_wake, CASE WHEN h.weight = 1 THEN p_owner
                                     ELSE '#' || h.weight || ':' || p_owner END);
    END IF;
  END IF;
  RETURN true;
END $$;

-- Gives back part of a weighted semaphore hold and keeps the rest
-- (permit_give_back.lua): the hold is renamed to `p_kept` (whose ":<n>"
-- names the smaller weight), with its lease end, token and details, and one
-- wake-up for the permits that came free. True when the hold was ours.
CREATE OR REPLACE FUNCTION __SCHEMA__.permit_give_back(
  p_name text, p_owner text, p_kept text, p_wake text)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
  v_now timestamptz;
  v_freed bigint := __SCHEMA__.weight_of(p_owner) - __SCHEMA__.weight_of(p_kept);
BEGIN
  PERFORM pg_advisory_xact_lock(1684826880, hashtext(p_name));
  -- Locked first (all the key's holds, in owner order) and judged after,
  -- as in shared_release.
  PERFORM 1 FROM __SCHEMA__.shared_holds WHERE name = p_name ORDER BY owner FOR UPDATE;
  v_now := clock_timestamp();
  UPDATE __SCHEMA__.shared_holds SET owner = p_kept, weight = __SCHEMA__.weight_of(p_kept)
    WHERE name = p_name AND owner = p_owner AND kind = 'p' AND expires_at > v_now;
  IF NOT FOUND THEN
    DELETE FROM __SCHEMA__.shared_holds WHERE name = p_name AND expires_at <= v_now;
    RETURN false;
  END IF;
  PERFORM pg_notify(p_wake, CASE WHEN v_freed = 1 THEN p_owner
                                 ELSE '#' || v_freed || ':' || p_owner END);
  RETURN true;
END $$;

-- Splits a weighted semaphore hold into holds of one permit each, under
-- `p_owners` (permit_split.lua), with the hold's lease end, token and
-- details; nobody is woken (the permits held stay the same). True when the
-- hold was ours; an error, and nothing changed, when `p_owners` are not as
-- many as its permits.
CREATE OR REPLACE FUNCTION __SCHEMA__.permit_split(
  p_name text, p_owner text, p_owners text[])
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
  h __SCHEMA__.shared_holds%ROWTYPE;
  v_now timestamptz;
BEGIN
  PERFORM pg_advisory_xact_lock(1684826880, hashtext(p_name));
  -- Locked and judged as in shared_release: the new holds copy the lease
  -- end, which a renewal in flight may move.
  PERFORM 1 FROM __SCHEMA__.shared_holds WHERE name = p_name ORDER BY owner FOR UPDATE;
  SELECT * INTO h FROM __SCHEMA__.shared_holds
    WHERE name = p_name AND owner = p_owner AND kind = 'p';
  v_now := clock_timestamp();
  IF h.owner IS NULL OR h.expires_at <= v_now THEN
    DELETE FROM __SCHEMA__.shared_holds WHERE name = p_name AND expires_at <= v_now;
    RETURN false;
  END IF;
  IF coalesce(cardinality(p_owners), 0) <> h.weight THEN
    RAISE EXCEPTION 'permit_split: % tokens for a hold of % permits',
      coalesce(cardinality(p_owners), 0), h.weight;
  END IF;
  DELETE FROM __SCHEMA__.shared_holds WHERE name = p_name AND owner = p_owner;
  INSERT INTO __SCHEMA__.shared_holds
      (name, owner, kind, weight, token, expires_at, since_ms, holder)
    SELECT p_name, o, 'p', 1, h.token, h.expires_at, h.since_ms, h.holder
    FROM unnest(p_owners) AS o;
  RETURN true;
END $$;

-- A semaphore's permits held by live holds, and the count they use (NULL
-- when nobody holds one). Reads only.
CREATE OR REPLACE FUNCTION __SCHEMA__.permit_counts(p_name text)
RETURNS TABLE (held bigint, stored bigint) LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
  RETURN QUERY
  SELECT h.held, CASE WHEN h.held > 0 THEN k.permits END
  FROM (SELECT coalesce(sum(weight), 0)::bigint AS held FROM __SCHEMA__.shared_holds
        WHERE name = p_name AND expires_at > clock_timestamp()) h
  LEFT JOIN __SCHEMA__.shared_keys k ON k.name = p_name;
END $$;

-- Renews a batch of shared leases (and writers') in one statement, as
-- `renew` does for the default lock (one UPDATE per lease, by its key, for
-- the reason given there): element i of the arrays is one lease (family
-- name, owner token, lease ms). One row per lease, in order. The rows are
-- locked in (name, owner) order, as force_unlock_shared locks the rows it
-- frees, so that the two cannot deadlock over one key's holds. p_exact as
-- for renew.
CREATE OR REPLACE FUNCTION __SCHEMA__.shared_renew(
  p_names text[], p_owners text[], p_lease_ms bigint[], p_exact boolean)
RETURNS TABLE (i bigint, renewed boolean) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  v record;
  v_renewed boolean[] := '{}';
BEGIN
  FOR v IN SELECT t.name, t.owner, t.lease_ms, t.i
           FROM unnest(p_names, p_owners, p_lease_ms) WITH ORDINALITY AS t(name, owner, lease_ms, i)
           ORDER BY t.name, t.owner
  LOOP
    UPDATE __SCHEMA__.shared_holds h
      SET expires_at = CASE WHEN p_exact
                         THEN clock_timestamp() + v.lease_ms * interval '1 millisecond'
                         ELSE greatest(h.expires_at,
                                       clock_timestamp() + v.lease_ms * interval '1 millisecond')
                       END
      WHERE h.name = v.name AND h.owner = v.owner AND h.expires_at > clock_timestamp();
    v_renewed[v.i] := FOUND;
  END LOOP;
  RETURN QUERY
  SELECT g::bigint, v_renewed[g]
  FROM generate_series(1, coalesce(cardinality(p_names), 0)) AS g ORDER BY g;
END $$;

-- Version 3's form, for a version-3 library still running while this one
-- migrates the schema: a renewal, which never shortens.
CREATE OR REPLACE FUNCTION __SCHEMA__.shared_renew(
  p_names text[], p_owners text[], p_lease_ms bigint[])
RETURNS TABLE (i bigint, renewed boolean) LANGUAGE plpgsql AS $$
BEGIN
  RETURN QUERY SELECT * FROM __SCHEMA__.shared_renew(p_names, p_owners, p_lease_ms, false);
END $$;

-- Issues a writer's fencing token if it has none, or reads the one it has
-- (issue_token.lua on a write lock). NULL when the writer is not `p_owner`.
CREATE OR REPLACE FUNCTION __SCHEMA__.write_issue_token(p_name text, p_owner text)
RETURNS bigint LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  v_token bigint;
BEGIN
  UPDATE __SCHEMA__.shared_holds
    SET token = CASE WHEN token = 0 THEN nextval('__SCHEMA__.fencing') ELSE token END
    WHERE name = p_name AND owner = p_owner AND kind = 'w'
      AND expires_at > clock_timestamp()
    RETURNING token INTO v_token;
  RETURN v_token;
END $$;

-- Frees a read-write lock's (`p_rw`) or a semaphore's (`p_sem`) holds
-- whoever holds them (force_unlock_shared.lua): `p_mode` 'all' (every hold of
-- both, and a waiting writer's intent), or one holder's, `p_owner`: 'write',
-- 'read' or 'permit'. Waiters are told as a release tells them: '*<token>'
-- on `p_rw_wake`, '#<n>:<token>' on `p_sem_wake` (n the permits freed). The
-- holders learn it at their next renewal. How many holds were freed.
CREATE OR REPLACE FUNCTION __SCHEMA__.force_unlock_shared(
  p_rw text, p_sem text, p_rw_wake text, p_sem_wake text, p_token text,
  p_mode text, p_owner text)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
  v_now timestamptz;
  v_rw bigint := 0;
  v_sem bigint := 0;
  v_permits bigint := 0;
BEGIN
  PERFORM pg_advisory_xact_lock(1684826880, hashtext(p_rw));
  PERFORM pg_advisory_xact_lock(1684826880, hashtext(p_sem));
  v_now := clock_timestamp();
  -- The rows in (name, owner) order, as shared_renew locks them.
  PERFORM 1 FROM __SCHEMA__.shared_holds WHERE name IN (p_rw, p_sem)
    ORDER BY name, owner FOR UPDATE;
  IF p_mode IN ('all', 'write', 'read') THEN
    WITH freed AS (
      DELETE FROM __SCHEMA__.shared_holds
        WHERE name = p_rw AND expires_at > v_now
          AND (p_mode = 'all'
               OR (owner = p_owner AND kind = CASE WHEN p_mode = 'write' THEN 'w' ELSE 'r' END))
        RETURNING 1)
    SELECT count(*) INTO v_rw FROM freed;
    IF p_mode = 'all' THEN
      DELETE FROM __SCHEMA__.shared_holds WHERE name = p_rw;
      DELETE FROM __SCHEMA__.shared_keys WHERE name = p_rw;
    END IF;
  END IF;
  IF p_mode IN ('all', 'permit') THEN
    WITH freed AS (
      DELETE FROM __SCHEMA__.shared_holds
        WHERE name = p_sem AND expires_at > v_now AND (p_mode = 'all' OR owner = p_owner)
        RETURNING weight)
    SELECT count(*), coalesce(sum(weight), 0) INTO v_sem, v_permits FROM freed;
    IF NOT EXISTS (SELECT 1 FROM __SCHEMA__.shared_holds
                   WHERE name = p_sem AND expires_at > v_now) THEN
      DELETE FROM __SCHEMA__.shared_holds WHERE name = p_sem;
      DELETE FROM __SCHEMA__.shared_keys WHERE name = p_sem;
    END IF;
  END IF;
  IF v_rw > 0 THEN
    PERFORM pg_notify(p_rw_wake, '*' || p_token);
  END IF;
  IF v_permits > 0 THEN
    PERFORM pg_notify(p_sem_wake, '#' || v_permits || ':' || p_token);
  END IF;
  RETURN v_rw + v_sem;
END $$;

-- Reads a read-write lock's and a semaphore's holds for an operator
-- (inspect_key.lua's part of them): the writer in the lock value's format
-- ("<owner><mark><token>:<since>:<holder>") and its ms left, the readers and
-- the permit holders (owner tokens, lease ends in server ms, details
-- "<token>:<since>:<holder>"; the lease that ends soonest first), whether a
-- writer waits, and the semaphore's count (NULL with no holder). Live holds
-- only; reads only.
CREATE OR REPLACE FUNCTION __SCHEMA__.inspect_shared(p_rw text, p_sem text)
RETURNS TABLE (writer text, writer_pttl bigint, reader_owners text[], reader_ends bigint[],
  reader_details text[], writer_waiting boolean, permit_owners text[], permit_ends bigint[],
  permit_details text[], permit_count bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
  RETURN QUERY
  WITH live AS (
    SELECT h.*, floor(extract(epoch FROM h.expires_at) * 1000)::bigint AS ends_ms,
           h.token || ':' || h.since_ms || ':' || h.holder AS details
    FROM __SCHEMA__.shared_holds h
    WHERE h.name IN (p_rw, p_sem) AND h.expires_at > clock_timestamp())
  SELECT
    (SELECT l.owner || CASE WHEN l.marked THEN '+' ELSE '-' END || l.details
       FROM live l WHERE l.name = p_rw AND l.kind = 'w'),
    (SELECT ceil(extract(epoch FROM l.expires_at - clock_timestamp()) * 1000)::bigint
       FROM live l WHERE l.name = p_rw AND l.kind = 'w'),
    ARRAY(SELECT l.owner FROM live l WHERE l.name = p_rw AND l.kind = 'r'
          ORDER BY l.expires_at, l.owner),
    ARRAY(SELECT l.ends_ms FROM live l WHERE l.name = p_rw AND l.kind = 'r'
          ORDER BY l.expires_at, l.owner),
    ARRAY(SELECT l.details FROM live l WHERE l.name = p_rw AND l.kind = 'r'
          ORDER BY l.expires_at, l.owner),
    EXISTS (SELECT 1 FROM __SCHEMA__.shared_keys k
            WHERE k.name = p_rw AND k.intent_expires_at > clock_timestamp()),
    ARRAY(SELECT l.owner FROM live l WHERE l.name = p_sem ORDER BY l.expires_at, l.owner),
    ARRAY(SELECT l.ends_ms FROM live l WHERE l.name = p_sem ORDER BY l.expires_at, l.owner),
    ARRAY(SELECT l.details FROM live l WHERE l.name = p_sem ORDER BY l.expires_at, l.owner),
    (SELECT k.permits FROM __SCHEMA__.shared_keys k
     WHERE k.name = p_sem AND EXISTS (SELECT 1 FROM live l WHERE l.name = p_sem));
END $$;

-- The family names with live holds matching the regular expression
-- `p_pattern` (as `scan` for the default lock).
CREATE OR REPLACE FUNCTION __SCHEMA__.scan_shared(p_pattern text)
RETURNS SETOF text LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
  RETURN QUERY
  SELECT DISTINCT name FROM __SCHEMA__.shared_holds
  WHERE name ~ p_pattern AND expires_at > clock_timestamp() ORDER BY name;
END $$;

-- Deletes at most `p_limit` expired holds and at most `p_limit` family rows
-- with no hold and no live intent. Each row goes only under its key's
-- transaction lock, tried rather than waited for (a busy key is left for
-- the next sweep), so that no function sees a row vanish under it; only the
-- chosen rows' locks are tried (see sweep). A family goes only once it has
-- no hold at all: a hold this statement's snapshot shows expired may be
-- being renewed (its update uncommitted), and its family's stored count
-- must outlive it; expired holds go first, so a family whose last holds
-- this sweep deleted goes in the same sweep. The families' locks are taken
-- in a statement of their own, before the one that deletes: a statement's
-- snapshot is taken when it starts, so a hold committed after it started
-- and before its lock was taken (the delete waiting for another row, say)
-- would be invisible to its check, and the family would go from under it.
-- The delete's snapshot comes after the locks, which keep new holds out.
-- How many rows went.
CREATE OR REPLACE FUNCTION __SCHEMA__.sweep_shared(p_limit integer)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
  v_holds bigint;
  v_keys bigint;
  v_families text[];
BEGIN
  WITH d AS (
    SELECT c.name, c.owner FROM (SELECT name, owner FROM __SCHEMA__.shared_holds
                                 WHERE expires_at <= clock_timestamp() LIMIT p_limit) c
    WHERE pg_try_advisory_xact_lock(1684826880, hashtext(c.name)))
  DELETE FROM __SCHEMA__.shared_holds h USING d
    WHERE h.name = d.name AND h.owner = d.owner AND h.expires_at <= clock_timestamp();
  GET DIAGNOSTICS v_holds = ROW_COUNT;
  SELECT coalesce(array_agg(c.name), '{}') INTO v_families
    FROM (SELECT name FROM __SCHEMA__.shared_keys s
          WHERE coalesce(s.intent_expires_at <= clock_timestamp(), true)
            AND NOT EXISTS (SELECT 1 FROM __SCHEMA__.shared_holds h
                            WHERE h.name = s.name)
          LIMIT p_limit) c
    WHERE pg_try_advisory_xact_lock(1684826880, hashtext(c.name));
  DELETE FROM __SCHEMA__.shared_keys k
    WHERE k.name = ANY (v_families)
      AND coalesce(k.intent_expires_at <= clock_timestamp(), true)
      AND NOT EXISTS (SELECT 1 FROM __SCHEMA__.shared_holds h WHERE h.name = k.name);
  GET DIAGNOSTICS v_keys = ROW_COUNT;
  RETURN v_holds + v_keys;
END $$;

-- The counting semaphore (counter_acquire.lua, counter_change.lua): a
-- counter of available permits any caller may change, with no holders and
-- no lease, and the acquisitions waiting for permits. Each function takes
-- the counter's transaction lock (as above) on its name
-- ("<prefix>csem:{<tag>}:<key>").

-- A row per counter: `count`, its available permits (negative after a
-- shrink below what is taken). Never expires: only `delete` removes it.
CREATE TABLE IF NOT EXISTS __SCHEMA__.counters (
  name text PRIMARY KEY,
  count bigint NOT NULL
);

-- A row per waiting acquisition of a counter, until `expires_at` (its next
-- attempt refreshes it): a change that makes permits available wakes
-- waiters only while one is registered.
CREATE TABLE IF NOT EXISTS __SCHEMA__.counter_waiters (
  name text NOT NULL,
  owner text NOT NULL,
  expires_at timestamptz NOT NULL,
  PRIMARY KEY (name, owner)
);

-- Takes `p_wanted` permits (positive) when that many are available;
-- otherwise, with `p_register_ms` above 0, registers `p_owner` as waiting
-- for that long. Returns (status, count, waiters): (1, what is left) taken,
-- its registration gone; (0, the count, 0 when there is no counter) not
-- taken; `waiters` the live registrations after the call.
CREATE OR REPLACE FUNCTION __SCHEMA__.counter_acquire(
  p_name text, p_owner text, p_wanted bigint, p_register_ms bigint,
  OUT o_status integer, OUT o_count bigint, OUT o_waiters bigint)
LANGUAGE plpgsql AS $$
DECLARE
  v_now timestamptz;
  v_count bigint;
BEGIN
  PERFORM pg_advisory_xact_lock(1684826880, hashtext(p_name));
  v_now := clock_timestamp();
  SELECT count INTO v_count FROM __SCHEMA__.counters WHERE name = p_name;
  IF v_count IS NOT NULL AND v_count > 0 AND v_count >= p_wanted THEN
    UPDATE __SCHEMA__.counters SET count = count - p_wanted WHERE name = p_name
      RETURNING count INTO o_count;
    DELETE FROM __SCHEMA__.counter_waiters WHERE name = p_name AND owner = p_owner;
    o_status := 1;
  ELSE
    IF p_register_ms > 0 THEN
      DELETE FROM __SCHEMA__.counter_waiters WHERE name = p_name AND expires_at <= v_now;
      INSERT INTO __SCHEMA__.counter_waiters AS w (name, owner, expires_at)
        VALUES (p_name, p_owner, v_now + p_register_ms * interval '1 millisecond')
        ON CONFLICT (name, owner) DO UPDATE SET expires_at = excluded.expires_at;
    END IF;
    o_status := 0; o_count := coalesce(v_count, 0);
  END IF;
  SELECT count(*) INTO o_waiters FROM __SCHEMA__.counter_waiters
    WHERE name = p_name AND expires_at > v_now;
END $$;

-- Changes or reads a counter in one step (counter_change.lua's operations:
-- 'add', 'try_set', 'set', 'drain', 'read', 'delete', with `p_amount`), and
-- notifies "*<p_owner>" on `p_wake` when the change leaves permits
-- available and someone waits. Returns (status, count, waiters) as
-- counter_change.lua: status 1 done, 0 not done, 4 an 'add' that would
-- leave the 64-bit range (nothing changed).
CREATE OR REPLACE FUNCTION __SCHEMA__.counter_change(
  p_name text, p_owner text, p_op text, p_amount bigint, p_wake text,
  OUT o_status integer, OUT o_count bigint, OUT o_waiters bigint)
LANGUAGE plpgsql AS $$
DECLARE
  v_now timestamptz;
  v_count bigint;
  v_wake boolean := false;
BEGIN
  PERFORM pg_advisory_xact_lock(1684826880, hashtext(p_name));
  v_now := clock_timestamp();
  SELECT count INTO v_count FROM __SCHEMA__.counters WHERE name = p_name;
  IF p_op = 'read' THEN
    o_status := CASE WHEN v_count IS NULL THEN 0 ELSE 1 END;
    o_count := coalesce(v_count, 0);
  ELSIF p_op = 'add' THEN
    IF coalesce(v_count, 0)::numeric + p_amount NOT BETWEEN -9223372036854775808
        AND 9223372036854775807 THEN
      o_status := 4; o_count := coalesce(v_count, 0);
    ELSE
      o_count := coalesce(v_count, 0) + p_amount;
      INSERT INTO __SCHEMA__.counters AS c (name, count) VALUES (p_name, o_count)
        ON CONFLICT (name) DO UPDATE SET count = excluded.count;
      o_status := 1; v_wake := p_amount >= 0;
    END IF;
  ELSIF p_op = 'try_set' THEN
    IF v_count IS NOT NULL THEN
      o_status := 0; o_count := v_count;
    ELSE
      INSERT INTO __SCHEMA__.counters (name, count) VALUES (p_name, p_amount);
      o_status := 1; o_count := p_amount; v_wake := true;
    END IF;
  ELSIF p_op = 'set' THEN
    INSERT INTO __SCHEMA__.counters AS c (name, count) VALUES (p_name, p_amount)
      ON CONFLICT (name) DO UPDATE SET count = excluded.count;
    o_status := 1; o_count := p_amount; v_wake := true;
  ELSIF p_op = 'drain' THEN
    IF v_count > 0 THEN
      UPDATE __SCHEMA__.counters SET count = 0 WHERE name = p_name;
      o_status := 1; o_count := v_count;
    ELSE
      o_status := 0; o_count := coalesce(v_count, 0);
    END IF;
  ELSIF p_op = 'delete' THEN
    DELETE FROM __SCHEMA__.counters WHERE name = p_name;
    o_status := CASE WHEN v_count IS NULL THEN 0 ELSE 1 END;
    o_count := coalesce(v_count, 0);
  ELSE
    RAISE EXCEPTION 'counter_change: unknown operation %', p_op;
  END IF;
  SELECT count(*) INTO o_waiters FROM __SCHEMA__.counter_waiters
    WHERE name = p_name AND expires_at > v_now;
  IF v_wake AND o_count > 0 AND o_waiters > 0 THEN
    PERFORM pg_notify(p_wake, '*' || p_owner);
  END IF;
END $$;

-- A counter for an operator: its count (NULL when it does not exist) and
-- its live registrations. Reads only.
CREATE OR REPLACE FUNCTION __SCHEMA__.inspect_counter(p_name text)
RETURNS TABLE (counter bigint, counter_waiters bigint) LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
  RETURN QUERY
  SELECT (SELECT count FROM __SCHEMA__.counters WHERE name = p_name),
         (SELECT count(*) FROM __SCHEMA__.counter_waiters
          WHERE name = p_name AND expires_at > clock_timestamp());
END $$;

-- The counters whose names match the regular expression `p_pattern`.
CREATE OR REPLACE FUNCTION __SCHEMA__.scan_counters(p_pattern text)
RETURNS SETOF text LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
  RETURN QUERY
  SELECT name FROM __SCHEMA__.counters WHERE name ~ p_pattern ORDER BY name;
END $$;

-- Deletes at most `p_limit` registrations that ended, each under its
-- counter's transaction lock, tried (see sweep). How many went.
CREATE OR REPLACE FUNCTION __SCHEMA__.sweep_counters(p_limit integer)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
  v_waiters bigint;
BEGIN
  WITH d AS (
    SELECT c.name, c.owner FROM (SELECT name, owner FROM __SCHEMA__.counter_waiters
                                 WHERE expires_at <= clock_timestamp() LIMIT p_limit) c
    WHERE pg_try_advisory_xact_lock(1684826880, hashtext(c.name)))
  DELETE FROM __SCHEMA__.counter_waiters w USING d
    WHERE w.name = d.name AND w.owner = d.owner AND w.expires_at <= clock_timestamp();
  GET DIAGNOSTICS v_waiters = ROW_COUNT;
  RETURN v_waiters;
END $$;

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
    -- Under the row lock, kept to the commit: a renewal in flight is waited
    -- for (see the header), and none changes the row before the second loop.
    SELECT * INTO r FROM __SCHEMA__.locks WHERE name = p_names[i] FOR UPDATE;
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
    IF v_found AND r.expires_at > v_now AND r.owner = p_owner THEN
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

INSERT INTO __SCHEMA__.version AS v (one, version) VALUES (true, 6)
  ON CONFLICT (one) DO UPDATE SET version = excluded.version WHERE v.version < excluded.version;
