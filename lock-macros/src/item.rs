//! Analysis: what the attribute sits on, and what it may rely on there.
//!
//! [`Target::parse`] tells functions from everything else (with a tailored
//! error for the latter), and [`Shape`] and [`Params`] describe an accepted
//! function for `expand`, which only generates code.

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{
    Attribute, Block, Expr, FnArg, GenericArgument, Ident, ItemFn, LitStr, Pat, PathArguments,
    ReturnType, Signature, Stmt, Type, TypeParamBound, Visibility,
};

use crate::args::nearest;
use crate::errors::Errors;
use crate::template::Template;

/// What `#[distributed_lock]` was put on.
pub(crate) enum Target {
    /// A function whose body parses.
    Fn(Box<ItemFn>),
    /// A function whose body does not parse (`let x = ;`): the body is kept as
    /// raw tokens (one verbatim block) and locked like any other. rustc then
    /// reports the syntax error itself, at the right place, when it parses
    /// what we emit; an error of ours would only add noise pointing at the
    /// attribute. Unlike tracing-attributes' `MaybeItemFn`, which re-emits such
    /// an item unchanged, the lock stays: a body that rustc accepts but this
    /// syn cannot parse (syntax newer than syn) still runs under the lock.
    FnWithRawBody(Box<ItemFn>),
    /// Anything else: the error to report, and whether the item is an
    /// expression (a closure), whose replacement must stay one expression.
    Other { error: syn::Error, is_expr: bool },
}

impl Target {
    /// Classifies the item the attribute was put on.
    pub(crate) fn parse(item: &TokenStream) -> Target {
        if let Ok(func) = syn::parse2::<ItemFn>(item.clone()) {
            return Target::Fn(Box::new(func));
        }
        if let Ok(func) = fn_with_any_body.parse2(item.clone()) {
            return Target::FnWithRawBody(Box::new(func));
        }
        Target::Other {
            error: not_a_function(item),
            is_expr: syn::parse2::<Expr>(item.clone()).is_ok(),
        }
    }
}

/// Attributes, visibility, signature, then a `{ .. }` body taken as raw tokens,
/// kept as one verbatim block expression.
fn fn_with_any_body(input: ParseStream) -> syn::Result<ItemFn> {
    let attrs = input.call(Attribute::parse_outer)?;
    let vis = input.parse::<Visibility>()?;
    let sig = input.parse::<Signature>()?;
    let body;
    let brace_token = syn::braced!(body in input);
    let raw = body.parse::<TokenStream>()?;
    let mut inner = proc_macro2::Group::new(proc_macro2::Delimiter::Brace, raw);
    inner.set_span(brace_token.span.join());
    Ok(ItemFn {
        attrs,
        vis,
        sig,
        block: Box::new(Block {
            brace_token,
            stmts: vec![Stmt::Expr(Expr::Verbatim(inner.into_token_stream()), None)],
        }),
    })
}

