//! Code generation for a function that `item` has accepted.

use proc_macro2::{Literal, Span, TokenStream};
use quote::{quote, quote_spanned, ToTokens};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{Block, Expr, Ident, ItemFn, LitStr, Stmt, Type};

use crate::args::{DurationArg, Key, KeyElem, Mode, OnLost, Options, PermitsArg};
use crate::errors::Errors;
use crate::item::{
    check_placeholders, check_uses_bindings, collect_bindings, find_binding, Kind, Params, Shape,
    Target,
};
use crate::template::{Segment, Template};

/// Entry point shared by the proc macro and the unit tests.
pub(crate) fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut func = match Target::parse(&item) {
        // A body that syn cannot parse is locked as raw tokens: rustc reports
        // its syntax error, and nothing of ours adds to it.
        Target::Fn(func) | Target::FnWithRawBody(func) => func,
        Target::Other { error, is_expr } => {
            let errors = error.into_compile_error();
            if is_expr {
                // In expression position (a closure) the output must stay one expression.
                return quote!({ #errors #item });
            }
            return quote!(#item #errors);
        }
    };
    let mut errors = Errors::default();
    let opts = Options::parse(args, &mut errors);
    let params = Params::of(&func.sig);
    let shape = Shape::analyze(&func, &mut errors);
    match &opts.key {
        Some(Key::Single(key)) => check_placeholders(
            &key.lit,
            &key.template,
            &params,
            &[],
            &func.sig.ident,
            &mut errors,
        ),
        Some(Key::List(elems)) => {
            for elem in elems {
                let bindings = elem_bindings(elem);
                let before = errors.len();
                check_placeholders(
                    &elem.key.lit,
                    &elem.key.template,
                    &params,
                    &bindings,
                    &func.sig.ident,
                    &mut errors,
                );
                // A mistyped binding (`{skuu}`) is reported once, as unknown.
                if let (Some(each), true) = (&elem.each, errors.len() == before) {
                    check_uses_bindings(
                        &elem.key.lit,
                        &elem.key.template,
                        &each.pat,
                        &bindings,
                        &mut errors,
                    );
                }
            }
        }
        None => {}
    }
    if let Some(guard) = &opts.guard {
        if params.names.iter().any(|p| p.unraw() == guard.unraw()) {
            errors.push(syn::Error::new(
                guard.span(),
                format!(
                    "`guard = {guard}` would shadow the parameter `{guard}`; pick another name, e.g. `guard = lock`"
                ),
            ));
        }
    }
    match (shape, errors.is_empty()) {
        (Some(shape), true) => generate(&mut func, &shape, &opts),
        // Re-emit the function untouched next to the errors, so that the rest
        // of the crate (and IDE analysis) still sees it.
        _ => with_errors(item, &errors),
    }
}

/// The names bound by an element's `for` pattern (none without `for`).
fn elem_bindings(elem: &KeyElem) -> Vec<Ident> {
    let mut bindings = Vec::new();
    if let Some(each) = &elem.each {
        collect_bindings(&each.pat, &mut bindings);
    }
    bindings
}

fn with_errors(mut item: TokenStream, errors: &Errors) -> TokenStream {
    item.extend(errors.to_compile_errors());
    item
}

/// `ty` with every `impl Trait` replaced by `_`, usable in a turbofish.
fn without_impl_trait(ty: &Type) -> Type {
    struct Replace;
    impl VisitMut for Replace {
        fn visit_type_mut(&mut self, ty: &mut Type) {
            if let Type::ImplTrait(t) = ty {
                *ty = Type::Infer(syn::TypeInfer {
                    underscore_token: syn::Token![_](t.impl_token.span),
                });
            } else {
                syn::visit_mut::visit_type_mut(self, ty);
            }
        }
    }
    let mut ty = ty.clone();
    Replace.visit_type_mut(&mut ty);
    ty
}

/// The first and last token spans of `at`, resolved like generated code.
/// Stable proc macros cannot join spans, but rustc spans an expression from
/// its first to its last token, so generated code can still cover all of `at`.
fn first_last(at: &impl ToTokens) -> (Span, Span) {
    let mut tokens = at.to_token_stream().into_iter();
    let first = tokens.next().map_or_else(Span::call_site, |t| t.span());
    let last = tokens.last().map_or(first, |t| t.span());
    (located_at(first), located_at(last))
}

/// `path(arg)` with every token spanned at `span`.
fn call_at(span: Span, path: &TokenStream, arg: &str) -> TokenStream {
    let arg = Ident::new(arg, span);
    let mut args = proc_macro2::Group::new(proc_macro2::Delimiter::Parenthesis, quote!(#arg));
    args.set_span(span);
    quote!(#path #args)
}

/// A span located at `at` (for error messages) that resolves like the
/// generated code (so lints treat it as macro output).
fn located_at(at: Span) -> Span {
    at.resolved_at(Span::mixed_site())
}

fn generate(func: &mut ItemFn, shape: &Shape, opts: &Options) -> TokenStream {
    let ms = Span::mixed_site();
    let krate = match &opts.krate {
        Some(path) => path.to_token_stream(),
        None => quote_spanned!(ms=> ::distlock),
    };
    let request = Ident::new("distlock_request", ms);
    let manager = Ident::new("distlock_manager", ms);
    let guard = Ident::new("distlock_guard", ms);
    let outcome = Ident::new("distlock_outcome", ms);
    let output = Ident::new("distlock_output", ms);
    let released = Ident::new("distlock_released", ms);
    let value = Ident::new("distlock_value", ms);
    let error = Ident::new("distlock_error", ms);
    let early = Ident::new("distlock_return", ms);

    let key = opts.key.as_ref().expect("validated: key is present");
    let params = Params::of(&func.sig);

    // `Duration` and `u32` expressions are bound to typed locals first, so a
    // wrong type is reported on the expression as a plain "expected `Duration`".
    let mut duration_lets = TokenStream::new();
    // The request, and the types of the request and of the guard it gives.
    let (mut builder, request_ty, guard_ty) = match key {
        Key::Single(k) => {
            let key = key_tokens(&k.lit, &k.template, &params, &[]);
            let request = match (&opts.permits, opts.mode) {
                (Some(permits), _) => {
                    let permits = match permits {
                        PermitsArg::Literal { value, span } => {
                            let mut lit = Literal::u32_suffixed(*value);
                            lit.set_span(located_at(*span));
                            lit.into_token_stream()
                        }
                        PermitsArg::Expr(expr) => {
                            let local = Ident::new("distlock_permits", ms);
                            let ty =
                                quote_spanned!(located_at(expr.span())=> ::core::primitive::u32);
                            duration_lets.extend(quote_spanned!(ms=> let #local: #ty = #expr;));
                            local.into_token_stream()
                        }
                    };
                    quote_spanned!(ms=> #krate::LockManager::semaphore(#manager, #key, #permits))
                }
                (None, Mode::Read) => {
                    quote_spanned!(ms=> #krate::LockManager::read_lock(#manager, #key))
                }
                (None, Mode::Write) => {
                    quote_spanned!(ms=> #krate::LockManager::write_lock(#manager, #key))
                }
                (None, Mode::Exclusive) => {
                    quote_spanned!(ms=> #krate::LockManager::lock(#manager, #key))
                }
            };
            (request, "LockRequest", "LockGuard")
        }
        Key::List(elems) => {
            let keys = key_list_tokens(elems, &params);
            (
                quote_spanned!(ms=> #krate::LockManager::lock_all(#manager, #keys)),
                "MultiLockRequest",
                "MultiLockGuard",
            )
        }
    };
    let request_ty = Ident::new(request_ty, ms);
    let guard_ty = Ident::new(guard_ty, ms);
    for (method, arg) in [
        ("lease", &opts.lease),
        ("wait", &opts.wait),
        ("max_hold", &opts.max_hold),
        ("min_hold", &opts.min_hold),
    ] {
        let Some(arg) = arg else { continue };
        let method = Ident::new(method, ms);
        let value = match arg {
            DurationArg::Literal { value, span } => duration_literal(*value, *span),
            DurationArg::Expr(expr) => {
                let local = Ident::new(&format!("distlock_{method}"), ms);
                let ty = quote_spanned!(located_at(expr.span())=> ::core::time::Duration);
                duration_lets.extend(quote_spanned!(ms=> let #local: #ty = #expr;));
                local.into_token_stream()
            }
        };
        builder = quote_spanned!(ms=> #builder.#method(#value));
    }
    if let Some(renew) = &opts.renew {
        builder = quote_spanned!(ms=> #builder.renew(#renew));
    }
    if let Some(eager) = &opts.eager_fencing {
        builder = quote_spanned!(ms=> #builder.eager_fencing(#eager));
    }
    if let Some(reentrant) = &opts.reentrant {
        builder = quote_spanned!(ms=> #builder.reentrant(#reentrant));
    }
    // The template as written is bounded (one per attribute), so it labels
    // the lock's metrics; the formatted key never does.
    let label = LitStr::new(&key.metrics_label(), ms);
    builder = quote_spanned!(ms=> #builder.metrics_label(#label));

    // `Result<LockRequest, LockError>`: the manager is only needed to make the
    // request, so it is dropped before acquisition awaits.
    let make_request = match &opts.manager {
        Some(expr) => {
            // `&*manager` runs from the first to the last token of `expr`, so a
            // type without `Borrow<LockManager>` is reported on all of `expr`.
            let (first, last) = first_last(expr);
            let borrowed = Ident::new("distlock_manager", last);
            let borrow = quote_spanned!(first=> ::core::borrow::Borrow::borrow(&*#borrowed));
            quote_spanned! {ms=>
                let #request = {
                    #duration_lets
                    let #manager = &(#expr);
                    let #manager: &#krate::LockManager = #borrow;
                    ::core::result::Result::Ok::<_, #krate::LockError>(#builder)
                };
            }
        }
        None => quote_spanned! {ms=>
            let #request = match #krate::__private::default_manager().await {
                ::core::result::Result::Ok(#manager) => {
                    #duration_lets
                    let #manager = &#manager;
                    ::core::result::Result::Ok(#builder)
                }
                ::core::result::Result::Err(#error) => ::core::result::Result::Err(#error),
            };
        },
    };

    let guard_binding = opts
        .guard
        .as_ref()
        .map(|name| quote_spanned!(ms=> let #name: &#krate::#guard_ty = &#guard;));

    let ret = without_impl_trait(&shape.ret);
    // Declares the body's output type up front (as `#[async_trait]` does), so
    // `?` and `.into()` in the body infer exactly as in the original function.
    let typed_return = quote_spanned! {ms=>
        if let ::core::option::Option::Some(#early) = ::core::option::Option::None::<#ret> {
            return #early;
        }
    };

    let user_block: &Block = match shape.kind {
        Kind::AsyncFn => &func.block,
        Kind::AsyncTrait(index) => match &func.block.stmts[index] {
            Stmt::Expr(Expr::Call(call), None) => match &call.args[0] {
                Expr::Async(a) => &a.block,
                _ => unreachable!("checked by async_trait_body"),
            },
            _ => unreachable!("checked by async_trait_body"),
        },
    };
    // `#[async_trait]` moves each parameter into its future with `let x = x;`.
    // Those move ahead of the locking code, so that the key reads the moved
    // binding: left in the body, a parameter used only by the key would be an
    // unused variable there.
    let (param_moves, user_stmts): (Vec<&Stmt>, Vec<&Stmt>) = match shape.kind {
        Kind::AsyncFn => (Vec::new(), user_block.stmts.iter().collect()),
        Kind::AsyncTrait(_) => user_block.stmts.iter().partition(|s| is_param_move(s)),
    };
    let body = quote_spanned! {located_at(user_block.brace_token.span.join())=>
        async move {
            #typed_return
            #(#user_stmts)*
        }
    };
    let scoped = match opts.on_lost {
        OnLost::Abort => quote_spanned! {ms=>
            #krate::#guard_ty::scope_until_lost(&#guard, #body).await
        },
        OnLost::Ignore => quote_spanned! {ms=>
            ::core::result::Result::Ok::<_, #krate::LockError>(
                #krate::#guard_ty::scope(&#guard, #body).await
            )
        },
    };

    // A missing `From<LockError>` is reported on the error type (or on the
    // return type, for aliases such as `io::Result<T>`).
    let convert = match &shape.err {
        Some(err) => {
            let (first, _) = first_last(err);
            call_at(
                first,
                &quote_spanned!(first=> <#err as ::core::convert::From<#krate::LockError>>::from),
                "distlock_error",
            )
        }
        None => {
            let (first, _) = first_last(&shape.ret);
            call_at(
                first,
                &quote_spanned!(first=> ::core::convert::From::from),
                "distlock_error",
            )
        }
    };

    // A failed release is logged by the runtime. With `abort`, a loss that only
    // the release found (the body finished in the poll that lost the lease)
    // still turns a successful result into `Lost`; an error of the body stands.
    let release_outcome = match opts.on_lost {
        OnLost::Abort => quote_spanned! {ms=>
            match (#output, #released) {
                (
                    ::core::result::Result::Ok(::core::result::Result::Ok(_)),
                    ::core::result::Result::Err(#error @ #krate::LockError::Lost { .. }),
                ) => ::core::result::Result::Err(#error),
                (#output, _) => #output,
            }
        },
        OnLost::Ignore => quote_spanned! {ms=>
            let _ = #released;
            #output
        },
    };

    let generated = quote_spanned! {ms=>
        #make_request
        let #outcome = match #request {
            ::core::result::Result::Ok(#request) => match #krate::#request_ty::acquire(#request).await {
                ::core::result::Result::Ok(#guard) => {
                    #guard_binding
                    let #output = #scoped;
                    let #released = #krate::#guard_ty::release(#guard).await;
                    #release_outcome
                }
                ::core::result::Result::Err(#error) => ::core::result::Result::Err(#error),
            },
            ::core::result::Result::Err(#error) => ::core::result::Result::Err(#error),
        };
        match #outcome {
            ::core::result::Result::Ok(#value) => #value,
            ::core::result::Result::Err(#error) => ::core::result::Result::Err(#convert),
        }
    };

    match shape.kind {
        Kind::AsyncFn => {
            let brace_token = func.block.brace_token;
            *func.block = Block {
                brace_token,
                stmts: vec![Stmt::Expr(Expr::Verbatim(generated), None)],
            };
        }
        Kind::AsyncTrait(index) => {
            let generated = quote_spanned!(ms=> #typed_return #(#param_moves)* #generated);
            if let Stmt::Expr(Expr::Call(call), None) = &mut func.block.stmts[index] {
                if let Expr::Async(a) = &mut call.args[0] {
                    a.capture = Some(syn::Token![move](a.async_token.span));
                    a.block.stmts = vec![Stmt::Expr(Expr::Verbatim(generated), None)];
                }
            }
        }
    }
    func.to_token_stream()
}

/// `let x = x;` or `let mut x = x;`: how `#[async_trait]` moves a parameter into
/// the future. `let __self = self;` is not one of them: it stays in the body, so
/// that a `{self.field}` key can still read `self` before it moves.
fn is_param_move(stmt: &Stmt) -> bool {
    let Stmt::Local(local) = stmt else {
        return false;
    };
    let (syn::Pat::Ident(pat), Some(init)) = (&local.pat, &local.init) else {
        return false;
    };
    let Expr::Path(value) = &*init.expr else {
        return false;
    };
    pat.by_ref.is_none()
        && pat.subpat.is_none()
        && init.diverge.is_none()
        && value.qself.is_none()
        && value.path.is_ident(&pat.ident)
        && pat.ident != "__self"
}

/// `"static"` for a key without placeholders, else `::std::format!(..)` over
/// the parameters (formatted once per call) and the `bindings` of the key's
/// `for`, if any.
fn key_tokens(
    lit: &LitStr,
    template: &Template,
    params: &Params,
    bindings: &[Ident],
) -> TokenStream {
    let span = lit.span();
    if let Some(s) = template.as_static() {
        return LitStr::new(&s, span).into_token_stream();
    }
    let fmt = LitStr::new(&template.format_string(), span);
    let args = template.segments.iter().filter_map(|seg| match seg {
        Segment::Placeholder(path) => Some(placeholder_tokens(path, span, params, bindings)),
        Segment::Text(_) => None,
    });
    quote_spanned!(Span::mixed_site()=> ::std::format!(#fmt #(, #args)*))
}

/// The `Vec<String>` of a key list's keys, in the order written; a `for`
/// element contributes one key per item of `&(EXPR)`, in iteration order:
///
/// ```text
/// {
///     let mut distlock_keys: Vec<String> = Vec::new();
///     Vec::push(&mut distlock_keys, ::std::format!("order:{}", id));
///     for sku in IntoIterator::into_iter(&(skus)) {
///         Vec::push(&mut distlock_keys, ::std::format!("sku:{}", sku));
///     }
///     distlock_keys
/// }
/// ```
///
/// A list without `for` is `::std::vec![..]`.
fn key_list_tokens(elems: &[KeyElem], params: &Params) -> TokenStream {
    let ms = Span::mixed_site();
    let owned = |elem: &KeyElem, bindings: &[Ident]| {
        let key = key_tokens(&elem.key.lit, &elem.key.template, params, bindings);
        if elem.key.template.as_static().is_some() {
            quote_spanned!(ms=> ::std::string::String::from(#key))
        } else {
            key
        }
    };
    if elems.iter().all(|e| e.each.is_none()) {
        let keys = elems.iter().map(|e| owned(e, &[]));
        return quote_spanned!(ms=> ::std::vec![#(#keys),*]);
    }
    let keys = Ident::new("distlock_keys", ms);
    let pushes = elems.iter().map(|elem| {
        let bindings = elem_bindings(elem);
        let key = owned(elem, &bindings);
        let push = quote_spanned!(ms=> ::std::vec::Vec::push(&mut #keys, #key););
        match &elem.each {
            None => push,
            Some(each) => {
                let pat = &each.pat;
                let expr = &each.expr;
                // Spanned from the first to the last token of EXPR, so that a
                // type whose reference does not iterate is reported there.
                let (first, last) = first_last(expr);
                let mut borrowed =
                    proc_macro2::Group::new(proc_macro2::Delimiter::Parenthesis, quote!(#expr));
                borrowed.set_span(last);
                let mut args = proc_macro2::Group::new(
                    proc_macro2::Delimiter::Parenthesis,
                    quote_spanned!(first=> &#borrowed),
                );
                args.set_span(last);
                let iter = quote_spanned!(first=> ::core::iter::IntoIterator::into_iter #args);
                let for_token = syn::Token![for](located_at(each.for_token.span));
                quote_spanned!(ms=> #for_token #pat in #iter { #push })
            }
        }
    });
    quote_spanned! {ms=>
        {
            let mut #keys: ::std::vec::Vec<::std::string::String> = ::std::vec::Vec::new();
            #(#pushes)*
            #keys
        }
    }
}

/// `param.field.0` with the key literal's span, so that a missing field or a
/// type without `Display` is reported on the key. A root among `bindings` (the
/// names of the key's `for`) is that binding, shadowing a parameter of the
/// same name as it does in the loop.
fn placeholder_tokens(
    path: &[String],
    span: Span,
    params: &Params,
    bindings: &[Ident],
) -> TokenStream {
    // Each name resolves where it was declared (a parameter written inside
    // a `macro_rules!` has that macro's hygiene) and is reported at the key.
    let mut tokens = if let Some(binding) = find_binding(bindings, &path[0]) {
        let mut ident = binding.clone();
        ident.set_span(binding.span().located_at(span));
        ident.into_token_stream()
    } else if path[0] == "self" {
        // As a parameter: the receiver's hygiene, reported at the key.
        let self_span = params.self_span.map_or(span, |s| s.located_at(span));
        syn::Token![self](self_span).into_token_stream()
    } else {
        let param = params
            .find(&path[0])
            .expect("validated: placeholder names a parameter");
        let mut ident = param.clone();
        ident.set_span(param.span().located_at(span));
        ident.into_token_stream()
    };
    for member in &path[1..] {
        let member = match member.parse::<u32>() {
            Ok(index) => syn::Member::Unnamed(syn::Index { index, span }),
            Err(_) => syn::Member::Named(member_ident(member, span)),
        };
        tokens.extend(quote!(.#member));
    }
    tokens
}

fn member_ident(name: &str, span: Span) -> Ident {
    let bare = name.strip_prefix("r#").unwrap_or(name);
    if name.starts_with("r#") || syn::parse_str::<Ident>(bare).is_err() {
        Ident::new_raw(bare, span)
    } else {
        Ident::new(bare, span)
    }
}

/// `Duration::from_millis(N)` (or `Duration::new(secs, nanos)` for fractions
/// of a millisecond), computed at compile time.
fn duration_literal(value: std::time::Duration, span: Span) -> TokenStream {
    let span = located_at(span);
    if value.subsec_nanos().is_multiple_of(1_000_000) {
        let millis = Literal::u64_unsuffixed(
            u64::try_from(value.as_millis()).expect("validated: fits in u64 milliseconds"),
        );
        quote_spanned!(span=> ::core::time::Duration::from_millis(#millis))
    } else {
        let secs = Literal::u64_unsuffixed(value.as_secs());
        let nanos = Literal::u32_unsuffixed(value.subsec_nanos());
        quote_spanned!(span=> ::core::time::Duration::new(#secs, #nanos))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::item::{result_error_type, suggest_parameter};

    fn expand_str(args: TokenStream, item: TokenStream) -> String {
        expand(args, item).to_string()
    }

    /// An expansion as rustfmt would print it, for snapshots a reviewer can diff.
    fn pretty(tokens: TokenStream) -> String {
        let file: syn::File = syn::parse2(tokens).expect("an expansion is a valid item");
        prettyplease::unparse(&file)
    }

    /// Expansions of the single-key forms, captured before the lock family
    /// (key lists, `mode`, `permits`) was added: they must not change, nor
    /// with `mode = "exclusive"`, which means the default.
    /// After an intended change, `UPDATE_EXPECT=1 cargo test -p distlock-macros`
    /// rewrites the files under `src/snapshots/`, and the diff shows the change.
    fn golden() -> [expect_test::ExpectFile; 3] {
        [
            expect_test::expect_file!["snapshots/free_fn.rs"],
            expect_test::expect_file!["snapshots/method.rs"],
            expect_test::expect_file!["snapshots/async_trait.rs"],
        ]
    }

    // Not reformatted: the inputs are those the golden expansions were made from.
    #[rustfmt::skip]
    fn golden_cases(extra: TokenStream) -> [(TokenStream, TokenStream); 3] {
        [
            (
                quote!(key = "order:{order_id}:{user.id}", lease = "30s", wait = "0s", max_hold = "10m", min_hold = "1.5ms", renew = false, guard = lock #extra),
                quote!(
                    pub async fn reserve(order_id: u64, user: &User) -> Result<u32, MyError> {
                        Ok(1)
                    }
                ),
            ),
            (
                quote!(key = "jobs:{{nightly}}", lease = LEASE, wait = self.wait, manager = self.locks, on_lost = "ignore", crate = "::locks" #extra),
                quote!(
                    async fn f(&self) -> std::io::Result<()> {
                        Ok(())
                    }
                ),
            ),
            (
                quote!(key = "{id}", min_hold = d #extra),
                quote!(
                    fn f<'life0, 'async_trait>(&'life0 self, id: u64, d: Duration)
                        -> ::core::pin::Pin<Box<dyn ::core::future::Future<Output = Result<(), E>> + ::core::marker::Send + 'async_trait>>
                    where 'life0: 'async_trait, Self: 'async_trait,
                    {
                        Box::pin(async move {
                            let __self = self;
                            let id = id;
                            let d = d;
                            let __ret: Result<(), E> = { Ok(()) };
                            __ret
                        })
                    }
                ),
            ),
        ]
    }

    #[test]
    fn single_key_expansion_is_unchanged() {
        for extra in [quote!(), quote!(, mode = "exclusive")] {
            for ((args, item), golden) in golden_cases(extra).into_iter().zip(golden()) {
                golden.assert_eq(&pretty(expand(args, item)));
            }
        }
    }

    fn item() -> TokenStream {
        quote!(
            async fn f(id: u64, user: &User, skus: Vec<String>, n: u32) -> Result<(), E> {
                Ok(())
            }
        )
    }

    #[test]
    fn key_list_expansion() {
        let out = expand_str(
            quote!(
                key = ["order:{id}", "user:{user.id}", "all"],
                lease = "1s",
                guard = g
            ),
            item(),
        );
        for needle in [
            ":: distlock :: LockManager :: lock_all (distlock_manager , :: std :: vec ! [:: std :: format ! (\"order:{}\" , id) , :: std :: format ! (\"user:{}\" , user . id) , :: std :: string :: String :: from (\"all\")])",
            ". lease (:: core :: time :: Duration :: from_millis (1000)) . metrics_label (\"order:{id}+user:{user.id}+all\")",
            ":: distlock :: MultiLockRequest :: acquire (distlock_request) . await",
            "let g : & :: distlock :: MultiLockGuard = & distlock_guard ;",
            ":: distlock :: MultiLockGuard :: scope_until_lost (& distlock_guard , async move",
            ":: distlock :: MultiLockGuard :: release (distlock_guard) . await",
        ] {
            assert!(out.contains(needle), "missing `{needle}` in\n{out}");
        }
        assert!(!out.contains(":: distlock :: LockGuard"), "{out}");
        assert!(!out.contains(":: distlock :: LockRequest"), "{out}");
        let out = expand_str(
            quote!(key = ["a"], on_lost = "ignore", crate = "::locks"),
            item(),
        );
        assert!(out.contains(":: locks :: LockManager :: lock_all (distlock_manager , :: std :: vec ! [:: std :: string :: String :: from (\"a\")])"), "{out}");
        assert!(
            out.contains(":: locks :: MultiLockGuard :: scope (& distlock_guard"),
            "{out}"
        );
    }

    #[test]
    fn key_for_each_expansion() {
        let out = expand_str(
            quote!(key = ["order:{id}", "sku:{sku}:{id}" for sku in skus]),
            item(),
        );
        let needle = ":: distlock :: LockManager :: lock_all (distlock_manager , { \
            let mut distlock_keys : :: std :: vec :: Vec < :: std :: string :: String > = :: std :: vec :: Vec :: new () ; \
            :: std :: vec :: Vec :: push (& mut distlock_keys , :: std :: format ! (\"order:{}\" , id)) ; \
            for sku in :: core :: iter :: IntoIterator :: into_iter (& (skus)) { \
            :: std :: vec :: Vec :: push (& mut distlock_keys , :: std :: format ! (\"sku:{}:{}\" , sku , id)) ; } \
            distlock_keys })";
        assert!(out.contains(needle), "missing `{needle}` in\n{out}");
        assert!(
            out.contains(". metrics_label (\"order:{id}+sku:{sku}:{id}\")"),
            "{out}"
        );
        // Alone, and with a pattern whose binding shadows a parameter.
        let out = expand_str(quote!(key = "u:{id}" for (id, _) in self.pairs), item());
        assert!(
            out.contains("for (id , _) in :: core :: iter :: IntoIterator :: into_iter (& (self . pairs)) { :: std :: vec :: Vec :: push (& mut distlock_keys , :: std :: format ! (\"u:{}\" , id)) ; }"),
            "{out}"
        );
    }

    #[test]
    fn family_expansion() {
        for (extra, call) in [
            (quote!(mode = "read"), ":: distlock :: LockManager :: read_lock (distlock_manager , :: std :: format ! (\"k:{}\" , id))"),
            (quote!(mode = "write"), ":: distlock :: LockManager :: write_lock (distlock_manager , :: std :: format ! (\"k:{}\" , id))"),
            (quote!(permits = 3), ":: distlock :: LockManager :: semaphore (distlock_manager , :: std :: format ! (\"k:{}\" , id) , 3u32)"),
            (quote!(permits = 0x10), ":: distlock :: LockManager :: semaphore (distlock_manager , :: std :: format ! (\"k:{}\" , id) , 16u32)"),
            (quote!(permits = n), ":: distlock :: LockManager :: semaphore (distlock_manager , :: std :: format ! (\"k:{}\" , id) , distlock_permits)"),
        ] {
            let out = expand_str(quote!(key = "k:{id}", guard = g, #extra), item());
            for needle in [
                call,
                ". metrics_label (\"k:{id}\")",
                ":: distlock :: LockRequest :: acquire (distlock_request) . await",
                "let g : & :: distlock :: LockGuard = & distlock_guard ;",
            ] {
                assert!(out.contains(needle), "{extra}: missing `{needle}` in\n{out}");
            }
            assert!(!out.contains("Multi"), "{out}");
        }
        let out = expand_str(quote!(key = "k", permits = self.size, lease = d), item());
        assert!(
            out.contains("let distlock_permits : :: core :: primitive :: u32 = self . size ; let distlock_lease : :: core :: time :: Duration = d ;"),
            "{out}"
        );
    }

    #[test]
    fn key_list_placeholder_errors() {
        let e = expand_str(
            quote!(key = ["order:{idd}", "sku:{skuu}" for sku in skus, "x" for s in skus, "y" for _ in skus, "z:{sku}"]),
            item(),
        );
        for needle in [
            "`{idd}` in the key is not a parameter of `f`; did you mean `{id}`? the parameters are `id`, `user`, `skus`, `n`",
            "`{skuu}` in the key is not a parameter of `f` or a name bound by its `for`; did you mean `{sku}`? the parameters are `id`, `user`, `skus`, `n`; its `for` binds `sku`",
            "this key does not use `s`, bound by its `for`: every item would give the same key; put the item in the template, e.g. `{s}`",
            "the `for` pattern `_` binds no name",
            "`{sku}` in the key is not a parameter of `f`; did you mean `{skus}`?",
        ] {
            assert!(e.contains(needle), "missing `{needle}` in\n{e}");
        }
        assert!(e.starts_with("async fn f"), "{e}");
        assert!(!e.contains("does not use `sku`"), "{e}");
    }

    #[test]
    fn expands_a_free_fn() {
        let out = expand_str(
            quote!(
                key = "order:{order_id}",
                lease = "30s",
                wait = "0s",
                max_hold = "10m",
                min_hold = "30s",
                renew = false
            ),
            quote!(
                /// Docs stay.
                pub async fn reserve(order_id: u64) -> Result<u32, MyError> {
                    Ok(1)
                }
            ),
        );
        for needle in [
            "# [doc = r\" Docs stay.\"] pub async fn reserve (order_id : u64) -> Result < u32 , MyError >",
            ":: distlock :: __private :: default_manager () . await",
            ":: std :: format ! (\"order:{}\" , order_id)",
            ". lease (:: core :: time :: Duration :: from_millis (30000))",
            ". wait (:: core :: time :: Duration :: from_millis (0))",
            ". max_hold (:: core :: time :: Duration :: from_millis (600000))",
            ". min_hold (:: core :: time :: Duration :: from_millis (30000))",
            ". renew (false) . metrics_label (\"order:{order_id}\")",
            ":: distlock :: LockRequest :: acquire (distlock_request) . await",
            ":: distlock :: LockGuard :: scope_until_lost (& distlock_guard , async move",
            ":: core :: option :: Option :: None :: < Result < u32 , MyError > >",
            ":: distlock :: LockGuard :: release (distlock_guard) . await",
            "< MyError as :: core :: convert :: From < :: distlock :: LockError >> :: from (distlock_error)",
        ] {
            assert!(out.contains(needle), "missing `{needle}` in\n{out}");
        }
        assert!(!out.contains("compile_error"), "{out}");
    }

    #[test]
    fn static_key_is_not_formatted() {
        let out = expand_str(
            quote!(key = "jobs:{{nightly}}"),
            quote!(
                async fn f() -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        assert!(
            out.contains("LockManager :: lock (distlock_manager , \"jobs:{nightly}\")"),
            "{out}"
        );
        // The label is the template as written.
        assert!(
            out.contains(". metrics_label (\"jobs:{{nightly}}\")"),
            "{out}"
        );
        assert!(!out.contains("format"), "{out}");
    }

    #[test]
    fn manager_guard_ignore_and_crate() {
        let out = expand_str(
            quote!(
                key = "{self.id}",
                manager = self.locks.clone(),
                guard = lock,
                on_lost = "ignore",
                crate = "::locks"
            ),
            quote!(
                async fn f(&self) -> std::io::Result<()> {
                    Ok(())
                }
            ),
        );
        for needle in [
            "let distlock_manager = & (self . locks . clone ()) ;",
            "let distlock_manager : & :: locks :: LockManager = :: core :: borrow :: Borrow :: borrow (& * distlock_manager) ;",
            ":: std :: format ! (\"{}\" , self . id)",
            "let lock : & :: locks :: LockGuard = & distlock_guard ;",
            ":: locks :: LockGuard :: scope (& distlock_guard , async move",
            ":: core :: convert :: From :: from (distlock_error)",
        ] {
            assert!(out.contains(needle), "missing `{needle}` in\n{out}");
        }
        assert!(!out.contains("default_manager"), "{out}");
        assert!(!out.contains("distlock ::"), "{out}");
    }

    #[test]
    fn async_trait_shape_is_recognised() {
        let out = expand_str(
            quote!(key = "{id}"),
            quote!(
                fn f<'life0, 'async_trait>(
                    &'life0 self,
                    id: u64,
                ) -> ::core::pin::Pin<
                    Box<
                        dyn ::core::future::Future<Output = Result<(), E>>
                            + ::core::marker::Send
                            + 'async_trait,
                    >,
                >
                where
                    'life0: 'async_trait,
                    Self: 'async_trait,
                {
                    Box::pin(async move {
                        let __self = self;
                        let id = id;
                        let __ret: Result<(), E> = { Ok(()) };
                        __ret
                    })
                }
            ),
        );
        assert!(!out.contains("compile_error"), "{out}");
        assert!(out.contains("Box :: pin (async move { if let"), "{out}");
        assert!(
            out.contains("scope_until_lost (& distlock_guard , async move { if let"),
            "{out}"
        );
    }

    #[test]
    fn errors_keep_the_function() {
        let out = expand_str(
            quote!(kee = "x"),
            quote!(
                async fn f() -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        assert!(
            out.starts_with("async fn f () -> Result < () , E > { Ok (()) }"),
            "{out}"
        );
        assert!(
            out.contains("unknown option `kee`; did you mean `key`?"),
            "{out}"
        );
        assert!(out.contains("missing required option `key`"), "{out}");
    }

    #[test]
    fn body_syntax_error_is_left_to_rustc_and_the_lock_stays() {
        let item = quote!(
            #[doc = "d"]
            pub async fn f(id: u64) -> Result<(), E> {
                let x = ;
                Ok(())
            }
        );
        // No error of ours (rustc reports the body's), and the raw body still
        // runs under the lock: a body that only this syn cannot parse is not
        // silently left unlocked.
        let out = expand_str(quote!(key = "k:{id}"), item.clone());
        assert!(!out.contains("compile_error"), "{out}");
        assert!(out.contains("let x = ;"), "{out}");
        assert!(out.contains("LockManager :: lock"), "{out}");
        assert!(out.contains("acquire"), "{out}");
        // Real mistakes in the options are still reported.
        let out = expand_str(quote!(kee = "k"), item.clone());
        assert!(out.contains("unknown option `kee`"), "{out}");
        // Not a function at all still gets its tailored error.
        let out = expand_str(
            quote!(key = "k"),
            quote!(
                struct S {
                    a: u8,
                }
            ),
        );
        assert!(out.contains("not to a struct"), "{out}");
    }

    #[test]
    fn function_shape_errors() {
        let e = expand_str(
            quote!(key = "k"),
            quote!(
                fn f() -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        assert!(
            e.contains("can only be applied to an `async fn`; make `f` async"),
            "{e}"
        );
        let e = expand_str(
            quote!(key = "k"),
            quote!(
                async fn f() {}
            ),
        );
        assert!(e.contains("`f` returns `()`"), "{e}");
        let e = expand_str(
            quote!(key = "k"),
            quote!(
                async fn f() -> u32 {
                    1
                }
            ),
        );
        assert!(e.contains("found `u32`"), "{e}");
        let e = expand_str(
            quote!(key = "k"),
            quote!(
                struct S;
            ),
        );
        assert!(e.contains("not to a struct"), "{e}");
        let e = expand_str(
            quote!(key = "k"),
            quote!(
                async fn f(&self) -> Result<(), E>;
            ),
        );
        assert!(e.contains("needs a function body"), "{e}");
    }

    #[test]
    fn placeholder_errors() {
        let e = expand_str(
            quote!(key = "{nam}:{self.x}"),
            quote!(
                async fn f(name: &str, (a, b): (u8, u8)) -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        assert!(
            e.contains("`{nam}` in the key is not a parameter of `f`; did you mean `{name}`? the parameters are `name`, `a`, `b`"),
            "{e}"
        );
        assert!(
            e.contains("`{self.x}` in the key, but `f` has no `self` parameter"),
            "{e}"
        );
        let e = expand_str(
            quote!(key = "{x}", guard = x),
            quote!(
                async fn f(x: u8) -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        assert!(
            e.contains("`guard = x` would shadow the parameter `x`"),
            "{e}"
        );
    }

    #[test]
    fn parameter_suggestions() {
        let params = ["order_id", "user", "shard_key"];
        assert_eq!(suggest_parameter("ordr_id", &params), Some("order_id"));
        assert_eq!(suggest_parameter("order", &params), Some("order_id"));
        assert_eq!(suggest_parameter("key", &params), Some("shard_key"));
        assert_eq!(suggest_parameter("tenant", &params), None);
        assert_eq!(suggest_parameter("id", &["order_id", "user_id"]), None);
    }

    #[test]
    fn result_types() {
        let err = |t: TokenStream| {
            result_error_type(&syn::parse2(t).unwrap())
                .map(|e| e.map(|e| e.to_token_stream().to_string()))
        };
        assert_eq!(
            err(quote!(Result<u8, MyError>)).unwrap().as_deref(),
            Some("MyError")
        );
        assert_eq!(
            err(quote!(::core::result::Result<u8, E<'a>>))
                .unwrap()
                .as_deref(),
            Some("E < 'a >")
        );
        assert_eq!(err(quote!(io::Result<u8>)).unwrap(), None);
        assert_eq!(err(quote!(anyhow::Result<u8>)).unwrap(), None);
        assert_eq!(err(quote!(MyResult<u8>)).unwrap(), None);
        assert_eq!(
            err(quote!(Result<u8, impl std::error::Error>)).unwrap(),
            None
        );
        assert!(err(quote!(Option<u8>)).is_err());
        assert!(err(quote!(())).is_err());
        let e = err(quote!(Option<&'static [u8; 4]>))
            .unwrap_err()
            .to_string();
        assert!(e.ends_with("found `Option<&'static [u8; 4]>`"), "{e}");
        let e = err(quote!(std::collections::HashMap<String, (u8, u8)>))
            .unwrap_err()
            .to_string();
        assert!(
            e.ends_with("found `std::collections::HashMap<String, (u8, u8)>`"),
            "{e}"
        );
    }

    #[test]
    fn impl_trait_becomes_infer() {
        let ty: Type = syn::parse2(quote!(Result<impl Display, E>)).unwrap();
        assert_eq!(
            without_impl_trait(&ty).to_token_stream().to_string(),
            "Result < _ , E >"
        );
    }
}
