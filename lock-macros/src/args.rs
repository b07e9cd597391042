//! The attribute's arguments: syntax (`name = value, ...`) first, then a typed
//! model with every problem reported at once.

use std::time::Duration;

use proc_macro2::{Span, TokenStream};
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::{Expr, ExprLit, Ident, Lit, LitStr, Token};

use crate::duration::{self, DurationKind};
use crate::errors::Errors;
use crate::template::Template;

/// Every option the attribute knows, in documentation order.
pub(crate) const OPTIONS: &[&str] = &[
    "key", "lease", "wait", "max_hold", "min_hold", "renew", "fair", "manager", "guard", "on_lost",
    "crate",
];

/// Names people reach for that mean one of ours.
const ALIASES: &[(&str, &str)] = &[
    ("name", "key"),
    ("ttl", "lease"),
    ("expire", "lease"),
    ("expiry", "lease"),
    ("timeout", "wait"),
    ("wait_timeout", "wait"),
    ("max_duration", "max_hold"),
    ("max_hold_time", "max_hold"),
    ("max_time", "max_hold"),
    ("hold_at_most", "max_hold"),
    ("hold_timeout", "max_hold"),
    ("hold_limit", "max_hold"),
    ("lock_at_least_for", "min_hold"),
    ("hold_at_least", "min_hold"),
    ("min_duration", "min_hold"),
    ("auto_renew", "renew"),
    ("watchdog", "renew"),
    ("client", "manager"),
];

/// One `name = value` pair as written.
struct RawArg {
    name: Ident,
    value: Expr,
}

/// A `lease`/`wait`/`max_hold`/`min_hold` value.
pub(crate) enum DurationArg {
    /// A literal checked at compile time.
    Literal { value: Duration, span: Span },
    /// Any expression of type `std::time::Duration`, checked by rustc.
    Expr(Box<Expr>),
}

/// What to do when the lease is lost while the body runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum OnLost {
    /// Drop the body at its next `.await` and return `LockError::Lost`.
    #[default]
    Abort,
    /// Let the body finish; it can check `guard.is_lost()` itself.
    Ignore,
}

/// The validated options.
#[derive(Default)]
pub(crate) struct Options {
    pub(crate) key: Option<(LitStr, Template)>,
    pub(crate) lease: Option<DurationArg>,
    pub(crate) wait: Option<DurationArg>,
    pub(crate) max_hold: Option<DurationArg>,
    pub(crate) min_hold: Option<DurationArg>,
    pub(crate) renew: Option<syn::LitBool>,
    /// `fair = true`: a fair lock (`LockManager::fair_lock`), waiters served
    /// in arrival order.
    pub(crate) fair: Option<syn::LitBool>,
    pub(crate) manager: Option<Expr>,
    pub(crate) guard: Option<Ident>,
    pub(crate) on_lost: OnLost,
    pub(crate) krate: Option<syn::Path>,
}