/// The error for anything that is not a function with a body.
pub(crate) fn not_a_function(item: &TokenStream) -> syn::Error {
    const ONLY: &str = "`#[distributed_lock]` can only be applied to an `async fn`";
    if let Ok(decl) = syn::parse2::<syn::TraitItemFn>(item.clone()) {
        if let (None, Some(semi)) = (&decl.default, &decl.semi_token) {
            return syn::Error::new(
                semi.span,
                "`#[distributed_lock]` needs a function body: put it on the method in the `impl` \
                 block, not on the trait's declaration",
            );
        }
    }
    if let Ok(Expr::Closure(c)) = syn::parse2::<Expr>(item.clone()) {
        return syn::Error::new(
            c.or1_token.span,
            format!("{ONLY}, not to a closure; move the body into an `async fn` and lock that"),
        );
    }
    let Ok(parsed) = syn::parse2::<syn::Item>(item.clone()) else {
        return syn::Error::new(Span::call_site(), ONLY);
    };
    let (what, span) = match &parsed {
        syn::Item::Struct(s) => ("a struct", s.struct_token.span),
        syn::Item::Enum(e) => ("an enum", e.enum_token.span),
        syn::Item::Union(u) => ("a union", u.union_token.span),
        syn::Item::Trait(t) => ("a trait", t.trait_token.span),
        syn::Item::Impl(i) => ("an `impl` block; put it on the methods", i.impl_token.span),
        syn::Item::Mod(m) => ("a module", m.mod_token.span),
        syn::Item::Static(s) if matches!(*s.expr, Expr::Closure(_)) => ("a closure", s.expr.span()),
        syn::Item::Const(c) if matches!(*c.expr, Expr::Closure(_)) => ("a closure", c.expr.span()),
        syn::Item::Static(s) => ("a static", s.static_token.span),
        syn::Item::Const(c) => ("a const", c.const_token.span),
        syn::Item::Type(t) => ("a type alias", t.type_token.span),
        _ => ("this item", parsed.span()),
    };
    syn::Error::new(span, format!("{ONLY}, not to {what}"))
}

/// The names a caller can use in `{placeholders}`.
pub(crate) struct Params {
    pub(crate) has_self: bool,
    /// The receiver's `self` as written: its hygiene is the one a `{self..}`
    /// placeholder must resolve with (inside a `macro_rules!`, the macro's).
    pub(crate) self_span: Option<proc_macro2::Span>,
    pub(crate) names: Vec<Ident>,
}

impl Params {
    pub(crate) fn of(sig: &syn::Signature) -> Params {
        let mut params = Params {
            has_self: false,
            self_span: None,
            names: Vec::new(),
        };
        for input in &sig.inputs {
            match input {
                FnArg::Receiver(receiver) => {
                    params.has_self = true;
                    params.self_span = Some(receiver.self_token.span);
                }
                FnArg::Typed(t) => collect_bindings(&t.pat, &mut params.names),
            }
        }
        params
    }

    pub(crate) fn find(&self, name: &str) -> Option<&Ident> {
        let name = name.strip_prefix("r#").unwrap_or(name);
        self.names.iter().find(|p| p.unraw() == name)
    }

    pub(crate) fn listing(&self) -> String {
        let mut all: Vec<String> = Vec::new();
        if self.has_self {
            all.push("`self`".to_owned());
        }
        all.extend(self.names.iter().map(|n| format!("`{n}`")));
        all.join(", ")
    }
}

/// Every identifier a parameter pattern binds (`x`, `(a, b)`, `Point { x, y }`, ...).
pub(crate) fn collect_bindings(pat: &Pat, out: &mut Vec<Ident>) {
    match pat {
        Pat::Ident(p) => {
            out.push(p.ident.clone());
            if let Some((_, sub)) = &p.subpat {
                collect_bindings(sub, out);
            }
        }
        Pat::Or(p) => {
            if let Some(first) = p.cases.first() {
                collect_bindings(first, out);
            }
        }
        Pat::Paren(p) => collect_bindings(&p.pat, out),
        Pat::Reference(p) => collect_bindings(&p.pat, out),
        Pat::Type(p) => collect_bindings(&p.pat, out),
        Pat::Slice(p) => p.elems.iter().for_each(|e| collect_bindings(e, out)),
        Pat::Tuple(p) => p.elems.iter().for_each(|e| collect_bindings(e, out)),
        Pat::TupleStruct(p) => p.elems.iter().for_each(|e| collect_bindings(e, out)),
        Pat::Struct(p) => p.fields.iter().for_each(|f| collect_bindings(&f.pat, out)),
        _ => {}
    }
}

