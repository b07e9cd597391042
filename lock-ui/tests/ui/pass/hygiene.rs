#![deny(warnings)]
// The generated locals cannot clash with the user's names, and the generated
// paths do not depend on what is in scope (local `core`/`std` modules, a
// `Result` alias, shadowed `Ok`/`Err`/`Some`/`None`).
#![allow(non_snake_case)]

mod core {}
mod std {}
#[allow(dead_code)]
mod distlock_shadow {
    pub struct LockManager;
}

use ::distlock::{distributed_lock, LockError};
#[allow(unused_imports)]
use distlock_shadow::*;

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

type Result<T> = ::core::result::Result<T, AppError>;

#[allow(dead_code)]
enum Shadow {
    Some,
    None,
}

#[allow(unused_imports)]
use Shadow::*;

// Parameters named like the generated locals.
#[distributed_lock(key = "{distlock_request}:{distlock_guard}", guard = distlock_output)]
async fn same_names(
    distlock_request: u8,
    distlock_guard: u8,
    distlock_manager: u8,
    distlock_error: u8,
) -> Result<u64> {
    let distlock_value =
        u64::from(distlock_request + distlock_guard + distlock_manager + distlock_error);
    Ok(distlock_value + distlock_output.fencing_token().await?)
}

// A body that panics (`todo!()`) triggers no unreachable-code warning.
#[distributed_lock(key = "todo")]
async fn unfinished() -> Result<()> {
    todo!()
}

// A function written by a `macro_rules!` whose parameter name comes from
// the macro's caller: the key's placeholder resolves to that parameter.
macro_rules! locked_job {
    ($name:ident, $param:ident) => {
        #[distributed_lock(key = "job:{id}")]
        async fn $name($param: u64) -> Result<u64> {
            Ok($param)
        }
    };
}
locked_job!(from_a_macro, id);

// A method written by a `macro_rules!` whose key comes from the macro's
// caller: `{self.shard}` resolves to the method's receiver, whose `self` has
// the macro's hygiene (it used to be resolved at the caller's, which has no
// `self`: "expected value, found module `self`").
pub struct Service {
    shard: u16,
}
macro_rules! locked_method {
    ($key:literal) => {
        impl Service {
            #[distributed_lock(key = $key)]
            async fn run(&self) -> Result<u16> {
                Ok(self.shard)
            }
        }
    };
}
locked_method!("shard:{self.shard}");

fn main() {
    drop(from_a_macro(7));
    let service = Service { shard: 3 };
    drop(service.run());
    drop(same_names(1, 2, 3, 4));
    drop(unfinished());
}
