//! Shared by the examples: where to find a Redis server.
#![allow(dead_code)]

use distlock_testing::RedisServer;

/// The Redis URL to use: `REDIS_URL` when set, otherwise a private redis-server
/// started from PATH (stopped when the returned handle drops). Exits with a
/// message on how to install one when neither is possible.
pub fn redis_url() -> (String, Option<RedisServer>) {
    if let Ok(url) = std::env::var("REDIS_URL") {
        return (url, None);
    }
    match RedisServer::spawn() {
        Ok(server) => (server.url(), Some(server)),
        Err(e) => {
            eprintln!("This example needs Redis: {e}");
            eprintln!("Either set REDIS_URL=redis://host:port, or install redis-server");
            eprintln!(
                "(Debian/Ubuntu: `apt-get install redis-server`, macOS: `brew install redis`)."
            );
            std::process::exit(2);
        }
    }
}

/// The prefix of every key the examples write, so that pointing them at a real
/// server with REDIS_URL does not touch anything else.
pub const PREFIX: &str = "distlock-example:";