impl Options {
    /// Parses and validates the attribute's arguments. On error the returned
    /// options hold whatever was valid, so later checks can still run.
    pub(crate) fn parse(args: TokenStream, errors: &mut Errors) -> Options {
        let mut opts = Options::default();
        let (raw, syntax_ok) = match parse_raw.parse2(args) {
            Ok((raw, flag_errors)) => {
                let ok = flag_errors.is_empty();
                for e in flag_errors {
                    errors.push(e);
                }
                (raw, ok)
            }
            Err(e) => {
                errors.push(e);
                (Vec::new(), false)
            }
        };

        let mut seen: Vec<Ident> = Vec::new();
        for RawArg { name, value } in raw {
            let name_str = name.unraw().to_string();
            if !OPTIONS.contains(&name_str.as_str()) {
                errors.push(syn::Error::new(
                    name.span(),
                    unknown_option_message(&name_str),
                ));
                continue;
            }
            if seen.iter().any(|s| s.unraw() == name_str) {
                errors.push(syn::Error::new(
                    name.span(),
                    format!("duplicate option `{name_str}`: each option may be given once"),
                ));
                continue;
            }
            seen.push(name.clone());
            match name_str.as_str() {
                "key" => match lit_str(&value) {
                    Some(lit) => match Template::parse(&lit.value()) {
                        Ok(t) => opts.key = Some((lit.clone(), t)),
                        Err(msgs) => {
                            for m in msgs {
                                errors.push(syn::Error::new(lit.span(), m));
                            }
                        }
                    },
                    None => errors.push(syn::Error::new_spanned(
                        &value,
                        "`key` takes a string literal template, e.g. `key = \"order:{order_id}\"`",
                    )),
                },
                "lease" => opts.lease = duration_arg(DurationKind::Lease, value, errors),
                "wait" => opts.wait = duration_arg(DurationKind::Wait, value, errors),
                "max_hold" => {
                    opts.max_hold = duration_arg(DurationKind::MaxHold, value, errors);
                }
                "min_hold" => {
                    opts.min_hold = duration_arg(DurationKind::MinHold, value, errors);
                }
                "renew" => match &value {
                    Expr::Lit(ExprLit {
                        lit: Lit::Bool(b), ..
                    }) => opts.renew = Some(b.clone()),
                    _ => errors.push(syn::Error::new_spanned(
                        &value,
                        "`renew` takes `true` or `false`, e.g. `renew = false`",
                    )),
                },
                "fair" => match &value {
                    Expr::Lit(ExprLit {
                        lit: Lit::Bool(b), ..
                    }) => opts.fair = Some(b.clone()),
                    _ => errors.push(syn::Error::new_spanned(
                        &value,
                        "`fair` takes `true` or `false`, e.g. `fair = true`",
                    )),
                },
                "manager" => {
                    if let Expr::Lit(_) = value {
                        errors.push(syn::Error::new_spanned(
                            &value,
                            "`manager` takes an expression giving a `LockManager` (or a reference to one), \
                             e.g. `manager = self.locks` or `manager = &LOCKS`",
                        ));
                    } else {
                        opts.manager = Some(value);
                    }
                }
                "guard" => match &value {
                    Expr::Path(p)
                        if p.attrs.is_empty() && p.qself.is_none() && p.path.get_ident().is_some() =>
                    {
                        opts.guard = p.path.get_ident().cloned();
                    }
                    _ => errors.push(syn::Error::new_spanned(
                        &value,
                        "`guard` takes an identifier to bind the `&LockGuard` to, e.g. `guard = lock`",
                    )),
                },
                "on_lost" => match lit_str(&value) {
                    Some(lit) => match lit.value().as_str() {
                        "abort" => opts.on_lost = OnLost::Abort,
                        "ignore" => opts.on_lost = OnLost::Ignore,
                        other => {
                            let hint = nearest(other, &["abort", "ignore"])
                                .map(|n| format!("did you mean \"{n}\"? "))
                                .unwrap_or_default();
                            errors.push(syn::Error::new(
                                lit.span(),
                                format!(
                                    "unknown `on_lost` value \"{other}\": {hint}expected \"abort\" \
                                     (stop the body at its next `.await` and return `LockError::Lost`) \
                                     or \"ignore\" (let the body finish)"
                                ),
                            ));
                        }
                    },
                    None => errors.push(syn::Error::new_spanned(
                        &value,
                        "`on_lost` takes a string: `on_lost = \"abort\"` or `on_lost = \"ignore\"`",
                    )),
                },
                "crate" => match lit_str(&value) {
                    Some(lit) => match lit.parse::<syn::Path>() {
                        Ok(path) => opts.krate = Some(path),
                        Err(_) => errors.push(syn::Error::new(
                            lit.span(),
                            format!("`crate` takes the path of the distlock crate, e.g. `crate = \"::my_locks\"`; \"{}\" is not a path", lit.value()),
                        )),
                    },
                    None => errors.push(syn::Error::new_spanned(
                        &value,
                        "`crate` takes the path of the distlock crate as a string, e.g. `crate = \"::my_locks\"`",
                    )),
                },
                _ => unreachable!("every name in OPTIONS is handled"),
            }
        }

        if syntax_ok && opts.key.is_none() && !seen.iter().any(|s| s == "key") {
            errors.push(syn::Error::new(
                Span::call_site(),
                "missing required option `key`: name the lock, e.g. \
                 `#[distributed_lock(key = \"order:{order_id}\")]`",
            ));
        }
        opts
    }
}

