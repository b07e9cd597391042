// A free function: the key formats a parameter; literal durations and `renew`.
use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub enum AppError {
    Lock(LockError),
}

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError::Lock(e)
    }
}

#[distributed_lock(key = "order:{order_id}")]
async fn key_only(order_id: u64) -> Result<u64, AppError> {
    Ok(order_id)
}

#[distributed_lock(
    key = "order:{order_id}:{{literal}}",
    lease = "30s",
    wait = "1m 30s",
    renew = false
)]
async fn all_literals(order_id: u64) -> Result<(), AppError> {
    let _ = order_id;
    Ok(())
}

// `"0s"` = a single attempt; fractional milliseconds are kept exactly.
#[distributed_lock(key = "reports:nightly", lease = "1.5s", wait = "0s", renew = true)]
async fn static_key() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "sub-ms", lease = "10ms", wait = "1500us")]
async fn shortest() -> Result<(), AppError> {
    Ok(())
}

// Keys may format any `Display` parameter, several times over, and pattern bindings.
#[distributed_lock(key = "{tenant}/{name}/{tenant}/{a}-{b}")]
async fn several(tenant: &str, name: String, (a, b): (u8, u8)) -> Result<String, AppError> {
    Ok(format!("{tenant}{name}{a}{b}"))
}

fn main() {
    drop(key_only(1));
    drop(all_literals(1));
    drop(static_key());
    drop(shortest());
    drop(several("t", String::new(), (1, 2)));
}