/// Checks that every placeholder of a key names a parameter, `self` (in a
/// method), or one of `bindings`, the names bound by the pattern of the
/// element's `for` (empty for a key without `for`).
pub(crate) fn check_placeholders(
    lit: &LitStr,
    template: &Template,
    params: &Params,
    bindings: &[Ident],
    fn_name: &Ident,
    errors: &mut Errors,
) {
    let mut reported: Vec<&str> = Vec::new();
    for path in template.placeholders() {
        let root = path[0].as_str();
        if reported.contains(&root) || find_binding(bindings, root).is_some() {
            continue;
        }
        let shown = path.join(".");
        if root == "self" {
            if !params.has_self {
                reported.push(root);
                errors.push(syn::Error::new(
                    lit.span(),
                    format!(
                        "`{{{shown}}}` in the key, but `{fn_name}` has no `self` parameter; \
                         placeholders name parameters{}",
                        if params.names.is_empty() {
                            String::new()
                        } else {
                            format!(" ({})", params.listing())
                        }
                    ),
                ));
            }
        } else if params.find(root).is_none() {
            reported.push(root);
            // The `for`'s bindings first: at equal distance they are preferred.
            let mut candidates: Vec<String> =
                bindings.iter().map(|b| b.unraw().to_string()).collect();
            candidates.extend(params.names.iter().map(|n| n.unraw().to_string()));
            if params.has_self {
                candidates.push("self".to_owned());
            }
            let param_count = candidates.len() - bindings.len();
            let refs: Vec<&str> = candidates.iter().map(String::as_str).collect();
            let hint = suggest_parameter(root, &refs)
                .map(|n| format!("did you mean `{{{n}}}`? "))
                .unwrap_or_default();
            let mut listing = if param_count == 0 {
                format!("`{fn_name}` has no parameters")
            } else {
                format!("the parameters are {}", params.listing())
            };
            let what = if bindings.is_empty() {
                format!("a parameter of `{fn_name}`")
            } else {
                listing.push_str(&format!("; its `for` binds {}", listing_of(bindings)));
                format!("a parameter of `{fn_name}` or a name bound by its `for`")
            };
            errors.push(syn::Error::new(
                lit.span(),
                format!("`{{{shown}}}` in the key is not {what}; {hint}{listing}"),
            ));
        }
    }
}

/// The binding of a `for` pattern that a placeholder root names.
pub(crate) fn find_binding<'a>(bindings: &'a [Ident], name: &str) -> Option<&'a Ident> {
    let name = name.strip_prefix("r#").unwrap_or(name);
    bindings.iter().find(|b| b.unraw() == name)
}

fn listing_of(names: &[Ident]) -> String {
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A `for` key whose template uses none of the names its pattern binds would
/// give the same key for every item: reported on the template.
pub(crate) fn check_uses_bindings(
    lit: &LitStr,
    template: &Template,
    pat: &Pat,
    bindings: &[Ident],
    errors: &mut Errors,
) {
    if template
        .placeholders()
        .any(|path| find_binding(bindings, &path[0]).is_some())
    {
        return;
    }
    let message = match bindings.first() {
        Some(first) => format!(
            "this key does not use {}, bound by its `for`: every item would give the same key; \
             put the item in the template, e.g. `{{{first}}}`",
            listing_of(bindings)
        ),
        None => format!(
            "the `for` pattern `{}` binds no name, so every item would give the same key; bind \
             the item, e.g. `\"sku:{{sku}}\" for sku in skus`",
            pretty(pat)
        ),
    };
    errors.push(syn::Error::new(lit.span(), message));
}

/// The parameter a mistyped placeholder most likely meant: the nearest by edit
/// distance, else the only one that starts or ends with it (`{order}` for
/// `order_id`).
pub(crate) fn suggest_parameter<'a>(name: &str, params: &[&'a str]) -> Option<&'a str> {
    nearest(name, params).or_else(|| {
        let mut matching = params
            .iter()
            .filter(|p| name.len() >= 2 && (p.starts_with(name) || p.ends_with(name)));
        match (matching.next(), matching.next()) {
            (Some(only), None) => Some(*only),
            _ => None,
        }
    })
}

