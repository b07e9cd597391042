#!/usr/bin/env python3
"""Reads handoff_timeline's rounds and perf's scheduler events (see
handoff_timeline.rs for the commands) and prints, for each kind of round
(handoff, ping), medians over the rounds of where the time goes, in
microseconds from the round's start (the holder's release; the PING):

  redis woken    the server's thread is woken (the request arrived)
  redis runs     it is on a CPU
  app woken      the server wakes a thread of the bench (the hand-off's
                 message, the release's reply, the PING's reply)
  app runs       that thread is on a CPU
  done           the waiter's acquire returned, or the PING's reply came
  redis on a CPU the server's time on a CPU within the round

and how many times a thread of the bench was switched in, and woken, within
a round. Usage: handoff_timeline.py ROUNDS TIMELINE [--show N] (--show N:
print the events of the first N rounds of each kind).
"""

import bisect
import statistics
import sys


def read_rounds(path, kind):
    """The server's pid, the bench's, and the rounds of `kind` (handoff, ping)."""
    redis_pid, bench_pid, rounds = None, None, []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if not parts:
                continue
            if parts[0] == "redis":
                redis_pid = int(parts[1])
                bench_pid = int(parts[3]) if len(parts) >= 4 else None
            elif parts[0] == kind and len(parts) == 7:
                _, t0, released, t1, holder, waiter = (int(p) for p in parts[1:])
                rounds.append((t0, released, t1, holder, waiter))
    return redis_pid, bench_pid, rounds


def field(trace, name):
    for part in trace.split():
        if part.startswith(name + "="):
            return part[len(name) + 1:]
    return None


def read_events(path):
    """(time ns, kind, cpu, tid of the current thread, target tid, target
    comm, pid of the current thread)."""
    events = []
    with open(path) as f:
        for line in f:
            head, _, trace = line.partition(": sched:")
            parts = head.split()
            if len(parts) < 3:
                continue
            pid_tid = parts[0]
            pid, _, tid = pid_tid.partition("/")
            tid = int(tid or pid)
            pid = int(pid)
            cpu = int(parts[1].strip("[]"))
            secs = parts[2].rstrip(":")
            whole, _, frac = secs.partition(".")
            time_ns = int(whole) * 1_000_000_000 + int(frac.ljust(9, "0")[:9])
            kind, _, rest = trace.partition(": ")
            # sched_waking: stamped in the waker's context, when it wakes
            # the thread (sched_wakeup may be stamped later, on the woken
            # thread's CPU, with the idle task as the current thread).
            if kind in ("sched_waking", "sched_wakeup"):
                events.append((time_ns, "wakeup", cpu, tid, int(field(rest, "pid")), field(rest, "comm"), pid))
            elif kind == "sched_switch":
                nxt = rest.split("==>")[1]
                events.append((time_ns, "switch", cpu, tid, int(field(nxt, "next_pid")), field(nxt, "next_comm"), pid))
    events.sort()
    return events


def report(kind, rounds, events, redis_pid, bench_pid, show):
    """Prints the medians of one kind of round (see the module's header)."""
    times = [e[0] for e in events]
    app = {tid for r in rounds for tid in (r[3], r[4])}
    # Every thread seen running in the bench's process.
    app |= {e[3] for e in events if e[6] == bench_pid and e[3] != 0}
    marks = {k: [] for k in ("redis woken", "redis runs", "app woken", "app runs", "done")}
    redis_on, switches, wakeups = [], [], []
    for n, (t0, _released, t1, _holder, _waiter) in enumerate(rounds):
        window = events[bisect.bisect_left(times, t0):bisect.bisect_right(times, t1)]
        at, on, on_cpu = {}, None, 0
        for time_ns, kind_, _cpu, tid, target, _comm, _pid in window:
            rel = (time_ns - t0) / 1000
            if kind_ == "wakeup" and target == redis_pid:
                at.setdefault("redis woken", rel)
            elif kind_ == "switch" and target == redis_pid:
                on = time_ns
                if "redis woken" in at:
                    at.setdefault("redis runs", rel)
            elif kind_ == "wakeup" and target in app and tid == redis_pid:
                at.setdefault("app woken", rel)
            elif kind_ == "switch" and target in app and "app woken" in at:
                at.setdefault("app runs", rel)
            if kind_ == "switch" and tid == redis_pid and on is not None:
                on_cpu += time_ns - on
                on = None
        if on is not None:
            on_cpu += t1 - on
        at["done"] = (t1 - t0) / 1000
        for key, value in at.items():
            marks[key].append(value)
        redis_on.append(on_cpu / 1000)
        switches.append(sum(1 for e in window if e[1] == "switch" and e[4] in app))
        wakeups.append(sum(1 for e in window if e[1] == "wakeup" and e[4] in app))
        if n < show:
            print(f"{kind} round {n}: {(t1 - t0) / 1000:.1f} us")
            for time_ns, kind_, cpu, tid, target, comm, _pid in window:
                print(f"  +{(time_ns - t0) / 1000:7.1f} cpu{cpu} {tid:>7} {kind_:6} -> {target} {comm}")
    if not rounds:
        print(f"{kind}: no rounds")
        return
    print(f"{kind}: {len(rounds)} rounds; medians, us from the round's start:")
    for key, values in marks.items():
        if values:
            print(f"  {key:13} {statistics.median(values):8.1f}   (in {len(values)} rounds)")
    print(f"  redis on a CPU {statistics.median(redis_on):8.1f}")
    print(f"  bench threads switched in per round: {statistics.median(switches)}; "
          f"woken: {statistics.median(wakeups)}")


def main():
    events = read_events(sys.argv[2])
    show = int(sys.argv[sys.argv.index("--show") + 1]) if "--show" in sys.argv else 0
    for kind in ("handoff", "ping"):
        redis_pid, bench_pid, rounds = read_rounds(sys.argv[1], kind)
        report(kind, rounds, events, redis_pid, bench_pid, show)


if __name__ == "__main__":
    main()
