//! The `distlock` binary against private redis-servers (and a private cluster),
//! with locks held by a `LockManager` in the test.

use std::process::Output;
use std::time::{Duration, Instant};

use assert_cmd::Command;
use distlock::{LockGuard, LockManager};
use distlock_testing::{RedisCluster, RedisServer};
use predicates::prelude::*;
use serde_json::Value;

const LEASE: Duration = Duration::from_secs(60);

/// The binary, with no URL from the environment.
fn distlock() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_distlock"));
    for name in ["DISTLOCK_URL", "DISTLOCK_REDIS_URL", "REDIS_URL"] {
        cmd.env_remove(name);
    }
    cmd
}

/// Runs the binary off the runtime's threads, so that the test's manager keeps
/// renewing meanwhile.
async fn run(mut cmd: Command) -> Output {
    tokio::task::spawn_blocking(move || cmd.output().expect("run distlock"))
        .await
        .unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn json(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", stdout(output)))
}

async fn holder(url: &str) -> LockManager {
    LockManager::builder(url)
        .holder("test-holder")
        .build()
        .await
        .unwrap()
}

/// A hold with its fencing token taken at acquisition, so the CLI shows it.
async fn hold(manager: &LockManager, key: &str, lease: Duration) -> LockGuard {
    manager
        .lock(key)
        .lease(lease)
        .eager_fencing(true)
        .acquire()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_shows_held_locks_as_a_table_and_as_json() {
    let redis = RedisServer::spawn().unwrap();
    let url = redis.url();
    let manager = holder(&url).await;

    let empty = run({
        let mut cmd = distlock();
        cmd.args(["--url", &url, "list"]);
        cmd
    })
    .await;
    assert!(empty.status.success(), "{}", stderr(&empty));
    assert_eq!(stdout(&empty), "no locks held under prefix distlock:\n");

    let order = hold(&manager, "order:42", LEASE).await;
    let report = hold(&manager, "report:daily", LEASE).await;

    let table = run({
        let mut cmd = distlock();
        cmd.args(["--url", &url, "list"]);
        cmd
    })
    .await;
    assert!(table.status.success(), "{}", stderr(&table));
    let text = stdout(&table);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    for column in ["KEY", "HOLDER", "TOKEN", "TTL", "HELD FOR", "WAITERS"] {
        assert!(lines[0].contains(column), "{text}");
    }
    assert!(lines[1].starts_with("order:42 "), "{text}");
    assert!(lines[1].contains("test-holder"), "{text}");
    assert!(
        lines[1].contains(&order.fencing_token().await.unwrap().to_string()),
        "{text}"
    );
    assert!(lines[1].ends_with("no"), "{text}");
    assert!(lines[2].starts_with("report:daily "), "{text}");

    let out = run({
        let mut cmd = distlock();
        cmd.args(["--url", &url, "--json", "list"]);
        cmd
    })
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let locks = json(&out);
    let locks = locks.as_array().unwrap();
    assert_eq!(locks.len(), 2);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    for (lock, guard) in locks.iter().zip([&order, &report]) {
        assert_eq!(lock["key"], guard.key());
        assert_eq!(lock["holder"], "test-holder");
        assert_eq!(
            lock["fencing_token"].as_u64(),
            Some(guard.fencing_token().await.unwrap())
        );
        let ttl = lock["ttl_ms"].as_u64().unwrap();
        assert!(ttl > 50_000 && ttl <= 60_000, "{ttl}");
        let since = lock["held_since_ms"].as_u64().unwrap();
        assert!(since <= now_ms && now_ms - since < 30_000, "{since}");
        assert_eq!(lock["waited_for"], false);
    }

    // A pattern selects on the user key.
    let out = run({
        let mut cmd = distlock();
        cmd.args(["--url", &url, "--json", "list", "report:*"]);
        cmd
    })
    .await;
    let locks = json(&out);
    assert_eq!(locks.as_array().unwrap().len(), 1);
    assert_eq!(locks[0]["key"], "report:daily");

    // Another prefix sees none of them.
    let out = run({
        let mut cmd = distlock();
        cmd.args(["--url", &url, "--prefix", "other:", "list"]);
        cmd
    })
    .await;
    assert_eq!(stdout(&out), "no locks held under prefix other:\n");

    order.release().await.unwrap();
    report.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_a_held_lock_and_fails_for_a_free_one() {
    let redis = RedisServer::spawn().unwrap();
    let url = redis.url();
    let manager = holder(&url).await;
    let guard = hold(&manager, "order:7", LEASE).await;

    let out = run({
        let mut cmd = distlock();
        cmd.args(["--url", &url, "inspect", "order:7"]);
        cmd
    })
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("key:        order:7\n"), "{text}");
    assert!(text.contains("holder:     test-holder\n"), "{text}");
    assert!(
        text.contains(&format!(
            "token:      {}\n",
            guard.fencing_token().await.unwrap()
        )),
        "{text}"
    );
    assert!(text.contains("waiters:    no\n"), "{text}");

    let out = run({
        let mut cmd = distlock();
        cmd.args(["--url", &url, "--json", "inspect", "order:7"]);
        cmd
    })
    .await;
    let state = json(&out);
    assert_eq!(state["holds"].as_array().map(Vec::len), Some(1), "{state}");
    assert_eq!(state["holds"][0]["kind"], "lock");
    assert_eq!(
        state["holds"][0]["fencing_token"].as_u64(),
        Some(guard.fencing_token().await.unwrap())
    );

    distlock()
        .args(["--url", &url, "inspect", "order:8"])
        .assert()
        .code(1)
        .stdout("")
        .stderr("order:8 is not locked\n");
    let out = run({
        let mut cmd = distlock();
        cmd.args(["--url", &url, "--json", "inspect", "order:8"]);
        cmd
    })
    .await;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        json(&out),
        serde_json::json!({"key": "order:8", "holds": [], "waiters": [],
            "writer_waiting": false, "permits": null, "counting_permits": null,
            "counting_waiters": 0})
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_is_listed_inspected_and_freed_one_holder_at_a_time() {
    let redis = RedisServer::spawn().unwrap();
    let url = redis.url();
    let manager = holder(&url).await;
    let reader_a = manager.read_lock("doc").acquire().await.unwrap();
    let reader_b = manager.read_lock("doc").acquire().await.unwrap();
    let permits = manager
        .semaphore("pool", 4)
        .weight(3)
        .acquire()
        .await
        .unwrap();
    let lock = hold(&manager, "job", LEASE).await;
    let waiter = tokio::spawn({
        let manager = manager.clone();
        async move {
            manager
                .lock("job")
                .wait(Duration::from_secs(30))
                .acquire()
                .await
                .unwrap()
        }
    });
    // The waiter runs in this process: wait until it is queued.
    let mut queued = false;
    for _ in 0..400 {
        if !manager.inspect_all("job").await.unwrap().waiters.is_empty() {
            queued = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(queued, "the waiter queued");

    let out = run({
        let mut cmd = distlock();
        cmd.args(["--url", &url, "list"]);
        cmd
    })
    .await;
    let text = stdout(&out);
    let rows: Vec<(&str, &str)> = text
        .lines()
        .skip(1)
        .map(|line| {
            let mut cells = line.split_whitespace();
            (cells.next().unwrap(), cells.next().unwrap())
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("doc", "read"),
            ("doc", "read"),
            ("job", "lock"),
            ("pool", "3")
        ],
        "{text}"
    );

    let out = run({
        let mut cmd = distlock();
        cmd.args(["--url", &url, "inspect", "job"]);
        cmd
    })
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("kind:       lock\n"), "{text}");
    assert!(text.contains("queue of job (1):\n"), "{text}");
    assert!(text.contains("   1. test-holder  (hold "), "{text}");

    // One reader of two, by its hold id.
    let out = run({
        let mut cmd = distlock();
        cmd.args(["--url", &url, "--json", "inspect", "doc"]);
        cmd
    })
    .await;
    let state = json(&out);
    let first = state["holds"][0]["hold_id"].as_str().unwrap().to_owned();
    distlock()
        .args(["--url", &url, "unlock", "doc", "--hold", &first])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("read by test-holder"));
    let out = run({
        let mut cmd = distlock();
        cmd.args([
            "--url", &url, "--json", "unlock", "doc", "--hold", &first, "--yes",
        ]);
        cmd
    })
    .await;
    assert_eq!(
        json(&out),
        serde_json::json!({"key": "doc", "was_held": true, "freed": 1})
    );
    let left = manager.inspect_all("doc").await.unwrap();
    assert_eq!(left.holds.len(), 1);
    assert_ne!(left.holds[0].hold_id, first);
    // That hold is gone: asked for again (as a mistyped id would be), nothing
    // is freed and the exit status says so, with --yes too.
    distlock()
        .args(["--url", &url, "unlock", "doc", "--hold", &first, "--yes"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains(format!("doc has no hold {first}")));
    assert_eq!(manager.inspect_all("doc").await.unwrap().holds.len(), 1);

    // The whole key: the semaphore's holder.
    let out = run({
        let mut cmd = distlock();
        cmd.args(["--url", &url, "unlock", "pool", "--yes"]);
        cmd
    })
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("force-unlocked pool (3 permits by test-holder"));
    assert!(!manager.semaphore("pool", 4).is_locked().await.unwrap());

    lock.release().await.unwrap();
    waiter.await.unwrap().release().await.unwrap();
    drop((reader_a, reader_b, permits));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_needs_yes_and_then_the_holder_loses_its_lease() {
    let redis = RedisServer::spawn().unwrap();
    let url = redis.url();
    let manager = holder(&url).await;
    let lease = Duration::from_secs(3);
    let guard = hold(&manager, "job:nightly", lease).await;

    let out = run({
        let mut cmd = distlock();
        cmd.args(["--url", &url, "unlock", "job:nightly"]);
        cmd
    })
    .await;
    assert_eq!(out.status.code(), Some(2));
    assert!(stdout(&out).is_empty());
    let message = stderr(&out);
    assert!(message.contains("--yes"), "{message}");
    assert!(message.contains("test-holder"), "{message}");
    assert!(manager.is_locked("job:nightly").await.unwrap());
    assert!(!guard.is_lost());

    let out = run({
        let mut cmd = distlock();
        cmd.args(["--url", &url, "unlock", "job:nightly", "--yes"]);
        cmd
    })
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("force-unlocked job:nightly"), "{text}");
    assert!(text.contains("test-holder"), "{text}");
    assert!(!manager.is_locked("job:nightly").await.unwrap());

    // The holder learns it at its next renewal, within its lease.
    tokio::time::timeout(lease, guard.lost())
        .await
        .expect("the guard reports its lease lost");
    assert!(guard.release().await.is_err());

    // Again, as JSON: nothing was held.
    let out = run({
        let mut cmd = distlock();
        cmd.args(["--url", &url, "--json", "unlock", "job:nightly", "--yes"]);
        cmd
    })
    .await;
    assert_eq!(
        json(&out),
        serde_json::json!({"key": "job:nightly", "was_held": false, "freed": 0})
    );
    // And without --yes, a free lock is "not locked" (1), not a refusal.
    distlock()
        .args(["--url", &url, "unlock", "job:nightly"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("not locked"));
}

/// A hold asked for by id that goes between the CLI's reading and its
/// unlock (here released by its holder while the reading's reply is on its
/// way) fails the command as a hold not there at the reading does: nothing
/// that was asked for was freed (issue: "was not locked; nothing done", exit
/// 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_of_a_hold_gone_since_it_was_read_fails() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    let redis = RedisServer::spawn().unwrap();
    let manager = holder(&redis.url()).await;
    let guard = hold(&manager, "job:gone", LEASE).await;
    let hold_id = manager.inspect_all("job:gone").await.unwrap().holds[0]
        .hold_id
        .clone();
    let name = manager.redis_names("job:gone").lock;
    // The CLI talks through a link that holds every reply 300 ms (requests
    // pass at once: the start-up check's pipeline of script sources, held
    // chunk by chunk each way, took more than the CLI's 2 s command timeout
    // on a loaded machine), so that the test, watching the server with
    // MONITOR, releases the hold after the reading reached the server and
    // before its reply reaches the CLI.
    let proxy = distlock_testing::FaultProxy::start(redis.addr())
        .await
        .unwrap();
    proxy.set_mode(distlock_testing::FaultMode::DelayReplies(
        Duration::from_millis(300),
    ));
    let mut monitor = tokio::net::TcpStream::connect(redis.addr()).await.unwrap();
    monitor.write_all(b"MONITOR\r\n").await.unwrap();
    let mut monitor = BufReader::new(monitor).lines();
    assert_eq!(monitor.next_line().await.unwrap().as_deref(), Some("+OK"));

    let mut cli = tokio::spawn(run({
        let mut cmd = distlock();
        cmd.args([
            "--url",
            &proxy.url(),
            "unlock",
            "job:gone",
            "--hold",
            &hold_id,
            "--yes",
        ]);
        cmd
    }));
    // The first command naming the lock since MONITOR began is the CLI's
    // reading (the holder's next renewal is a third of its 60 s lease away).
    // It comes after the CLI's manager started (a few round trips of 300 ms:
    // its start-up check, the probe of its wake-up channel); 60 s leave room
    // for a loaded machine, and the CLI's own end (an error) is reported
    // rather than waited out.
    let reading = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = monitor.next_line().await.unwrap() {
            if line.contains(&name) {
                return line;
            }
        }
        panic!("MONITOR ended");
    });
    let seen = tokio::select! {
        seen = reading => seen.expect("the CLI reads the key"),
        out = &mut cli => {
            let out = out.unwrap();
            panic!("the CLI ended before reading the key: {:?}\n{}", out.status, stderr(&out))
        }
    };
    guard.release().await.unwrap();

    let out = cli.await.unwrap();
    assert_eq!(out.status.code(), Some(1), "{seen}\n{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("job:gone has no hold {hold_id} any more")),
        "{}",
        stderr(&out)
    );
    assert!(stdout(&out).is_empty(), "{}", stdout(&out));
}

#[test]
fn check_passes_on_a_private_server() {
    let redis = RedisServer::spawn().unwrap();
    let url = redis.url();
    distlock()
        .args(["--url", &url, "check"])
        .assert()
        .success()
        .stdout(predicate::str::contains("ok    version: "))
        .stdout(predicate::str::contains("ok    cluster mode: disabled"));

    let out = distlock()
        .args(["--url", &url, "--json", "check"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let checks = json(&out);
    let version = checks
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "version")
        .expect("a version entry");
    assert_eq!(version["status"], "ok");

    // A cluster flag against a plain server fails the check.
    distlock()
        .args(["--url", &url, "--cluster", "check"])
        .assert()
        .code(1)
        .stdout(predicate::str::contains("fail"));
}

#[test]
fn check_flags_an_evicting_policy() {
    let redis = RedisServer::spawn_with_args(&["--maxmemory-policy", "allkeys-lru"]).unwrap();
    distlock()
        .args(["--url", &redis.url(), "check"])
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "warn  maxmemory-policy: allkeys-lru",
        ));
}

