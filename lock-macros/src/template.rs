//! Parsing of the `key = "..."` template.
//!
//! Grammar: literal text, `{{` / `}}` for literal braces, and placeholders
//! `{root}` / `{root.member.member}` where `root` is a parameter name or `self`
//! and members are field names or tuple indices.

/// One piece of a parsed key template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Segment {
    /// Literal text with `{{` / `}}` already unescaped.
    Text(String),
    /// `{root.member...}`: `path[0]` is the root (a parameter name, a raw
    /// identifier `r#name`, or `self`), the rest are field names or tuple
    /// indices.
    Placeholder(Vec<String>),
}

/// A parsed key template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Template {
    pub(crate) segments: Vec<Segment>,
}

impl Template {
    /// Parses `src`, returning every problem found (not just the first one).
    pub(crate) fn parse(src: &str) -> Result<Template, Vec<String>> {
        if src.is_empty() {
            return Err(vec![
                "the lock key must not be empty; name the resource, e.g. `key = \"order:{order_id}\"`"
                    .to_owned(),
            ]);
        }
        let mut segments = Vec::new();
        let mut errors = Vec::new();
        let mut text = String::new();
        let mut chars = src.char_indices().peekable();
        while let Some((start, c)) = chars.next() {
            match c {
                '{' if chars.peek().map(|&(_, c)| c) == Some('{') => {
                    chars.next();
                    text.push('{');
                }
                '}' if chars.peek().map(|&(_, c)| c) == Some('}') => {
                    chars.next();
                    text.push('}');
                }
                '}' => errors.push(format!(
                    "stray `}}` at byte {start} of the key; write `}}}}` for a literal brace"
                )),
                '{' => {
                    // Scan to the closing brace; a `{` first means this one is unclosed.
                    let mut inner = String::new();
                    let mut closed = false;
                    while let Some(&(_, c)) = chars.peek() {
                        if c == '{' {
                            break;
                        }
                        chars.next();
                        if c == '}' {
                            closed = true;
                            break;
                        }
                        inner.push(c);
                    }
                    if !closed {
                        errors.push(format!(
                            "unclosed `{{` at byte {start} of the key; write `{{{{` for a literal brace"
                        ));
                        continue;
                    }
                    match parse_placeholder(&inner) {
                        Ok(path) => {
                            if !text.is_empty() {
                                segments.push(Segment::Text(std::mem::take(&mut text)));
                            }
                            segments.push(Segment::Placeholder(path));
                        }
                        Err(e) => errors.push(e),
                    }
                }
                c => text.push(c),
            }
        }
        if !text.is_empty() {
            segments.push(Segment::Text(text));
        }
        if errors.is_empty() {
            Ok(Template { segments })
        } else {
            Err(errors)
        }
    }

    /// The placeholders' paths, in order.
    pub(crate) fn placeholders(&self) -> impl Iterator<Item = &[String]> {
        self.segments.iter().filter_map(|s| match s {
            Segment::Placeholder(p) => Some(p.as_slice()),
            Segment::Text(_) => None,
        })
    }

    /// The key as a plain string when it has no placeholders.
    pub(crate) fn as_static(&self) -> Option<String> {
        let mut out = String::new();
        for s in &self.segments {
            match s {
                Segment::Text(t) => out.push_str(t),
                Segment::Placeholder(_) => return None,
            }
        }
        Some(out)
    }

    /// The `format!` string: literal braces re-escaped, one `{}` per placeholder.
    pub(crate) fn format_string(&self) -> String {
        let mut out = String::new();
        for s in &self.segments {
            match s {
                Segment::Text(t) => {
                    for c in t.chars() {
                        match c {
                            '{' => out.push_str("{{"),
                            '}' => out.push_str("}}"),
                            c => out.push(c),
                        }
                    }
                }
                Segment::Placeholder(_) => out.push_str("{}"),
            }
        }
        out
    }
}

fn parse_placeholder(inner: &str) -> Result<Vec<String>, String> {
    if inner.is_empty() {
        return Err(
            "empty placeholder `{}` in the key: name a parameter, e.g. `{order_id}`, or write `{{}}` for literal braces"
                .to_owned(),
        );
    }
    if let Some((name, spec)) = inner.split_once(':') {
        return Err(format!(
            "format specs are not supported in keys: `{{{inner}}}`; keys are formatted with `Display`, write `{{{name}}}`{}",
            if spec.is_empty() { "" } else { " and format the value yourself" }
        ));
    }
    if inner.trim() != inner {
        return Err(format!(
            "placeholder `{{{inner}}}` has surrounding whitespace; write `{{{}}}`",
            inner.trim()
        ));
    }
    let mut path = Vec::new();
    for (i, part) in inner.split('.').enumerate() {
        let ok = if i == 0 {
            is_ident(part)
        } else {
            is_member_name(part) || is_tuple_index(part) && part.parse::<u32>().is_ok()
        };
        if !ok {
            return Err(format!(
                "invalid placeholder `{{{inner}}}` in the key: expected `{{param}}`, `{{param.field}}` or `{{self.field}}`"
            ));
        }
        path.push(part.to_owned());
    }
    Ok(path)
}

