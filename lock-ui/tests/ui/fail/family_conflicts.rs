use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

// Options that pick different kinds of lock: each pair is reported once, on
// the later of the two, all at once.
#[distributed_lock(key = "k", mode = "read", permits = 2)]
async fn mode_permits() -> Result<(), AppError> {
    Ok(())
}

// Key lists take exclusive locks only; the list may come first or last.
#[distributed_lock(key = ["a", "b"], mode = "read")]
async fn list_mode() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(permits = 3, key = ["a", "b"])]
async fn permits_list() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "s:{s}" for s in ss, mode = "write")]
async fn for_mode(ss: Vec<u8>) -> Result<(), AppError> {
    let _ = ss;
    Ok(())
}

#[distributed_lock(key = ["a"], mode = "exclusive", permits = 0)]
async fn all_at_once() -> Result<(), AppError> {
    Ok(())
}

fn main() {}
