//! The attribute's arguments: syntax (`name = value, ...`) first, then a typed
//! model with every problem reported at once.

use std::time::Duration;

use proc_macro2::{Span, TokenStream};
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::{Expr, ExprLit, Ident, Lit, LitStr, Pat, Token};

use crate::duration::{self, DurationKind};
use crate::errors::Errors;
use crate::template::Template;

/// One option of the attribute: everything about it but how its value is
/// checked (see `Args::parse`). Parsing, the messages for unknown options and
/// options without a value, and the option table of the attribute's docs
/// (`src/distributed_lock.md`, checked by a test) all follow this table.
pub(crate) struct OptionSpec {
    pub(crate) name: &'static str,
    /// Names people reach for that mean this option.
    pub(crate) aliases: &'static [&'static str],
    /// How it is written, for messages.
    pub(crate) example: &'static str,
    /// The docs table's "value" column.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) value: &'static str,
    /// The docs table's "default" column.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) default: &'static str,
}

/// Every option the attribute knows, in documentation order.
pub(crate) const OPTIONS: &[OptionSpec] = &[
    OptionSpec {
        name: "key",
        aliases: &["name", "keys"],
        example: "key = \"order:{order_id}\"",
        value: "string template: `{param}`, `{param.field}`, `{self.field}`; or a [list](#key-lists) of them, with `TEMPLATE for PAT in EXPR` elements",
        default: "required",
    },
    OptionSpec {
        name: "lease",
        aliases: &["ttl", "expire", "expiry"],
        example: "lease = \"30s\"",
        value: "`\"30s\"`-style literal, or a `Duration` expression",
        default: "the manager's default",
    },
    OptionSpec {
        name: "wait",
        aliases: &["timeout", "wait_timeout"],
        example: "wait = \"5s\"",
        value: "`\"5s\"`-style literal (`\"0s\"` = one attempt), or a `Duration` expression",
        default: "the manager's default",
    },
    OptionSpec {
        name: "max_hold",
        aliases: &["max_duration", "max_hold_time", "max_time", "hold_at_most", "hold_timeout", "hold_limit"],
        example: "max_hold = \"10m\"",
        value: "`\"10m\"`-style literal (above zero), or a `Duration` expression",
        default: "no limit",
    },
    OptionSpec {
        name: "min_hold",
        aliases: &["lock_at_least_for", "hold_at_least", "min_duration"],
        example: "min_hold = \"30s\"",
        value: "`\"30s\"`-style literal (above zero), or a `Duration` expression",
        default: "none",
    },
    OptionSpec {
        name: "renew",
        aliases: &["auto_renew", "watchdog"],
        example: "renew = false",
        value: "`true` / `false`",
        default: "`true`",
    },
    OptionSpec {
        name: "eager_fencing",
        aliases: &[],
        example: "eager_fencing = true",
        value: "`true` / `false`",
        default: "the manager's (`false`)",
    },
    OptionSpec {
        name: "reentrant",
        aliases: &["reentry", "re_entrant", "recursive"],
        example: "reentrant = false",
        value: "`true` / `false`",
        default: "`true`",
    },
    OptionSpec {
        name: "mode",
        aliases: &["lock_mode", "kind", "read", "write", "shared", "exclusive", "rw", "read_write"],
        example: "mode = \"read\"",
        value: "`\"exclusive\"` / `\"read\"` / `\"write\"`",
        default: "`\"exclusive\"`",
    },
    OptionSpec {
        name: "permits",
        aliases: &["semaphore", "permit", "max_permits", "concurrency", "max_concurrency", "limit"],
        example: "permits = 3",
        value: "integer literal from 1 to `u32::MAX`, or a `u32` expression: a semaphore",
        default: "none (one holder)",
    },
    OptionSpec {
        name: "manager",
        aliases: &["client"],
        example: "manager = self.locks",
        value: "expression giving a `LockManager`, `&LockManager`, `Arc<LockManager>`...",
        default: "the call chain's `with_default_manager`, else the global manager",
    },
    OptionSpec {
        name: "guard",
        aliases: &[],
        example: "guard = lock",
        value: "identifier to bind the `&LockGuard` (for a key list, `&MultiLockGuard`) to in the body",
        default: "none",
    },
    OptionSpec {
        name: "on_lost",
        aliases: &[],
        example: "on_lost = \"ignore\"",
        value: "`\"abort\"` / `\"ignore\"`",
        default: "`\"abort\"`",
    },
    OptionSpec {
        name: "crate",
        aliases: &[],
        example: "crate = \"my_distlock\"",
        value: "path of the `distlock` crate, as a string",
        default: "`::distlock`",
    },
];