#[test]
fn an_unreachable_url_fails_fast_without_the_password() {
    let started = Instant::now();
    distlock()
        .args(["--url", "redis://:s3cret@127.0.0.1:1", "list"])
        .timeout(Duration::from_secs(20))
        .assert()
        .code(1)
        .stdout("")
        .stderr(predicate::str::contains("127.0.0.1:1"))
        .stderr(predicate::str::contains("s3cret").not());
    assert!(started.elapsed() < Duration::from_secs(5));

    distlock()
        .args(["--url", "redis://127.0.0.1:1", "check"])
        .assert()
        .code(1)
        .stdout(predicate::str::starts_with("fail  connect: "));
    // A connection string that is no URL (libpq's key/value form) is
    // refused without its password, by `check` and by the other commands.
    let key_values = "host=db user=app password=s3cret dbname=x";
    distlock()
        .args(["--url", key_values, "check"])
        .assert()
        .code(1)
        .stdout(predicate::str::contains("password=***"))
        .stdout(predicate::str::contains("s3cret").not());
    distlock()
        .args(["--url", key_values, "list"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("s3cret").not());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_url_comes_from_redis_url() {
    let redis = RedisServer::spawn().unwrap();
    let url = redis.url();
    let manager = holder(&url).await;
    let guard = hold(&manager, "env:key", LEASE).await;
    let out = run({
        let mut cmd = distlock();
        cmd.env("REDIS_URL", &url).args(["--json", "list"]);
        cmd
    })
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)[0]["key"], "env:key");
    guard.release().await.unwrap();
}