/// Where the body is and what the function returns.
pub(crate) struct Shape {
    pub(crate) kind: Kind,
    /// The `Result<T, E>` the body produces.
    pub(crate) ret: Type,
    /// `E`, when it can be named.
    pub(crate) err: Option<Type>,
}

pub(crate) enum Kind {
    /// A plain `async fn`.
    AsyncFn,
    /// A method already rewritten by `#[async_trait]`:
    /// `fn f(..) -> Pin<Box<dyn Future<Output = R> + ..>> { Box::pin(async move { .. }) }`.
    /// The index is that of the `Box::pin(..)` statement.
    AsyncTrait(usize),
}

impl Shape {
    pub(crate) fn analyze(func: &ItemFn, errors: &mut Errors) -> Option<Shape> {
        let sig = &func.sig;
        let (kind, ret) = if sig.asyncness.is_some() {
            match &sig.output {
                ReturnType::Type(_, ty) => (Kind::AsyncFn, (**ty).clone()),
                ReturnType::Default => {
                    errors.push(syn::Error::new(
                        sig.paren_token.span.close(),
                        format!(
                            "`#[distributed_lock]` functions must return `Result<T, E>` with \
                             `E: From<distlock::LockError>`, so that a lock that cannot be taken can \
                             be reported; `{}` returns `()`: add e.g. `-> Result<(), MyError>`",
                            sig.ident
                        ),
                    ));
                    return None;
                }
            }
        } else if let (Some(index), Some(ret)) =
            (async_trait_body(&func.block), future_output(&sig.output))
        {
            (Kind::AsyncTrait(index), ret.clone())
        } else if made_blocking_by_runtime_attribute(func) {
            errors.push(syn::Error::new(
                sig.fn_token.span,
                format!(
                    "`#[distributed_lock]` must be placed above `#[tokio::main]` / `#[tokio::test]`: \
                     that attribute has already turned `{}` into a blocking `fn`",
                    sig.ident
                ),
            ));
            return None;
        } else {
            errors.push(syn::Error::new(
                sig.fn_token.span,
                format!(
                    "`#[distributed_lock]` can only be applied to an `async fn`; make `{}` async",
                    sig.ident
                ),
            ));
            return None;
        };
        match result_error_type(&ret) {
            Ok(err) => Some(Shape { kind, ret, err }),
            Err(e) => {
                errors.push(e);
                None
            }
        }
    }
}

/// Whether a runtime attribute such as `#[tokio::main]` above ours has already
/// rewritten the `async fn` into a blocking one (`.block_on(body)`).
pub(crate) fn made_blocking_by_runtime_attribute(func: &ItemFn) -> bool {
    fn mentions_block_on(tokens: TokenStream) -> bool {
        tokens.into_iter().any(|t| match t {
            proc_macro2::TokenTree::Ident(i) => i == "block_on",
            proc_macro2::TokenTree::Group(g) => mentions_block_on(g.stream()),
            _ => false,
        })
    }
    mentions_block_on(func.block.to_token_stream())
}

/// The index of a final `Box::pin(async move { .. })` statement, the shape
/// `#[async_trait]` gives a method.
pub(crate) fn async_trait_body(block: &Block) -> Option<usize> {
    let index = block.stmts.len().checked_sub(1)?;
    let Stmt::Expr(Expr::Call(call), None) = &block.stmts[index] else {
        return None;
    };
    let Expr::Path(path) = &*call.func else {
        return None;
    };
    let segments: Vec<String> = path
        .path
        .segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect();
    let is_box_pin = segments.len() >= 2 && segments[segments.len() - 2..] == ["Box", "pin"];
    (is_box_pin && call.args.len() == 1 && matches!(call.args[0], Expr::Async(_))).then_some(index)
}

