//! One CPU for the single-task latency scenarios (`uncontended`, `macro`).
//!
//! On this project's machine, a VM with two vCPUs, a round trip between a client
//! thread and redis-server on different vCPUs either finds the other vCPU awake or
//! makes it halt and be woken, at about 70 µs a time: an uncontended cycle took
//! about 30 µs or about 165 µs, and which of the two an implementation got was set
//! by where the scheduler happened to put its threads, per implementation and run.
//! The latency ratios then told which mode each landed in, not what it costs. With
//! the bench's threads and the servers' on one CPU, every implementation's cycle is
//! its own CPU work, the server's and the same thread hand-offs, in every run.
//! (Unpinned, the per-run p50 ratios of distlock to rslock at `3362f04` ranged
//! from 0.23x to 1.01x while the same cycles alone cost the same; pinned, three
//! runs agree within 0.5%.) The many-task scenarios are not pinned (their
//! throughput needs both CPUs), nor is anything through `--link-delay` (a link
//! is the cross-core case itself) or Redlock's `uncontended` (its members
//! answer in parallel). The pin is undone after the scenario.
//!
//! Linux only (`sched_setaffinity`); where it is refused the scenario runs as
//! before and says so in a note.

use std::io;

/// The bench and the given servers confined to one CPU until dropped; then every
/// thread of the bench gets the process's former CPU set back, and each server its
/// own.
pub struct OneCpu {
    pub cpu: usize,
    bench: libc::cpu_set_t,
    servers: Vec<(libc::pid_t, libc::cpu_set_t)>,
}

impl OneCpu {
    /// Confines every thread of this process and of each process in `servers` to
    /// the first CPU this thread may run on.
    pub fn pin(servers: &[u32]) -> io::Result<OneCpu> {
        let bench = affinity(0)?;
        let cpu = (0..libc::CPU_SETSIZE as usize)
            // SAFETY: `bench` is an initialised cpu_set_t and `c` is below CPU_SETSIZE.
            .find(|&c| unsafe { libc::CPU_ISSET(c, &bench) })
            .ok_or_else(|| io::Error::other("this thread may run on no CPU"))?;
        let mut pinned = OneCpu {
            cpu,
            bench,
            servers: Vec::new(),
        };
        let one = only(cpu);
        for &pid in servers {
            let pid = libc::pid_t::try_from(pid).map_err(io::Error::other)?;
            pinned.servers.push((pid, affinity(pid)?));
            for tid in threads(&format!("/proc/{pid}/task"))? {
                set_affinity(tid, &one)?;
            }
        }
        for tid in threads("/proc/self/task")? {
            set_affinity(tid, &one)?;
        }
        Ok(pinned)
    }
}

impl Drop for OneCpu {
    fn drop(&mut self) {
        // Threads started while pinned are in the list too.
        for tid in threads("/proc/self/task").unwrap_or_default() {
            let _ = set_affinity(tid, &self.bench);
        }
        for (pid, set) in &self.servers {
            for tid in threads(&format!("/proc/{pid}/task")).unwrap_or_default() {
                let _ = set_affinity(tid, set);
            }
        }
    }
}

fn only(cpu: usize) -> libc::cpu_set_t {
    // SAFETY: an all-zero cpu_set_t is the empty set; `cpu` is below CPU_SETSIZE
    // (it was found in a set).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        set
    }
}

fn affinity(tid: libc::pid_t) -> io::Result<libc::cpu_set_t> {
    // SAFETY: the set is written by the kernel up to the size passed.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(set)
    }
}

fn set_affinity(tid: libc::pid_t, set: &libc::cpu_set_t) -> io::Result<()> {
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    let rc = unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), set) };
    match rc {
        0 => Ok(()),
        _ => {
            let e = io::Error::last_os_error();
            // A thread that ended since the directory was read.
            if e.raw_os_error() == Some(libc::ESRCH) {
                Ok(())
            } else {
                Err(e)
            }
        }
    }
}

/// The thread ids under `/proc/<pid>/task`.
fn threads(dir: &str) -> io::Result<Vec<libc::pid_t>> {
    let mut tids = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        if let Some(tid) = entry?.file_name().to_str().and_then(|s| s.parse().ok()) {
            tids.push(tid);
        }
    }
    Ok(tids)
}