/// `name = value` pairs separated by commas. A bare `name` is reported (one
/// error per flag, in the second tuple field) without stopping the parse.
fn parse_raw(input: ParseStream) -> syn::Result<(Vec<RawArg>, Vec<syn::Error>)> {
    let mut args = Vec::new();
    let mut flag_errors = Vec::new();
    while !input.is_empty() {
        let name = input.call(Ident::parse_any).map_err(|e| {
            syn::Error::new(
                e.span(),
                "expected an option such as `key = \"...\"`; options are written `name = value`",
            )
        })?;
        if input.peek(Token![=]) {
            input.parse::<Token![=]>()?;
            let value: Expr = input.parse()?;
            args.push(RawArg { name, value });
        } else if input.is_empty() || input.peek(Token![,]) {
            let n = name.unraw().to_string();
            let example = match n.as_str() {
                "renew" => "renew = false".to_owned(),
                "fair" => "fair = true".to_owned(),
                "guard" => "guard = lock".to_owned(),
                "on_lost" => "on_lost = \"ignore\"".to_owned(),
                "key" => "key = \"order:{order_id}\"".to_owned(),
                "lease" => "lease = \"30s\"".to_owned(),
                "wait" => "wait = \"5s\"".to_owned(),
                "max_hold" => "max_hold = \"10m\"".to_owned(),
                "min_hold" => "min_hold = \"30s\"".to_owned(),
                _ => format!("{n} = ..."),
            };
            let msg = if OPTIONS.contains(&n.as_str()) {
                format!("option `{n}` needs a value, e.g. `{example}`")
            } else {
                unknown_option_message(&n)
            };
            flag_errors.push(syn::Error::new(name.span(), msg));
        } else {
            return Err(input.error("expected `=` after the option name"));
        }
        if input.is_empty() {
            break;
        }
        input.parse::<Token![,]>()?;
    }
    Ok((args, flag_errors))
}

