async fn f(&self) -> std::io::Result<()> {
    let distlock_request = {
        let distlock_lease: ::core::time::Duration = LEASE;
        let distlock_wait: ::core::time::Duration = self.wait;
        let distlock_manager = &(self.locks);
        let distlock_manager: &::locks::LockManager = ::core::borrow::Borrow::borrow(
            &*distlock_manager,
        );
        ::core::result::Result::Ok::<
            _,
            ::locks::LockError,
        >(
            ::locks::LockManager::lock(distlock_manager, "jobs:{nightly}")
                .lease(distlock_lease)
                .wait(distlock_wait)
                .metrics_label("jobs:{{nightly}}"),
        )
    };
    let distlock_outcome = match distlock_request {
        ::core::result::Result::Ok(distlock_request) => {
            match ::locks::LockRequest::acquire(distlock_request).await {
                ::core::result::Result::Ok(distlock_guard) => {
                    let distlock_output = ::core::result::Result::Ok::<
                        _,
                        ::locks::LockError,
                    >(
                        ::locks::LockGuard::scope(
                                &distlock_guard,
                                async move {
                                    if let ::core::option::Option::Some(distlock_return) = ::core::option::Option::None::<
                                        std::io::Result<()>,
                                    > {
                                        return distlock_return;
                                    }
                                    Ok(())
                                },
                            )
                            .await,
                    );
                    let distlock_released = ::locks::LockGuard::release(distlock_guard)
                        .await;
                    let _ = distlock_released;
                    distlock_output
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
            ::core::result::Result::Err(::core::convert::From::from(distlock_error))
        }
    }
}
