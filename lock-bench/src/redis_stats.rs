//! What the server did, from `INFO commandstats` and `INFO cpu` deltas.
//!
//! `INFO commandstats` counts the commands a script calls (`[0 lua]` in
//! `MONITOR`) as well as the `EVALSHA` itself, so "commands per op" includes
//! script-internal commands; `EVALSHA` calls are reported on their own.

use std::collections::HashMap;

use redis::aio::MultiplexedConnection;

use crate::error::{context, Result};

/// Counters read from one `INFO commandstats cpu`.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    calls: HashMap<String, u64>,
    reads: u64,
    cpu_seconds: f64,
    client_cpu_seconds: f64,
}

/// The difference between two snapshots.
#[derive(Debug, Clone, Copy, Default)]
pub struct Delta {
    /// Every command the server executed, script-internal ones included,
    /// the bench's own `INFO` calls excluded.
    pub commands: u64,
    /// Top-level `EVALSHA` and `EVAL` calls.
    pub scripts: u64,
    /// Socket reads the server made (`total_reads_processed`, Redis 6.0+):
    /// fewer per command means the client's requests arrived batched, each
    /// read's system call shared by several commands.
    pub reads: u64,
    /// `used_cpu_sys + used_cpu_user` of the server process, in seconds.
    pub cpu_seconds: f64,
    /// CPU time of this process (the clients under test), in seconds.
    pub client_cpu_seconds: f64,
}

impl std::ops::AddAssign for Delta {
    fn add_assign(&mut self, o: Delta) {
        self.commands += o.commands;
        self.scripts += o.scripts;
        self.reads += o.reads;
        self.cpu_seconds += o.cpu_seconds;
        self.client_cpu_seconds += o.client_cpu_seconds;
    }
}

impl Snapshot {
    pub async fn take(conn: &mut MultiplexedConnection) -> Result<Snapshot> {
        let text: String = redis::cmd("INFO")
            .arg("commandstats")
            .arg("cpu")
            .arg("stats")
            .query_async(conn)
            .await
            .map_err(context("INFO commandstats cpu stats"))?;
        let mut snap = Snapshot::parse(&text);
        snap.client_cpu_seconds = process_cpu_seconds();
        Ok(snap)
    }

    /// One snapshot of several servers (the masters of a cluster): their
    /// counters and CPU summed; the client CPU is this process's, taken once.
    pub async fn take_all(conns: &mut [MultiplexedConnection]) -> Result<Snapshot> {
        let mut all = Snapshot::default();
        for conn in conns {
            let one = Snapshot::take(conn).await?;
            for (name, calls) in one.calls {
                *all.calls.entry(name).or_insert(0) += calls;
            }
            all.cpu_seconds += one.cpu_seconds;
            all.reads += one.reads;
        }
        all.client_cpu_seconds = process_cpu_seconds();
        Ok(all)
    }

    fn parse(text: &str) -> Snapshot {
        let mut snap = Snapshot::default();
        for line in text.lines() {
            let line = line.trim();
            if let Some(rest) = line.strip_prefix("cmdstat_") {
                let Some((name, fields)) = rest.split_once(':') else {
                    continue;
                };
                let calls = fields
                    .split(',')
                    .find_map(|f| f.strip_prefix("calls="))
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
                snap.calls.insert(name.to_owned(), calls);
            } else if let Some(v) = line.strip_prefix("total_reads_processed:") {
                snap.reads = v.parse().unwrap_or(0);
            } else if let Some(v) = line
                .strip_prefix("used_cpu_sys:")
                .or_else(|| line.strip_prefix("used_cpu_user:"))
            {
                snap.cpu_seconds += v.parse::<f64>().unwrap_or(0.0);
            }
        }
        snap
    }

    /// What happened between `self` (earlier) and `later`.
    pub fn delta(&self, later: &Snapshot) -> Delta {
        let mut d = Delta {
            cpu_seconds: (later.cpu_seconds - self.cpu_seconds).max(0.0),
            client_cpu_seconds: (later.client_cpu_seconds - self.client_cpu_seconds).max(0.0),
            reads: later.reads.saturating_sub(self.reads),
            ..Delta::default()
        };
        for (name, &calls) in &later.calls {
            let before = self.calls.get(name).copied().unwrap_or(0);
            let n = calls.saturating_sub(before);
            if name == "info" {
                continue;
            }
            d.commands += n;
            if name == "evalsha" || name == "eval" {
                d.scripts += n;
            }
        }
        d
    }
}

/// `used_memory` of `INFO memory`, in bytes.
pub async fn used_memory(conn: &mut MultiplexedConnection) -> Result<u64> {
    let text: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(conn)
        .await
        .map_err(context("INFO memory"))?;
    Ok(text
        .lines()
        .find_map(|l| l.trim().strip_prefix("used_memory:"))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0))
}

/// CPU time used by this process (all its threads; not the redis-server child).
pub fn process_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return f64::NAN;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_info_and_subtracts() {
        let a = Snapshot::parse(
            "# Commandstats\r\ncmdstat_evalsha:calls=10,usec=5,usec_per_call=0.5,rejected_calls=0,failed_calls=0\r\n\
             cmdstat_info:calls=3,usec=1\r\n# CPU\r\nused_cpu_sys:1.5\r\nused_cpu_user:2.25\r\n\
             # Stats\r\ntotal_reads_processed:100\r\n",
        );
        let b = Snapshot::parse(
            "cmdstat_evalsha:calls=30,usec=5\r\ncmdstat_hget:calls=20,usec=1\r\n\
             cmdstat_info:calls=9,usec=1\r\nused_cpu_sys:1.75\r\nused_cpu_user:2.5\r\n\
             total_reads_processed:130\r\n",
        );
        let d = a.delta(&b);
        assert_eq!(d.scripts, 20);
        assert_eq!(d.commands, 40);
        assert_eq!(d.reads, 30);
        assert!((d.cpu_seconds - 0.5).abs() < 1e-9);
    }
}