#[test]
fn several_urls_need_cluster() {
    distlock()
        .args(["--url", "redis://127.0.0.1:1,redis://127.0.0.1:2", "list"])
        .assert()
        // A usage error, as clap's own: exit 2.
        .code(2)
        .stderr(predicate::str::contains("--cluster"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_once_prints_the_table() {
    let redis = RedisServer::spawn().unwrap();
    let url = redis.url();
    let manager = holder(&url).await;
    let guard = hold(&manager, "watched", LEASE).await;
    let out = run({
        let mut cmd = distlock();
        cmd.args(["--url", &url, "watch", "--once"]);
        cmd
    })
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("KEY"), "{text}");
    assert!(text.contains("watched"), "{text}");
    assert!(
        !text.contains('\x1b'),
        "no escape codes off a terminal: {text:?}"
    );
    guard.release().await.unwrap();
}

#[test]
fn watch_stops_cleanly_on_ctrl_c() {
    use std::io::{BufRead, BufReader};
    let redis = RedisServer::spawn().unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_distlock"))
        .env_remove("REDIS_URL")
        .args(["--url", &redis.url(), "watch", "--interval", "100ms"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Once it printed a refresh, its Ctrl-C handler is in place.
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert!(line.contains("Ctrl-C"), "{line}");
    let status = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "{status}");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "watch did not stop on SIGINT"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_check_cover_every_master_of_a_cluster() {
    let cluster = RedisCluster::process_wide().unwrap();
    let urls = cluster.urls();
    let manager = LockManager::cluster_builder(urls.clone())
        .holder("cluster-holder")
        .key_prefix("cli-test:")
        .build()
        .await
        .unwrap();
    // Keys on at least two masters.
    let keys = ["a", "b", "c", "d", "e", "f"];
    let masters: std::collections::HashSet<usize> = keys
        .iter()
        .map(|k| cluster.master_of_key(&manager.redis_names(k).lock).unwrap())
        .collect();
    assert!(masters.len() > 1, "the keys should span masters");
    let mut guards = Vec::new();
    for key in keys {
        guards.push(hold(&manager, key, LEASE).await);
    }
    let joined = urls.join(",");
    let out = run({
        let mut cmd = distlock();
        cmd.args([
            "--url",
            &joined,
            "--cluster",
            "--prefix",
            "cli-test:",
            "--json",
            "list",
        ]);
        cmd
    })
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let listed: Vec<String> = json(&out)
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["key"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(listed, keys);

    let out = run({
        let mut cmd = distlock();
        cmd.args(["--url", &urls[0], "--cluster", "check"]);
        cmd
    })
    .await;
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("ok    cluster: 3 master(s)"), "{text}");
    assert_eq!(text.matches("cluster mode [").count(), 3, "{text}");
    for guard in guards {
        guard.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_ca_is_trusted_with_tls_ca() {
    let redis = RedisServer::builder()
        .tls(true)
        .password("s3cret")
        .spawn()
        .unwrap();
    let url = redis.url();
    let ca_path = redis.ca_cert_path().unwrap().to_owned();
    let ca = redis.ca_cert_pem().unwrap().to_vec();
    let manager = LockManager::builder(&url)
        .tls_ca_pem(ca)
        .holder("tls-holder")
        .build()
        .await
        .unwrap();
    let guard = hold(&manager, "secure", LEASE).await;
    let ca_arg = ca_path.to_str().unwrap().to_owned();

    let out = run({
        let mut cmd = distlock();
        cmd.args(["--url", &url, "--tls-ca", &ca_arg, "--json", "list"]);
        cmd
    })
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)[0]["holder"], "tls-holder");

    let out = run({
        let mut cmd = distlock();
        cmd.args(["--url", &url, "--tls-ca", &ca_arg, "check"]);
        cmd
    })
    .await;
    assert!(out.status.success(), "{}", stdout(&out));
    assert!(stdout(&out).contains("ok    version: "), "{}", stdout(&out));

    // Without the CA the certificate is not trusted: exit 1, password hidden.
    let out = run({
        let mut cmd = distlock();
        cmd.args(["--url", &url, "list"]);
        cmd
    })
    .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(!stderr(&out).contains("s3cret"), "{}", stderr(&out));
    guard.release().await.unwrap();
}

/// `valkey://` works as `redis://` does, and `check` names the server it found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_urls_work_and_check_names_the_server() {
    let redis = RedisServer::spawn().unwrap();
    let url = redis.url().replacen("redis://", "valkey://", 1);
    let manager = holder(&redis.url()).await;
    let guard = hold(&manager, "vk:key", LEASE).await;
    let out = run({
        let mut cmd = distlock();
        cmd.args(["--url", &url, "--json", "list"]);
        cmd
    })
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)[0]["key"], "vk:key");
    guard.release().await.unwrap();

    let out = run({
        let mut cmd = distlock();
        cmd.args(["--url", &url, "check"]);
        cmd
    })
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let family = server_family(&redis);
    assert!(
        text.contains(&format!("ok    version: {family} ")),
        "expected the {family} server named: {text}"
    );
}

/// The family of the server the tests run: "valkey" when `INFO server` has a
/// `valkey_version`, "redis" otherwise; a `REDIS_SERVER_BIN` that names a
/// `valkey-server` binary must have started a Valkey.
fn server_family(redis: &RedisServer) -> &'static str {
    let mut conn = redis.blocking_client().unwrap();
    let info: redis::InfoDict = redis::cmd("INFO").arg("server").query(&mut conn).unwrap();
    let family = if info.contains_key(&"valkey_version") {
        "valkey"
    } else {
        "redis"
    };
    if let Some(bin) = std::env::var_os("REDIS_SERVER_BIN") {
        let named_valkey = std::path::Path::new(&bin)
            .file_name()
            .is_some_and(|name| name.to_string_lossy().starts_with("valkey"));
        assert_eq!(
            family == "valkey",
            named_valkey,
            "REDIS_SERVER_BIN={bin:?} started a {family} server"
        );
    }
    family
}