/// An identifier (ASCII or Unicode XID), optionally raw (`r#type`); not `_`.
fn is_ident(s: &str) -> bool {
    let s = s.strip_prefix("r#").unwrap_or(s);
    let mut chars = s.chars();
    match chars.next() {
        Some(c) if c == '_' || c.is_alphabetic() => {}
        _ => return false,
    }
    s != "_" && chars.all(|c| c == '_' || c.is_alphanumeric())
}

/// A field name as Rust writes it after a `.`: an identifier, or a keyword
/// written raw (`r#type`, and `type` alone, which the expansion makes raw);
/// never `self`, `Self`, `super` or `crate`, which cannot be fields nor raw,
/// nor a name with characters an identifier may not hold.
fn is_member_name(s: &str) -> bool {
    let bare = s.strip_prefix("r#").unwrap_or(s);
    is_ident(bare)
        && (syn::parse_str::<syn::Ident>(bare).is_ok()
            || syn::parse_str::<syn::Ident>(&format!("r#{bare}")).is_ok())
}

fn is_tuple_index(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ph(parts: &[&str]) -> Segment {
        Segment::Placeholder(parts.iter().map(|s| (*s).to_owned()).collect())
    }
    fn text(s: &str) -> Segment {
        Segment::Text(s.to_owned())
    }

    #[test]
    fn plain_text() {
        let t = Template::parse("jobs:nightly").unwrap();
        assert_eq!(t.segments, vec![text("jobs:nightly")]);
        assert_eq!(t.as_static().as_deref(), Some("jobs:nightly"));
        assert_eq!(t.format_string(), "jobs:nightly");
    }

    #[test]
    fn placeholders_and_fields() {
        let t = Template::parse("order:{order_id}:{user.account.id}/{self.shard}{pair.0}").unwrap();
        assert_eq!(
            t.segments,
            vec![
                text("order:"),
                ph(&["order_id"]),
                text(":"),
                ph(&["user", "account", "id"]),
                text("/"),
                ph(&["self", "shard"]),
                ph(&["pair", "0"]),
            ]
        );
        assert_eq!(t.as_static(), None);
        assert_eq!(t.format_string(), "order:{}:{}/{}{}");
        assert_eq!(t.placeholders().count(), 4);
    }

    #[test]
    fn escaped_braces() {
        let t = Template::parse("{{tag}}:{id}").unwrap();
        assert_eq!(t.segments, vec![text("{tag}:"), ph(&["id"])]);
        assert_eq!(t.format_string(), "{{tag}}:{}");
        let t = Template::parse("a{{b}}").unwrap();
        assert_eq!(t.as_static().as_deref(), Some("a{b}"));
    }

    #[test]
    fn raw_and_unicode_idents() {
        let t = Template::parse("{r#type}:{größe}").unwrap();
        assert_eq!(t.segments, vec![ph(&["r#type"]), text(":"), ph(&["größe"])]);
    }

    #[test]
    fn empty_key() {
        let e = Template::parse("").unwrap_err();
        assert!(e[0].contains("must not be empty"), "{e:?}");
    }

    #[test]
    fn unclosed_and_stray() {
        let e = Template::parse("order:{id").unwrap_err();
        assert_eq!(e.len(), 1);
        assert!(e[0].starts_with("unclosed `{` at byte 6"), "{e:?}");

        let e = Template::parse("order}:{id}").unwrap_err();
        assert!(e[0].starts_with("stray `}` at byte 5"), "{e:?}");

        // Every problem is reported, not just the first.
        let e = Template::parse("a}b{c{d}").unwrap_err();
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(e[0].starts_with("stray"));
        assert!(e[1].starts_with("unclosed `{` at byte 3"));
    }

    #[test]
    fn bad_placeholders() {
        for (src, needle) in [
            ("{}", "empty placeholder"),
            ("{id:?}", "format specs are not supported"),
            ("{id:>8}", "format specs are not supported"),
            ("{ id }", "whitespace"),
            ("{1}", "invalid placeholder"),
            ("{a.}", "invalid placeholder"),
            ("{a..b}", "invalid placeholder"),
            ("{a.01}", "invalid placeholder"),
            ("{a-b}", "invalid placeholder"),
            ("{_}", "invalid placeholder"),
            // Members no expansion can name (the expansion used to panic).
            ("{order.self}", "invalid placeholder"),
            ("{order.Self}", "invalid placeholder"),
            ("{order.r#crate}", "invalid placeholder"),
            ("{order.super}", "invalid placeholder"),
            ("{pair.4294967296}", "invalid placeholder"),
            ("{x.a²}", "invalid placeholder"),
        ] {
            let e = Template::parse(src).unwrap_err();
            assert!(e[0].contains(needle), "{src}: {e:?}");
        }
    }
}