/// The option named `name`.
fn option(name: &str) -> Option<&'static OptionSpec> {
    OPTIONS.iter().find(|o| o.name == name)
}

/// The options' names, in documentation order.
fn option_names() -> Vec<&'static str> {
    OPTIONS.iter().map(|o| o.name).collect()
}

/// The values `mode` accepts.
const MODES: &[&str] = &["exclusive", "read", "write"];

/// `mode` values people reach for that mean one of ours.
const MODE_ALIASES: &[(&str, &str)] = &[
    ("shared", "read"),
    ("reader", "read"),
    ("writer", "write"),
    ("mutex", "exclusive"),
    ("exclusive_lock", "exclusive"),
];

/// One `name = value` pair as written.
struct RawArg {
    name: Ident,
    value: RawValue,
}

/// A value as written: any expression, or for `key` the key syntax.
enum RawValue {
    Expr(Expr),
    Key(Box<RawKey>),
}

/// `key = ELEM` or `key = [ELEM, ELEM, ..]`.
enum RawKey {
    One(Box<RawElem>),
    List {
        bracket: syn::token::Bracket,
        elems: Vec<RawElem>,
    },
}

/// `EXPR` (a template, once checked) optionally followed by `for PAT in EXPR`.
struct RawElem {
    template: Expr,
    each: Option<ForEach>,
}

/// The `for PAT in EXPR` of a key element.
pub(crate) struct ForEach {
    pub(crate) for_token: Token![for],
    pub(crate) pat: Pat,
    pub(crate) expr: Expr,
}

/// A key template as written and as parsed.
pub(crate) struct KeyTemplate {
    pub(crate) lit: LitStr,
    pub(crate) template: Template,
}

/// One element of a key list: a template, formatted once, or a template
/// formatted for each item of a collection.
pub(crate) struct KeyElem {
    pub(crate) key: KeyTemplate,
    pub(crate) each: Option<ForEach>,
}

/// The `key` option.
pub(crate) enum Key {
    /// `key = "order:{id}"`: one lock, taken with `LockManager::lock` (or
    /// `read_lock`/`write_lock`/`semaphore`).
    Single(KeyTemplate),
    /// `key = [..]` or `key = "sku:{sku}" for sku in skus`: exclusive locks on
    /// every key, taken together with `LockManager::lock_all`.
    List(Vec<KeyElem>),
}

impl Key {
    /// The metrics label: the template as written, or for a list the templates
    /// as written joined with `+` (bounded: one per attribute).
    pub(crate) fn metrics_label(&self) -> String {
        match self {
            Key::Single(k) => k.lit.value(),
            Key::List(elems) => elems
                .iter()
                .map(|e| e.key.lit.value())
                .collect::<Vec<_>>()
                .join("+"),
        }
    }
}

/// `mode = "exclusive" | "read" | "write"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Mode {
    /// `LockManager::lock`, as without `mode`.
    #[default]
    Exclusive,
    /// `LockManager::read_lock`: shared with other readers.
    Read,
    /// `LockManager::write_lock`: exclusive of readers and writers.
    Write,
}