/// `--cluster` takes `valkey://` seeds as it takes `redis://` ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_urls_work_as_cluster_seeds() {
    let cluster = RedisCluster::process_wide().unwrap();
    let urls = cluster.urls();
    let manager = LockManager::cluster_builder(urls.clone())
        .holder("cluster-holder")
        .key_prefix("cli-valkey-test:")
        .build()
        .await
        .unwrap();
    let guard = hold(&manager, "vk:cluster", LEASE).await;
    let seeds: Vec<String> = urls
        .iter()
        .map(|url| url.replacen("redis://", "valkey://", 1))
        .collect();
    assert!(
        seeds.iter().all(|s| s.starts_with("valkey://")),
        "{seeds:?}"
    );
    let out = run({
        let mut cmd = distlock();
        cmd.args([
            "--url",
            &seeds.join(","),
            "--cluster",
            "--prefix",
            "cli-valkey-test:",
            "--json",
            "list",
        ]);
        cmd
    })
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)[0]["key"], "vk:cluster");
    guard.release().await.unwrap();

    let out = run({
        let mut cmd = distlock();
        cmd.args(["--url", &seeds[0], "--cluster", "check"]);
        cmd
    })
    .await;
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("ok    cluster: 3 master(s)"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counting_semaphores_are_listed_inspected_and_given_permits_back() {
    let redis = RedisServer::spawn().unwrap();
    let url = redis.url();
    let manager = holder(&url).await;
    let uploads = manager.counting_semaphore("uploads");
    let cli = |args: &[&str]| {
        let mut cmd = distlock();
        cmd.args(["--url", &url]).args(args);
        cmd
    };

    let missing = run(cli(&["permits", "uploads"])).await;
    assert_eq!(missing.status.code(), Some(1), "{}", stdout(&missing));
    assert!(stderr(&missing).contains("not a counting semaphore"));
    // A change does not create one (a mistyped key would become a semaphore).
    for change in [["--add", "2"], ["--set", "4"]] {
        let refused = run(cli(&["permits", "uploads", change[0], change[1], "--yes"])).await;
        assert_eq!(refused.status.code(), Some(1), "{}", stdout(&refused));
        assert!(
            stderr(&refused).contains("nothing changed"),
            "{}",
            stderr(&refused)
        );
        assert!(!uploads.counts().await.unwrap().exists);
    }

    // Three permits, two of them taken by a process that then crashed.
    assert!(uploads.try_set_permits(3).await.unwrap());
    assert!(uploads.try_acquire(2).await.unwrap());

    let read = run(cli(&["permits", "uploads"])).await;
    assert!(read.status.success(), "{}", stderr(&read));
    assert_eq!(
        stdout(&read),
        "counting semaphore uploads: 1 available, 0 waiting\n"
    );
    let read = json(&run(cli(&["--json", "permits", "uploads"])).await);
    assert_eq!(read["available"], 1);
    assert_eq!(read["exists"], true);

    let inspected = run(cli(&["inspect", "uploads"])).await;
    assert!(inspected.status.success(), "{}", stderr(&inspected));
    assert!(
        stdout(&inspected).contains("counting semaphore: 1 available, 0 waiting"),
        "{}",
        stdout(&inspected)
    );
    let inspected = json(&run(cli(&["--json", "inspect", "uploads"])).await);
    assert_eq!(inspected["counting_permits"], 1);
    assert_eq!(inspected["holds"], serde_json::json!([]));

    let listed = run(cli(&["list"])).await;
    assert!(listed.status.success(), "{}", stderr(&listed));
    let text = stdout(&listed);
    assert!(text.contains("COUNTING SEMAPHORE"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["uploads", "1", "0"]),
        "{text}"
    );

    // Giving the crashed process's permits back needs --yes.
    let refused = run(cli(&["permits", "uploads", "--add", "2"])).await;
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        stderr(&refused).contains("without --yes"),
        "{}",
        stderr(&refused)
    );
    assert_eq!(uploads.available_permits().await.unwrap(), 1);
    let added = run(cli(&["permits", "uploads", "--add", "2", "--yes"])).await;
    assert!(added.status.success(), "{}", stderr(&added));
    assert_eq!(uploads.available_permits().await.unwrap(), 3);
    let set = json(
        &run(cli(&[
            "--json", "permits", "uploads", "--set", "-1", "--yes",
        ]))
        .await,
    );
    assert_eq!(set["available_before"], 3);
    assert_eq!(set["available"], -1);
    assert_eq!(uploads.available_permits().await.unwrap(), -1);
}

