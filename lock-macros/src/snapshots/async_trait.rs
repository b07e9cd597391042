fn f<'life0, 'async_trait>(
    &'life0 self,
    id: u64,
    d: Duration,
) -> ::core::pin::Pin<
    Box<
        dyn ::core::future::Future<
            Output = Result<(), E>,
        > + ::core::marker::Send + 'async_trait,
    >,
>
where
    'life0: 'async_trait,
    Self: 'async_trait,
{
    Box::pin(async move {
        if let ::core::option::Option::Some(distlock_return) = ::core::option::Option::None::<
            Result<(), E>,
        > {
            return distlock_return;
        }
        let id = id;
        let d = d;
        let distlock_request = match ::distlock::__private::default_manager().await {
            ::core::result::Result::Ok(distlock_manager) => {
                let distlock_min_hold: ::core::time::Duration = d;
                let distlock_manager = &distlock_manager;
                ::core::result::Result::Ok(
                    ::distlock::LockManager::lock(
                            distlock_manager,
                            ::std::format!("{}", id),
                        )
                        .min_hold(distlock_min_hold)
                        .metrics_label("{id}"),
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
                        let distlock_output = ::distlock::LockGuard::scope_until_lost(
                                &distlock_guard,
                                async move {
                                    if let ::core::option::Option::Some(distlock_return) = ::core::option::Option::None::<
                                        Result<(), E>,
                                    > {
                                        return distlock_return;
                                    }
                                    let __self = self;
                                    let __ret: Result<(), E> = { Ok(()) };
                                    __ret
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
                    <E as ::core::convert::From<
                        ::distlock::LockError,
                    >>::from(distlock_error),
                )
            }
        }
    })
}
