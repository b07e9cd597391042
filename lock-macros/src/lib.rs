//! The `#[distributed_lock]` attribute of `distlock`. Use it through the
//! facade, [`distlock::distributed_lock`][facade], where it is documented
//! with its options and examples: the generated code calls `::distlock::...`
//! (see the `crate` option when the facade is renamed).
//!
//! [facade]: https://docs.rs/distlock/latest/distlock/attr.distributed_lock.html
//!
//! # How it expands
//!
//! The macro parses its arguments into a typed model, validates them against
//! the function (reporting every mistake at once, each on its token; on error
//! the function is re-emitted unchanged next to the `compile_error!`s so the
//! rest of the crate still type-checks), then generates code. A function whose
//! body does not parse is locked with its body as raw tokens and no error of
//! the macro's own, so that rustc's syntax error is the only one reported.
//!
//! The two blocks below are `text`, not doctests: a proc-macro crate cannot
//! use its own macro through the facade (`distlock` depends on this crate),
//! and the second block is an illustration of generated code. The attribute's
//! examples are compiled as doctests of `distlock`; the expansion itself is
//! checked by this crate's unit tests and the UI tests in `lock-ui/tests/ui`. For
//!
//! ```text
//! #[distributed_lock(key = "order:{order_id}", lease = "30s", guard = lock)]
//! pub async fn reserve(order_id: u64) -> Result<u32, AppError> {
//!     let n: u32 = lookup(order_id).await?;
//!     Ok(n)
//! }
//! ```
//!
//! it emits (locals are `Span::mixed_site()`, so the body cannot see them
//! and they cannot clash with the body's names):
//!
//! ```text
//! pub async fn reserve(order_id: u64) -> Result<u32, AppError> {
//!     let distlock_request = match ::distlock::__private::default_manager().await {
//!         ::core::result::Result::Ok(distlock_manager) => {
//!             let distlock_manager = &distlock_manager;
//!             ::core::result::Result::Ok(
//!                 ::distlock::LockManager::lock(
//!                     distlock_manager,
//!                     ::std::format!("order:{}", order_id),
//!                 )
//!                 .lease(::core::time::Duration::from_millis(30000))
//!                 // The template as written: a bounded label for the metrics.
//!                 .metrics_label("order:{order_id}"),
//!             )
//!         }
//!         ::core::result::Result::Err(distlock_error) => ::core::result::Result::Err(distlock_error),
//!     };
//!     let distlock_outcome = match distlock_request {
//!         ::core::result::Result::Ok(distlock_request) => {
//!             match ::distlock::LockRequest::acquire(distlock_request).await {
//!                 ::core::result::Result::Ok(distlock_guard) => {
//!                     let lock: &::distlock::LockGuard = &distlock_guard;
//!                     let distlock_output = ::distlock::LockGuard::scope_until_lost(
//!                         &distlock_guard,
//!                         async move {
//!                             // Fixes the block's output type before the body is
//!                             // checked, so `?` and `.into()` infer as in the
//!                             // original fn.
//!                             if let ::core::option::Option::Some(distlock_return) =
//!                                 ::core::option::Option::None::<Result<u32, AppError>>
//!                             {
//!                                 return distlock_return;
//!                             }
//!                             let n: u32 = lookup(order_id).await?;
//!                             Ok(n)
//!                         },
//!                     )
//!                     .await;
//!                     let _ = ::distlock::LockGuard::release(distlock_guard).await;
//!                     distlock_output
//!                 }
//!                 ::core::result::Result::Err(distlock_error) => ::core::result::Result::Err(distlock_error),
//!             }
//!         }
//!         ::core::result::Result::Err(distlock_error) => ::core::result::Result::Err(distlock_error),
//!     };
//!     match distlock_outcome {
//!         ::core::result::Result::Ok(distlock_value) => distlock_value,
//!         ::core::result::Result::Err(distlock_error) => ::core::result::Result::Err(
//!             // Spanned on `AppError`: a missing `From<LockError>` is reported there.
//!             <AppError as ::core::convert::From<::distlock::LockError>>::from(distlock_error),
//!         ),
//!     }
//! }
//! ```
//!
//! Every `LockError` (no manager, acquisition failure, lost lease) goes through
//! the one conversion at the end, so a missing `From<LockError>` is reported
//! once. With `manager = EXPR` the first statement becomes
//! `let distlock_manager = &(EXPR); let distlock_manager: &LockManager =
//! Borrow::borrow(&*distlock_manager); Ok(LockManager::lock(distlock_manager, ..))`;
//! with `on_lost = "ignore"` the body runs under `LockGuard::scope` instead of
//! `scope_until_lost`. For a method already rewritten by `#[async_trait]` the
//! same code goes inside its `Box::pin(async move { .. })`.
//!
//! The lock family only changes the request and the guard's type. `mode =
//! "read"` / `"write"` call `LockManager::read_lock` / `write_lock`, `permits
//! = N` calls `LockManager::semaphore(manager, key, N)` (an expression is
//! bound to a `let distlock_permits: u32` first); both give the ordinary
//! `LockRequest` and `LockGuard`. A key list (`key = ["order:{id}", "sku:{sku}" for sku in
//! skus]`, or a lone `key = "sku:{sku}" for sku in skus`) builds a
//! `Vec<String>` of the keys in the order written, a `for` element pushing one
//! key per item of `IntoIterator::into_iter(&(EXPR))`, and calls
//! `LockManager::lock_all(manager, keys)`; the rest is the code above with
//! `MultiLockRequest` and `MultiLockGuard` in place of `LockRequest` and
//! `LockGuard`, and a metrics label of the templates joined with `+`. A
//! single key without these options expands exactly as before (a unit test
//! compares it with golden strings).

mod args;
mod duration;
mod errors;
mod expand;
mod item;
mod template;

use proc_macro::TokenStream;

/// Implementation of `distlock`'s `#[distributed_lock]` attribute.
///
/// It is defined in the `distlock-macros` crate and used through its re-export [`distlock::distributed_lock`][facade], whose
/// documentation describes the options, with examples that are compiled as
/// `distlock`'s doctests.
///
/// [facade]: https://docs.rs/distlock/latest/distlock/attr.distributed_lock.html
#[proc_macro_attribute]
pub fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::expand(args.into(), item.into()).into()
}