fn unknown_option_message(name: &str) -> String {
    let alias = ALIASES
        .iter()
        .find(|(a, _)| a.eq_ignore_ascii_case(name))
        .map(|(_, o)| *o);
    match alias.or_else(|| nearest(name, OPTIONS)) {
        Some(suggestion) => format!("unknown option `{name}`; did you mean `{suggestion}`?"),
        None => format!(
            "unknown option `{name}`; the options are: {}",
            OPTIONS
                .iter()
                .map(|o| format!("`{o}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn lit_str(e: &Expr) -> Option<&LitStr> {
    match e {
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => Some(s),
        _ => None,
    }
}

fn duration_arg(kind: DurationKind, value: Expr, errors: &mut Errors) -> Option<DurationArg> {
    let name = kind.option_name();
    match &value {
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => match duration::parse(kind, &s.value()) {
            Ok(d) => Some(DurationArg::Literal {
                value: d,
                span: s.span(),
            }),
            Err(m) => {
                errors.push(syn::Error::new(s.span(), m));
                None
            }
        },
        Expr::Lit(ExprLit {
            lit: lit @ (Lit::Int(_) | Lit::Float(_)),
            ..
        }) => {
            errors.push(syn::Error::new(
                lit.span(),
                format!(
                    "`{name}` needs a unit: write a duration string such as \"{}s\" or \"{}ms\", \
                     or an expression of type `std::time::Duration`",
                    lit_digits(lit),
                    lit_digits(lit)
                ),
            ));
            None
        }
        Expr::Lit(_) => {
            errors.push(syn::Error::new_spanned(
                &value,
                format!(
                    "`{name}` takes a duration string such as \"30s\" or an expression of type \
                     `std::time::Duration`"
                ),
            ));
            None
        }
        _ => Some(DurationArg::Expr(Box::new(value))),
    }
}

fn lit_digits(lit: &Lit) -> String {
    match lit {
        Lit::Int(i) => i.base10_digits().to_owned(),
        Lit::Float(f) => f.base10_digits().to_owned(),
        _ => String::new(),
    }
}

/// The candidate closest to `name` by edit distance, if it is close enough to
/// be a likely typo (at most a third of the longer name, and at least one
/// edit allowed).
pub(crate) fn nearest<'a>(name: &str, candidates: &[&'a str]) -> Option<&'a str> {
    candidates
        .iter()
        .map(|c| (edit_distance(name, c), *c))
        .filter(|&(d, c)| d <= (name.chars().count().max(c.chars().count()) / 3).max(1))
        .min_by_key(|&(d, _)| d)
        .map(|(_, c)| c)
}

/// Levenshtein distance over chars, case-sensitive.
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.chars().enumerate() {
        cur[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let subst = prev[j] + usize::from(ca != cb);
            cur[j + 1] = subst.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn parse(args: TokenStream) -> (Options, Vec<String>) {
        let mut errors = Errors::default();
        let opts = Options::parse(args, &mut errors);
        let msgs = errors.into_vec().iter().map(ToString::to_string).collect();
        (opts, msgs)
    }

    #[test]
    fn edit_distances() {
        assert_eq!(edit_distance("", ""), 0);
        assert_eq!(edit_distance("lease", "lease"), 0);
        assert_eq!(edit_distance("leese", "lease"), 1);
        assert_eq!(edit_distance("lese", "lease"), 1);
        assert_eq!(edit_distance("kye", "key"), 2);
        assert_eq!(edit_distance("onlost", "on_lost"), 1);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "wait"), 4);
        assert_eq!(edit_distance("größe", "grosse"), 3);
    }

    #[test]
    fn nearest_option() {
        assert_eq!(nearest("leese", OPTIONS), Some("lease"));
        assert_eq!(nearest("onlost", OPTIONS), Some("on_lost"));
        assert_eq!(nearest("renw", OPTIONS), Some("renew"));
        assert_eq!(nearest("managr", OPTIONS), Some("manager"));
        assert_eq!(nearest("kye", OPTIONS), None);
        assert_eq!(nearest("ky", OPTIONS), Some("key"));
        assert_eq!(nearest("frobnicate", OPTIONS), None);
    }

    #[test]
    fn unknown_option_messages() {
        assert_eq!(
            unknown_option_message("leese"),
            "unknown option `leese`; did you mean `lease`?"
        );
        assert_eq!(
            unknown_option_message("timeout"),
            "unknown option `timeout`; did you mean `wait`?"
        );
        assert!(unknown_option_message("frobnicate")
            .contains("`key`, `lease`, `wait`, `max_hold`, `min_hold`"));
        for alias in ["max_duration", "hold_at_most", "max_hold_time"] {
            assert_eq!(
                unknown_option_message(alias),
                format!("unknown option `{alias}`; did you mean `max_hold`?")
            );
        }
        assert_eq!(
            unknown_option_message("maxhold"),
            "unknown option `maxhold`; did you mean `max_hold`?"
        );
    }

    #[test]
    fn full_option_set() {
        let (o, e) = parse(quote! {
            key = "order:{id}", lease = "30s", wait = "0s", max_hold = "10m", renew = false,
            manager = self.locks, guard = lock, on_lost = "ignore", crate = "::my_locks"
        });
        assert!(e.is_empty(), "{e:?}");
        assert_eq!(o.key.unwrap().0.value(), "order:{id}");
        assert!(
            matches!(o.lease, Some(DurationArg::Literal { value, .. }) if value == Duration::from_secs(30))
        );
        assert!(matches!(o.wait, Some(DurationArg::Literal { value, .. }) if value.is_zero()));
        assert!(
            matches!(o.max_hold, Some(DurationArg::Literal { value, .. }) if value == Duration::from_secs(600))
        );
        assert!(!o.renew.unwrap().value);
        assert!(o.manager.is_some());
        assert_eq!(o.guard.unwrap().to_string(), "lock");
        assert_eq!(o.on_lost, OnLost::Ignore);
        let krate = o.krate.unwrap();
        assert_eq!(quote!(#krate).to_string(), quote!(::my_locks).to_string());
    }

    #[test]
    fn duration_expressions() {
        let (o, e) = parse(
            quote! { key = "k", lease = Duration::from_secs(5), wait = self.wait, max_hold = MAX },
        );
        assert!(e.is_empty(), "{e:?}");
        assert!(matches!(o.lease, Some(DurationArg::Expr(_))));
        assert!(matches!(o.max_hold, Some(DurationArg::Expr(_))));
        assert!(matches!(o.wait, Some(DurationArg::Expr(_))));
    }

    #[test]
    fn all_errors_at_once() {
        let (_, e) = parse(quote! {
            key = "", leese = "30s", wait = 5, renew = "yes", on_lost = "stop", guard = a.b, key = "x"
        });
        assert_eq!(e.len(), 7, "{e:?}");
        assert!(e[0].contains("must not be empty"));
        assert!(e[1].contains("did you mean `lease`"));
        assert!(e[2].contains("needs a unit"));
        assert!(e[3].contains("`renew` takes `true` or `false`"));
        assert!(e[4].contains("unknown `on_lost` value \"stop\""));
        assert!(e[5].contains("`guard` takes an identifier"));
        assert!(e[6].contains("duplicate option `key`"));
    }

    #[test]
    fn min_hold_like_max_hold() {
        for alias in ["lock_at_least_for", "hold_at_least", "min_duration"] {
            assert_eq!(
                unknown_option_message(alias),
                format!("unknown option `{alias}`; did you mean `min_hold`?")
            );
        }
        let (o, e) = parse(quote! { key = "k", lease = "10s", min_hold = "1m" });
        assert!(e.is_empty(), "{e:?}");
        assert!(
            matches!(o.min_hold, Some(DurationArg::Literal { value, .. }) if value == Duration::from_secs(60))
        );
        let (o, e) = parse(quote! { key = "k", min_hold = "0s", max_hold = "0s" });
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(e[0].contains("`min_hold` must be longer than zero"));
        assert!(o.min_hold.is_none());
        let (_, e) = parse(quote! { key = "k", min_hold = 30 });
        assert!(e[0].contains("`min_hold` needs a unit"), "{e:?}");
        let (_, e) = parse(quote! { key = "k", min_hold });
        assert!(e[0].contains("e.g. `min_hold = \"30s\"`"), "{e:?}");
        let (o, e) = parse(quote! { key = "k", min_hold = self.period });
        assert!(e.is_empty(), "{e:?}");
        assert!(matches!(o.min_hold, Some(DurationArg::Expr(_))));
    }

    #[test]
    fn max_hold_errors_with_the_others() {
        let (o, e) = parse(quote! {
            key = "k", lease = "0s", max_hold = "0s", wait = "soon"
        });
        assert_eq!(e.len(), 3, "{e:?}");
        assert!(e[0].contains("`lease` must be longer than zero"));
        assert!(e[1].contains("`max_hold` must be longer than zero"));
        assert!(e[2].contains("invalid `wait` duration"));
        assert!(o.max_hold.is_none());
        // Shorter than the lease is fine: it only caps the hold.
        let (o, e) = parse(quote! { key = "k", lease = "30s", max_hold = "5s" });
        assert!(e.is_empty(), "{e:?}");
        assert!(o.max_hold.is_some());
        let (_, e) = parse(quote! { key = "k", max_hold = 10 });
        assert!(e[0].contains("`max_hold` needs a unit"), "{e:?}");
        let (_, e) = parse(quote! { key = "k", max_hold });
        assert!(e[0].contains("e.g. `max_hold = \"10m\"`"), "{e:?}");
    }

    #[test]
    fn missing_key() {
        let (_, e) = parse(quote! { lease = "30s" });
        assert_eq!(e.len(), 1);
        assert!(e[0].starts_with("missing required option `key`"));
        let (_, e) = parse(quote! {});
        assert!(e[0].starts_with("missing required option `key`"));
    }

    #[test]
    fn flags_need_values() {
        let (_, e) = parse(quote! { key = "k", renew, guard });
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(e[0].contains("option `renew` needs a value, e.g. `renew = false`"));
    }

    #[test]
    fn syntax_errors_stop_without_missing_key_noise() {
        let (_, e) = parse(quote! { key "k" });
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].contains("expected `=`"));
    }
}