/// A `permits` value.
pub(crate) enum PermitsArg {
    /// An integer literal from 1 to `u32::MAX`, checked at compile time.
    Literal { value: u32, span: Span },
    /// Any expression of type `u32`, checked by rustc.
    Expr(Box<Expr>),
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
    pub(crate) key: Option<Key>,
    pub(crate) lease: Option<DurationArg>,
    pub(crate) wait: Option<DurationArg>,
    pub(crate) max_hold: Option<DurationArg>,
    pub(crate) min_hold: Option<DurationArg>,
    pub(crate) renew: Option<syn::LitBool>,
    /// `eager_fencing = true`: the token is issued inside the acquisition.
    pub(crate) eager_fencing: Option<syn::LitBool>,
    /// `reentrant = false`: a nested acquisition of a held key is an error.
    pub(crate) reentrant: Option<syn::LitBool>,
    pub(crate) mode: Mode,
    pub(crate) permits: Option<PermitsArg>,
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
        let mut key_is_list = false;
        for RawArg { name, value } in raw {
            let name_str = name.unraw().to_string();
            if option(&name_str).is_none() {
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
            let value = match value {
                RawValue::Key(raw) => {
                    key_is_list = match &*raw {
                        RawKey::List { .. } => true,
                        RawKey::One(elem) => elem.each.is_some(),
                    };
                    opts.key = key_option(*raw, errors);
                    continue;
                }
                RawValue::Expr(value) => ungrouped(value),
            };
            match name_str.as_str() {
                // `parse_raw` gives `key` a `RawValue::Key`; this arm keeps the
                // match total.
                "key" => opts.key = key_option(
                    RawKey::One(Box::new(RawElem {
                        template: value,
                        each: None,
                    })),
                    errors,
                ),
                "mode" => match lit_str(&value) {
                    Some(lit) => match parse_mode(lit) {
                        Ok(mode) => opts.mode = mode,
                        Err(e) => errors.push(e),
                    },
                    None => errors.push(syn::Error::new_spanned(
                        &value,
                        "`mode` takes a string: `mode = \"read\"`, `mode = \"write\"` or \
                         `mode = \"exclusive\"` (the default)",
                    )),
                },
                "permits" => opts.permits = permits_arg(value, errors),
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
                "eager_fencing" => match &value {
                    Expr::Lit(ExprLit {
                        lit: Lit::Bool(b), ..
                    }) => opts.eager_fencing = Some(b.clone()),
                    _ => errors.push(syn::Error::new_spanned(
                        &value,
                        "`eager_fencing` takes `true` or `false`, e.g. `eager_fencing = true`",
                    )),
                },
                "reentrant" => match &value {
                    Expr::Lit(ExprLit {
                        lit: Lit::Bool(b), ..
                    }) => opts.reentrant = Some(b.clone()),
                    _ => errors.push(syn::Error::new_spanned(
                        &value,
                        "`reentrant` takes `true` or `false`, e.g. `reentrant = false`",
                    )),
                },
                "manager" => {
                    if let Expr::Lit(_) = value {
                        errors.push(syn::Error::new_spanned(
                            &value,
                            "`manager` takes an expression giving a `LockManager` (or a reference to one), \
                             e.g. `manager = self.locks`, `manager = self.shared` (an `Arc`) or \
                             `manager = &*LOCKS` (a `LazyLock` static)",
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

        conflicts(&seen, key_is_list, errors);
        hold_order(&opts, errors);

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
            let value = if name.unraw() == "key" {
                RawValue::Key(Box::new(parse_key(input)?))
            } else {
                RawValue::Expr(input.parse()?)
            };
            args.push(RawArg { name, value });
        } else if input.is_empty() || input.peek(Token![,]) {
            let n = name.unraw().to_string();
            let msg = match option(&n) {
                Some(spec) => format!("option `{n}` needs a value, e.g. `{}`", spec.example),
                None => unknown_option_message(&n),
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

/// `ELEM` or `[ELEM, ..]` (a trailing comma allowed).
fn parse_key(input: ParseStream) -> syn::Result<RawKey> {
    if !input.peek(syn::token::Bracket) {
        return Ok(RawKey::One(Box::new(parse_key_elem(input)?)));
    }
    let content;
    let bracket = syn::bracketed!(content in input);
    let mut elems = Vec::new();
    while !content.is_empty() {
        elems.push(parse_key_elem(&content)?);
        if content.is_empty() {
            break;
        }
        content.parse::<Token![,]>()?;
    }
    Ok(RawKey::List { bracket, elems })
}

/// `EXPR` or `EXPR for PAT in EXPR`.
fn parse_key_elem(input: ParseStream) -> syn::Result<RawElem> {
    let template = ungrouped(input.parse()?);
    let each = if input.peek(Token![for]) {
        let for_token = input.parse::<Token![for]>()?;
        let pat = Pat::parse_multi_with_leading_vert(input)?;
        input.parse::<Token![in]>().map_err(|e| {
            syn::Error::new(
                e.span(),
                "expected `in` after the pattern: a key element is `\"sku:{sku}\" for sku in skus`",
            )
        })?;
        let expr: Expr = input.parse()?;
        Some(ForEach {
            for_token,
            pat,
            expr,
        })
    } else {
        None
    };
    Ok(RawElem { template, each })
}

/// The `key` option from its syntax: a single template (today's form, with its
/// messages), or a list whose elements are each checked, all of them reported.
fn key_option(raw: RawKey, errors: &mut Errors) -> Option<Key> {
    match raw {
        RawKey::One(elem) if elem.each.is_none() => {
            let template = elem.template;
            let Some(lit) = lit_str(&template) else {
                errors.push(syn::Error::new_spanned(
                    &template,
                    "`key` takes a string literal template, e.g. `key = \"order:{order_id}\"`",
                ));
                return None;
            };
            key_template(lit, errors).map(Key::Single)
        }
        RawKey::One(elem) => key_elem(*elem, errors).map(|e| Key::List(vec![e])),
        RawKey::List { bracket, elems } => {
            if elems.is_empty() {
                errors.push(syn::Error::new(
                    bracket.span.join(),
                    "`key = []` names no lock: list at least one key, e.g. \
                     `key = [\"order:{order_id}\", \"user:{user_id}\"]`",
                ));
                return None;
            }
            let mut out: Vec<KeyElem> = Vec::new();
            for elem in elems {
                let Some(elem) = key_elem(elem, errors) else {
                    continue;
                };
                if elem.each.is_none() {
                    let value = elem.key.lit.value();
                    if out
                        .iter()
                        .any(|e| e.each.is_none() && e.key.lit.value() == value)
                    {
                        errors.push(syn::Error::new(
                            elem.key.lit.span(),
                            format!(
                                "the key \"{value}\" is already in the list: it is the same lock twice; \
                                 remove one"
                            ),
                        ));
                        continue;
                    }
                }
                out.push(elem);
            }
            // The valid elements, so that their placeholders are still checked
            // when others were wrong.
            Some(Key::List(out))
        }
    }
}

/// One element of a list (or a top-level `for`): its template must be a
/// string literal.
fn key_elem(elem: RawElem, errors: &mut Errors) -> Option<KeyElem> {
    let Some(lit) = lit_str(&elem.template) else {
        let message = if elem.each.is_some() {
            "a `for` key takes a string literal template before `for`, e.g. \
             `\"sku:{sku}\" for sku in skus`"
        } else {
            "each key in the list is a string literal template, e.g. `\"order:{order_id}\"`, \
             optionally followed by `for ITEM in COLLECTION`"
        };
        errors.push(syn::Error::new_spanned(&elem.template, message));
        return None;
    };
    let key = key_template(lit, errors)?;
    Some(KeyElem {
        key,
        each: elem.each,
    })
}

fn key_template(lit: &LitStr, errors: &mut Errors) -> Option<KeyTemplate> {
    match Template::parse(&lit.value()) {
        Ok(template) => Some(KeyTemplate {
            lit: lit.clone(),
            template,
        }),
        Err(msgs) => {
            for m in msgs {
                errors.push(syn::Error::new(lit.span(), m));
            }
            None
        }
    }
}

fn parse_mode(lit: &LitStr) -> syn::Result<Mode> {
    match lit.value().as_str() {
        "exclusive" => Ok(Mode::Exclusive),
        "read" => Ok(Mode::Read),
        "write" => Ok(Mode::Write),
        other => {
            let alias = MODE_ALIASES
                .iter()
                .find(|(a, _)| a.eq_ignore_ascii_case(other))
                .map(|(_, m)| *m);
            // Also a transposition (`"raed"`), which counts as two edits.
            let anagram = || {
                let sorted = |s: &str| {
                    let mut c: Vec<char> = s.to_lowercase().chars().collect();
                    c.sort_unstable();
                    c
                };
                MODES.iter().copied().find(|m| sorted(m) == sorted(other))
            };
            let hint = alias
                .or_else(|| nearest(other, MODES))
                .or_else(anagram)
                .map(|n| format!("did you mean \"{n}\"? "))
                .unwrap_or_default();
            Err(syn::Error::new(
                lit.span(),
                format!(
                    "unknown `mode` value \"{other}\": {hint}expected \"exclusive\" (the default: one \
                     holder at a time), \"read\" (shared with other readers) or \"write\" \
                     (exclusive of readers and writers)"
                ),
            ))
        }
    }
}

/// `permits = 3` (checked here: 1 to `u32::MAX`) or an expression of type `u32`.
fn permits_arg(value: Expr, errors: &mut Errors) -> Option<PermitsArg> {
    const RANGE: &str = "from 1 to 4294967295 (`u32::MAX`)";
    let message = match &value {
        Expr::Lit(ExprLit {
            lit: Lit::Int(int), ..
        }) => {
            if !matches!(int.suffix(), "" | "u32") {
                format!(
                    "`permits` is a `u32`: write `{}` without the `{}` suffix",
                    int.base10_digits(),
                    int.suffix()
                )
            } else {
                match int.base10_digits().parse::<u32>() {
                    Ok(0) => format!(
                        "`permits` must be at least 1: a semaphore of 0 permits would let no \
                         holder in; it takes a number of holders {RANGE}"
                    ),
                    Ok(n) => {
                        return Some(PermitsArg::Literal {
                            value: n,
                            span: int.span(),
                        })
                    }
                    Err(_) => format!(
                        "`permits = {}` is too large: the number of holders is a `u32`, {RANGE}",
                        int.base10_digits()
                    ),
                }
            }
        }
        Expr::Unary(syn::ExprUnary {
            op: syn::UnOp::Neg(_),
            expr,
            ..
        }) if matches!(
            &**expr,
            Expr::Lit(ExprLit {
                lit: Lit::Int(_) | Lit::Float(_),
                ..
            })
        ) =>
        {
            format!("`permits` cannot be negative: it takes a number of holders {RANGE}")
        }
        Expr::Lit(ExprLit {
            lit: Lit::Float(f), ..
        }) => format!(
            "`permits` takes a whole number of holders {RANGE}, not `{}`",
            f.base10_digits()
        ),
        Expr::Lit(_) => format!(
            "`permits` takes an integer literal {RANGE}, e.g. `permits = 3`, or an expression of \
             type `u32`"
        ),
        _ => return Some(PermitsArg::Expr(Box::new(value))),
    };
    errors.push(syn::Error::new_spanned(&value, message));
    None
}

const SEMAPHORE: &str = "`permits` takes a semaphore (`LockManager::semaphore`)";
const LIST: &str = "a key list takes exclusive locks on all its keys together \
                    (`LockManager::lock_all`)";

/// Pairs of options that choose different kinds of lock, and why; `key`
/// stands for a key list (a single key combines with everything).
const CONFLICTS: &[(&str, &str, &[&str])] = &[
    (
        "mode",
        "permits",
        &[SEMAPHORE, ", which has no read or write mode"],
    ),
    ("key", "mode", &[LIST, "; `mode` applies to a single key"]),
    (
        "key",
        "permits",
        &[LIST, "; `permits` applies to a single key"],
    ),
];

/// `min_hold` above `max_hold`, both literals: the runtime refuses it
/// (`InvalidConfig`) at every call, so the mistake is caught here, at the
/// `min_hold` value.
fn hold_order(opts: &Options, errors: &mut Errors) {
    if let (
        Some(DurationArg::Literal {
            value: min_hold,
            span,
        }),
        Some(DurationArg::Literal {
            value: max_hold, ..
        }),
    ) = (&opts.min_hold, &opts.max_hold)
    {
        if min_hold > max_hold {
            errors.push(syn::Error::new(
                *span,
                format!(
                    "`min_hold` ({min_hold:?}) is longer than `max_hold` ({max_hold:?}): the \
                     hold would be cut off at `max_hold` before `min_hold` has passed; make \
                     `min_hold` at most `max_hold`"
                ),
            ));
        }
    }
}

/// Options that choose different kinds of lock ([`CONFLICTS`]): given
/// together, the later one (in the attribute) is reported, once per pair.
fn conflicts(seen: &[Ident], key_is_list: bool, errors: &mut Errors) {
    let at = |name: &str| seen.iter().position(|s| s.unraw() == name);
    for &(a, b, why) in CONFLICTS {
        if a == "key" && !key_is_list {
            continue;
        }
        let (Some(i), Some(j)) = (at(a), at(b)) else {
            continue;
        };
        let first = if a == "key" {
            "a key list".to_owned()
        } else {
            format!("`{a}`")
        };
        errors.push(syn::Error::new(
            seen[i.max(j)].span(),
            format!(
                "{first} and `{b}` cannot be combined: {}; remove one of them",
                why.concat()
            ),
        ));
    }
}

fn unknown_option_message(name: &str) -> String {
    let alias = OPTIONS
        .iter()
        .find(|o| o.aliases.iter().any(|a| a.eq_ignore_ascii_case(name)))
        .map(|o| o.name);
    let names = option_names();
    match alias.or_else(|| nearest(name, &names)) {
        Some(suggestion) => format!("unknown option `{name}`; did you mean `{suggestion}`?"),
        None => format!(
            "unknown option `{name}`; the options are: {}",
            names
                .iter()
                .map(|o| format!("`{o}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// `value` without the invisible group a `macro_rules!` fragment (`$key:literal`,
/// `$lease:expr`) is passed in, so that a literal given through a macro reads
/// as the literal.
fn ungrouped(value: Expr) -> Expr {
    match value {
        Expr::Group(group) => ungrouped(*group.expr),
        other => other,
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
        assert_eq!(nearest("leese", &option_names()), Some("lease"));
        assert_eq!(nearest("onlost", &option_names()), Some("on_lost"));
        assert_eq!(nearest("renw", &option_names()), Some("renew"));
        assert_eq!(nearest("managr", &option_names()), Some("manager"));
        assert_eq!(nearest("kye", &option_names()), None);
        assert_eq!(nearest("ky", &option_names()), Some("key"));
        assert_eq!(nearest("frobnicate", &option_names()), None);
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
        assert!(matches!(o.key, Some(Key::Single(k)) if k.lit.value() == "order:{id}"));
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
        let (_, e) = parse(quote! { key = "k", min_hold = "2m", max_hold = "1m" });
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].contains("`min_hold` (120s) is longer than `max_hold` (60s)"),
            "{e:?}"
        );
        let (_, e) = parse(quote! { key = "k", min_hold = "1m", max_hold = "1m" });
        assert!(e.is_empty(), "{e:?}");
        let (_, e) = parse(quote! { key = "k", min_hold = "2m", max_hold = MAX });
        assert!(e.is_empty(), "an expression is checked at run time: {e:?}");
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
    fn key_lists() {
        let (o, e) = parse(quote! { key = ["order:{id}", "user:{user.id}",], lease = "1s" });
        assert!(e.is_empty(), "{e:?}");
        let Some(Key::List(elems)) = &o.key else {
            panic!("not a list")
        };
        assert_eq!(elems.len(), 2);
        assert!(elems.iter().all(|e| e.each.is_none()));
        assert_eq!(
            o.key.as_ref().unwrap().metrics_label(),
            "order:{id}+user:{user.id}"
        );
        // One element is still a list (`lock_all`), not the single form.
        let (o, e) = parse(quote! { key = ["a"] });
        assert!(e.is_empty(), "{e:?}");
        assert!(matches!(&o.key, Some(Key::List(v)) if v.len() == 1));
        let (o, _) = parse(quote! { key = "a" });
        assert!(matches!(&o.key, Some(Key::Single(_))));
    }

    #[test]
    fn key_for_each() {
        let (o, e) = parse(quote! { key = "sku:{sku}" for sku in skus });
        assert!(e.is_empty(), "{e:?}");
        let Some(Key::List(elems)) = &o.key else {
            panic!("a `for` key is a list")
        };
        let each = elems[0].each.as_ref().unwrap();
        let (pat, expr) = (&each.pat, &each.expr);
        assert_eq!(quote!(#pat in #expr).to_string(), "sku in skus");
        assert_eq!(o.key.as_ref().unwrap().metrics_label(), "sku:{sku}");

        let (o, e) = parse(quote! {
            key = ["order:{id}", "sku:{line.sku}" for (i, line) in self.lines.iter().enumerate(), "x"],
            wait = "0s"
        });
        assert!(e.is_empty(), "{e:?}");
        let Some(Key::List(elems)) = &o.key else {
            panic!("not a list")
        };
        assert_eq!(elems.len(), 3);
        assert!(elems[0].each.is_none() && elems[1].each.is_some() && elems[2].each.is_none());
        assert_eq!(
            o.key.as_ref().unwrap().metrics_label(),
            "order:{id}+sku:{line.sku}+x"
        );
        assert!(o.wait.is_some());
    }

    #[test]
    fn key_list_errors_all_at_once() {
        let (o, e) = parse(quote! { key = [] });
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].starts_with("`key = []` names no lock"), "{e:?}");
        assert!(o.key.is_none());

        let (o, e) = parse(quote! {
            key = ["a:{id}", id, "", "b:{x", "a:{id}", 42 for x in xs, "c:{x}" for x in xs]
        });
        assert_eq!(e.len(), 5, "{e:?}");
        assert!(e[0].starts_with("each key in the list is a string literal template"));
        assert!(e[1].contains("must not be empty"));
        assert!(e[2].starts_with("unclosed `{`"));
        assert!(e[3].starts_with("the key \"a:{id}\" is already in the list"));
        assert!(e[4].starts_with("a `for` key takes a string literal template before `for`"));
        // The valid elements are kept, for the placeholder checks.
        assert!(matches!(&o.key, Some(Key::List(v)) if v.len() == 2));

        // A `for` element is never a duplicate: its keys depend on the items.
        let (_, e) = parse(quote! { key = ["s:{s}" for s in a, "s:{s}" for s in b] });
        assert!(e.is_empty(), "{e:?}");

        let (_, e) = parse(quote! { key = "s:{s}" for s of xs });
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].starts_with("expected `in` after the pattern"), "{e:?}");
        let (_, e) = parse(quote! { key = ["a" "b"] });
        assert_eq!(e.len(), 1, "{e:?}");
    }

    #[test]
    fn modes() {
        for (value, mode) in [
            ("read", Mode::Read),
            ("write", Mode::Write),
            ("exclusive", Mode::Exclusive),
        ] {
            let (o, e) = parse(quote! { key = "k", mode = #value });
            assert!(e.is_empty(), "{e:?}");
            assert_eq!(o.mode, mode);
        }
        let (o, _) = parse(quote! { key = "k" });
        assert_eq!(o.mode, Mode::Exclusive);
        for (value, hint) in [
            ("raed", "did you mean \"read\"? "),
            ("Write", "did you mean \"write\"? "),
            ("shared", "did you mean \"read\"? "),
            ("mutex", "did you mean \"exclusive\"? "),
            ("sometimes", ""),
        ] {
            let (_, e) = parse(quote! { key = "k", mode = #value });
            assert_eq!(e.len(), 1, "{e:?}");
            assert!(
                e[0].starts_with(&format!(
                    "unknown `mode` value \"{value}\": {hint}expected \"exclusive\""
                )),
                "{e:?}"
            );
        }
        let (_, e) = parse(quote! { key = "k", mode = read });
        assert!(e[0].starts_with("`mode` takes a string"), "{e:?}");
        for alias in ["read", "shared", "lock_mode", "rw"] {
            assert_eq!(
                unknown_option_message(alias),
                format!("unknown option `{alias}`; did you mean `mode`?")
            );
        }
    }

    #[test]
    fn permits() {
        for (tokens, value) in [
            (quote!(1), 1),
            (quote!(3), 3),
            (quote!(4_294_967_295), u32::MAX),
            (quote!(7u32), 7),
            (quote!(0x10), 16),
        ] {
            let (o, e) = parse(quote! { key = "k", permits = #tokens });
            assert!(e.is_empty(), "{tokens}: {e:?}");
            assert!(
                matches!(o.permits, Some(PermitsArg::Literal { value: v, .. }) if v == value),
                "{tokens}"
            );
        }
        for (tokens, needle) in [
            (quote!(0), "`permits` must be at least 1"),
            (quote!(-1), "`permits` cannot be negative"),
            (quote!(-1.5), "`permits` cannot be negative"),
            (quote!(4_294_967_296), "`permits = 4294967296` is too large"),
            (
                quote!(99999999999999999999999999999999999999999),
                "is too large",
            ),
            (quote!(2.5), "`permits` takes a whole number of holders"),
            (
                quote!(3u64),
                "`permits` is a `u32`: write `3` without the `u64` suffix",
            ),
            (quote!(-3i32), "`permits` cannot be negative"),
            (quote!("3"), "`permits` takes an integer literal"),
            (quote!(true), "`permits` takes an integer literal"),
        ] {
            let (o, e) = parse(quote! { key = "k", permits = #tokens });
            assert_eq!(e.len(), 1, "{tokens}: {e:?}");
            assert!(e[0].contains(needle), "{tokens}: {e:?}");
            assert!(o.permits.is_none());
        }
        for tokens in [quote!(SLOTS), quote!(self.size), quote!(n * 2), quote!(-n)] {
            let (o, e) = parse(quote! { key = "k", permits = #tokens });
            assert!(e.is_empty(), "{tokens}: {e:?}");
            assert!(matches!(o.permits, Some(PermitsArg::Expr(_))), "{tokens}");
        }
        let (_, e) = parse(quote! { key = "k", permits });
        assert!(e[0].contains("e.g. `permits = 3`"), "{e:?}");
        assert_eq!(
            unknown_option_message("semaphore"),
            "unknown option `semaphore`; did you mean `permits`?"
        );
        assert_eq!(
            unknown_option_message("permit"),
            "unknown option `permit`; did you mean `permits`?"
        );
    }

    #[test]
    fn fair_is_no_option() {
        // The default lock is fair; distlock never had a `fair` option in a
        // release. No option is near enough to suggest, so the list is given.
        let (_, e) = parse(quote! { key = "k", fair = true });
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with("unknown option `fair`; the options are: `key`"),
            "{e:?}"
        );
    }

    #[test]
    fn conflicts_on_the_later_option() {
        let (_, e) = parse(quote! { key = "k", mode = "read", permits = 2 });
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with("`mode` and `permits` cannot be combined"),
            "{e:?}"
        );

        let (_, e) = parse(quote! { mode = "read", permits = 2, key = ["a", "b"] });
        assert_eq!(e.len(), 3, "{e:?}");
        assert!(
            e[1].starts_with("a key list and `mode` cannot be combined"),
            "{e:?}"
        );
        assert!(
            e[2].starts_with("a key list and `permits` cannot be combined"),
            "{e:?}"
        );

        let (_, e) = parse(quote! { key = "s:{s}" for s in ss, mode = "write" });
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with("a key list and `mode` cannot be combined"),
            "{e:?}"
        );

        // Also with a value that is wrong in itself: both are reported.
        let (_, e) = parse(quote! { key = ["a"], permits = 0 });
        assert_eq!(e.len(), 2, "{e:?}");
        // A single key combines with any one of them.
        for extra in [quote!(mode = "write"), quote!(permits = 2)] {
            let (_, e) = parse(quote! { key = "k", #extra });
            assert!(e.is_empty(), "{e:?}");
        }
    }

    #[test]
    fn syntax_errors_stop_without_missing_key_noise() {
        let (_, e) = parse(quote! { key "k" });
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].contains("expected `=`"));
    }

    #[test]
    fn the_docs_option_table_is_the_option_table() {
        let docs = include_str!("../../src/distributed_lock.md");
        let documented: Vec<&str> = docs
            .lines()
            .filter(|line| line.starts_with("| [`"))
            .collect();
        let expected: Vec<String> = OPTIONS
            .iter()
            .map(|o| {
                format!(
                    "| [`{}`](#{}) | {} | {} |",
                    o.name, o.name, o.value, o.default
                )
            })
            .collect();
        assert_eq!(
            documented, expected,
            "src/distributed_lock.md's option table"
        );
    }

    #[test]
    fn every_alias_and_conflict_names_a_real_option_once() {
        let mut seen = std::collections::HashSet::new();
        for o in OPTIONS {
            assert!(seen.insert(o.name), "{} twice", o.name);
            for a in o.aliases {
                assert!(option(a).is_none(), "alias {a} is an option");
                assert!(seen.insert(a), "alias {a} twice");
            }
            assert!(o.example.starts_with(o.name));
        }
        let mut pairs = std::collections::HashSet::new();
        for (a, b, _) in CONFLICTS {
            assert!(option(a).is_some() && option(b).is_some(), "{a}/{b}");
            assert!(
                pairs.insert((a, b)) && !pairs.contains(&(b, a)),
                "{a}/{b} twice"
            );
        }
    }
}