/// `R` in `Pin<Box<dyn Future<Output = R> + Send + 'async_trait>>`.
pub(crate) fn future_output(output: &ReturnType) -> Option<&Type> {
    fn in_type(ty: &Type) -> Option<&Type> {
        match ty {
            Type::Paren(t) => in_type(&t.elem),
            Type::Group(t) => in_type(&t.elem),
            Type::Path(t) => in_path(&t.path),
            Type::TraitObject(t) => in_bounds(t.bounds.iter()),
            Type::ImplTrait(t) => in_bounds(t.bounds.iter()),
            _ => None,
        }
    }
    fn in_bounds<'a>(mut bounds: impl Iterator<Item = &'a TypeParamBound>) -> Option<&'a Type> {
        bounds.find_map(|b| match b {
            TypeParamBound::Trait(t) => in_path(&t.path),
            _ => None,
        })
    }
    fn in_path(path: &syn::Path) -> Option<&Type> {
        path.segments.iter().find_map(|seg| {
            let PathArguments::AngleBracketed(args) = &seg.arguments else {
                return None;
            };
            args.args.iter().find_map(|arg| match arg {
                GenericArgument::AssocType(a) if a.ident == "Output" => Some(&a.ty),
                GenericArgument::Type(t) => in_type(t),
                _ => None,
            })
        })
    }
    match output {
        ReturnType::Type(_, ty) => in_type(ty),
        ReturnType::Default => None,
    }
}

/// Checks that `ty` is a `Result` and returns its error type when it is
/// spelled out (`Result<T, E>`); `io::Result<T>`-style aliases give `None`.
pub(crate) fn result_error_type(ty: &Type) -> syn::Result<Option<Type>> {
    let mut inner = ty;
    while let Type::Paren(syn::TypeParen { elem, .. }) | Type::Group(syn::TypeGroup { elem, .. }) =
        inner
    {
        inner = elem;
    }
    if let Type::Path(p) = inner {
        if let (None, Some(last)) = (&p.qself, p.path.segments.last()) {
            let name = last.ident.to_string();
            if name == "Result" {
                if let PathArguments::AngleBracketed(args) = &last.arguments {
                    let types: Vec<&Type> = args
                        .args
                        .iter()
                        .filter_map(|a| match a {
                            GenericArgument::Type(t) => Some(t),
                            _ => None,
                        })
                        .collect();
                    if let [_, err] = types[..] {
                        return Ok((!contains_impl_trait(err)).then(|| err.clone()));
                    }
                }
                return Ok(None);
            }
            if name.ends_with("Result") {
                return Ok(None);
            }
        }
    }
    Err(syn::Error::new_spanned(
        ty,
        format!(
            "`#[distributed_lock]` functions must return `Result<T, E>` with \
             `E: From<distlock::LockError>`, so that a lock that cannot be taken can be reported; \
             found `{}`",
            pretty(ty)
        ),
    ))
}

/// Tokens printed the way people write them: `Option<u64>`, not `Option < u64 >`.
pub(crate) fn pretty(tokens: &impl ToTokens) -> String {
    let mut s = tokens.to_token_stream().to_string();
    for (from, to) in [
        (" :: ", "::"),
        (":: ", "::"),
        (" < ", "<"),
        ("< ", "<"),
        (" <", "<"),
        (" >", ">"),
        (" ,", ","),
        ("& ", "&"),
        ("( ", "("),
        (" )", ")"),
        ("[ ", "["),
        (" ]", "]"),
        (" ;", ";"),
    ] {
        while s.contains(from) {
            s = s.replace(from, to);
        }
    }
    s
}

pub(crate) fn contains_impl_trait(ty: &Type) -> bool {
    struct Find(bool);
    impl VisitMut for Find {
        fn visit_type_impl_trait_mut(&mut self, _: &mut syn::TypeImplTrait) {
            self.0 = true;
        }
    }
    let mut find = Find(false);
    find.visit_type_mut(&mut ty.clone());
    find.0
}
