pub async fn reserve(order_id: u64, user: &User) -> Result<u32, MyError> {
    let distlock_request = match ::distlock::__private::default_manager().await {
        ::core::result::Result::Ok(distlock_manager) => {
            let distlock_manager = &distlock_manager;
            ::core::result::Result::Ok(
                ::distlock::LockManager::lock(
                        distlock_manager,
                        ::std::format!("order:{}:{}", order_id, user.id),
                    )
                    .lease(::core::time::Duration::from_millis(30000))
                    .wait(::core::time::Duration::from_millis(0))
                    .max_hold(::core::time::Duration::from_millis(600000))
                    .min_hold(::core::time::Duration::new(0, 1500000))
                    .renew(false)
                    .metrics_label("order:{order_id}:{user.id}"),
            )
        }
        ::core::result::Result::Err(distlock_error) => {
            ::core::result::Result::Err(distlock_error)
        }
    };
    let distlock_outcome = match distlock_request {
        ::core::result::Result::Ok(distlock_request) => {
            match ::distlock::LockRequest::acquire(distlock_request).await {
                ::core::result::Result::Ok(distlock_guard) => {
                    let lock: &::distlock::LockGuard = &distlock_guard;
                    let distlock_output = ::distlock::LockGuard::scope_until_lost(
                            &distlock_guard,
                            async move {
                                if let ::core::option::Option::Some(distlock_return) = ::core::option::Option::None::<
                                    Result<u32, MyError>,
                                > {
                                    return distlock_return;
                                }
                                Ok(1)
                            },
                        )
                        .await;
                    let distlock_released = ::distlock::LockGuard::release(
                            distlock_guard,
                        )
                        .await;
                    match (distlock_output, distlock_released) {
                        (
                            ::core::result::Result::Ok(::core::result::Result::Ok(_)),
                            ::core::result::Result::Err(
                                distlock_error @ ::distlock::LockError::Lost { .. },
                            ),
                        ) => ::core::result::Result::Err(distlock_error),
                        (distlock_output, _) => distlock_output,
                    }
                }
                ::core::result::Result::Err(distlock_error) => {
                    ::core::result::Result::Err(distlock_error)
                }
            }
        }
        ::core::result::Result::Err(distlock_error) => {
            ::core::result::Result::Err(distlock_error)
        }
    };
    match distlock_outcome {
        ::core::result::Result::Ok(distlock_value) => distlock_value,
        ::core::result::Result::Err(distlock_error) => {
            ::core::result::Result::Err(
                <MyError as ::core::convert::From<
                    ::distlock::LockError,
                >>::from(distlock_error),
            )
        }
    }
}
