use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

pub struct Config {
    pub redis_url: String,
}

#[distributed_lock(key = "k", manager = config.redis_url)]
async fn wrong_manager(config: &Config) -> Result<(), AppError> {
    let _ = config;
    Ok(())
}

fn main() {}