/// `distlock list | head -n0`: the reader is gone before the first line; the
/// command stops quietly and successfully, as `ls | head` does (a `print!`
/// would panic: exit 101).
#[test]
fn a_closed_standard_output_ends_the_command_quietly() {
    let redis = RedisServer::spawn().unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_distlock"))
        .env_remove("DISTLOCK_URL")
        .env_remove("DISTLOCK_REDIS_URL")
        .env_remove("REDIS_URL")
        .args(["--url", &redis.url(), "list"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Closed before the command can have written anything: it connects
    // first.
    drop(child.stdout.take());
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{:?}: {}",
        output.status,
        stderr(&output)
    );
    assert!(stderr(&output).is_empty(), "{}", stderr(&output));
}

/// A cluster that lost a master with no replica to take over serves a third
/// of its slots no more: `check --cluster` fails its `cluster` line (the
/// masters that are left would each check fine).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_fails_a_cluster_that_does_not_serve_every_slot() {
    let mut cluster = RedisCluster::builder()
        .masters(3)
        .replicas_per_master(0)
        .spawn()
        .unwrap();
    let urls = cluster.urls();
    let check = || {
        let mut cmd = distlock();
        cmd.args(["--url", &urls[0], "--cluster", "check"]);
        cmd
    };
    let out = run(check()).await;
    assert!(out.status.success(), "{}", stdout(&out));
    // The seed is the first node; the last master goes.
    assert_eq!(urls[0], cluster.nodes()[0].url);
    cluster.kill(2).unwrap();
    // The others mark it failed after the node timeout (2 s): from then on
    // the cluster line fails.
    let started = Instant::now();
    loop {
        let out = run(check()).await;
        let text = stdout(&out);
        if text.contains("fail  cluster: cluster_state:fail") {
            assert!(!out.status.success(), "{text}");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the cluster line never failed:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// An application's ACL user may not run `INFO` (`-@dangerous`): `check`
/// says what it cannot know (warn) and still checks the rest, rather than
/// failing the server for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_warns_when_info_is_refused_and_checks_the_rest() {
    let redis = RedisServer::spawn().unwrap();
    let client = redis::Client::open(redis.url()).unwrap();
    let mut raw = client.get_multiplexed_async_connection().await.unwrap();
    redis::cmd("ACL")
        .arg(&[
            "SETUSER", "app", "reset", "on", ">pw", "~*", "&*", "+@all", "-info",
        ])
        .query_async::<()>(&mut raw)
        .await
        .unwrap();
    let url = redis.url().replacen("redis://", "redis://app:pw@", 1);
    let out = run({
        let mut cmd = distlock();
        cmd.args(["--url", &url, "check"]);
        cmd
    })
    .await;
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("warn  info: INFO refused"), "{text}");
    assert!(text.contains("maxmemory-policy: noeviction"), "{text}");
    // Not logged in at all (NOAUTH) is no refusal of INFO: the check fails.
    let guarded = RedisServer::builder().password("s3cret").spawn().unwrap();
    let anonymous = guarded.url_without_password();
    let out = run({
        let mut cmd = distlock();
        cmd.args(["--url", &anonymous, "check"]);
        cmd
    })
    .await;
    assert!(!out.status.success(), "{}", stdout(&out));
    assert!(!stdout(&out).contains("warn  info"), "{}", stdout(&out));
}
