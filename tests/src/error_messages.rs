//! The rule of docs/architecture.md that an error's own message names what failed and never
//! repeats its source: a `#[error("...")]` whose format string (or one of its format arguments)
//! names the variant's or struct's source field — a field marked `#[source]` or `#[from]`, or
//! named `source`, as thiserror takes them — prints that cause twice once the chain is formatted
//! (`api::report::chain`, or a log's `error = &e as &dyn Error`).
//!
//! Read with `syn`, so the attribute is matched to its own fields whatever the layout: `{0}` is
//! a repeat only when field 0 is the source, `{source}` only when the field so named is. Used by
//! `tests/tests/error_messages.rs` over every crate's `src/`.

use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// One `#[error]` that repeats its source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repeat {
    /// The type (and variant, `Type::Variant`).
    pub item: String,
    /// The format string.
    pub message: String,
    /// The source field it names (`0`, `source`, ...).
    pub field: String,
}

/// The file could not be read or parsed.
#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    /// Reading a file or directory failed.
    #[error("read {}", path.display())]
    Read {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is not Rust `syn` can parse.
    #[error("parse {}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: syn::Error,
    },
}

/// The `#[error]` attributes in `source` (a whole Rust file) that repeat their source field.
pub fn repeats_in(source: &str) -> Result<Vec<Repeat>, syn::Error> {
    let file = syn::parse_file(source)?;
    let mut finder = Finder::default();
    finder.visit_file(&file);
    Ok(finder.found)
}

/// Every repeat in the `.rs` files under `dir`, with the file each is in.
pub fn repeats_under(dir: &Path) -> Result<Vec<(PathBuf, Repeat)>, ScanError> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(dir) = todo.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|source| ScanError::Read {
            path: dir.clone(),
            source,
        })?;
        for entry in entries {
            let path = entry
                .map_err(|source| ScanError::Read {
                    path: dir.clone(),
                    source,
                })?
                .path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).map_err(|source| ScanError::Read {
                    path: path.clone(),
                    source,
                })?;
                let found = repeats_in(&text).map_err(|source| ScanError::Parse {
                    path: path.clone(),
                    source,
                })?;
                out.extend(found.into_iter().map(|r| (path.clone(), r)));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

#[derive(Default)]
struct Finder {
    found: Vec<Repeat>,
}

impl<'ast> Visit<'ast> for Finder {
    fn visit_item_enum(&mut self, item: &'ast syn::ItemEnum) {
        for variant in &item.variants {
            let name = format!("{}::{}", item.ident, variant.ident);
            check(&name, &variant.attrs, &variant.fields, &mut self.found);
        }
        syn::visit::visit_item_enum(self, item);
    }

    fn visit_item_struct(&mut self, item: &'ast syn::ItemStruct) {
        check(
            &item.ident.to_string(),
            &item.attrs,
            &item.fields,
            &mut self.found,
        );
        syn::visit::visit_item_struct(self, item);
    }
}

/// The names thiserror gives the source fields of `fields`: `0`, `1`, ... for tuple fields.
fn source_fields(fields: &syn::Fields) -> Vec<String> {
    fields
        .iter()
        .enumerate()
        .filter(|(_, f)| {
            f.attrs
                .iter()
                .any(|a| a.path().is_ident("source") || a.path().is_ident("from"))
                || f.ident.as_ref().is_some_and(|i| i == "source")
        })
        .map(|(i, f)| {
            f.ident
                .as_ref()
                .map_or_else(|| i.to_string(), ToString::to_string)
        })
        .collect()
}

fn check(item: &str, attrs: &[syn::Attribute], fields: &syn::Fields, found: &mut Vec<Repeat>) {
    let sources = source_fields(fields);
    if sources.is_empty() {
        return;
    }
    for attr in attrs.iter().filter(|a| a.path().is_ident("error")) {
        let Ok(list) = attr.meta.require_list() else {
            continue;
        };
        let Some((message, extra)) = format_args(list.tokens.clone()) else {
            continue; // `transparent` and other forms that are not a format
        };
        let mut positional = 0;
        let mut named = Vec::new();
        for placeholder in placeholders(&message) {
            match placeholder {
                Some(name) => named.push(name),
                None => {
                    // `{}`: the next extra argument.
                    if let Some(arg) = extra.get(positional) {
                        named.extend(field_of(arg));
                    }
                    positional += 1;
                }
            }
        }
        // `name = .field` and any other argument naming a field, used or not
        named.extend(extra.iter().filter_map(|a| field_of(a)));
        if let Some(field) = named.into_iter().find(|n| sources.contains(n)) {
            found.push(Repeat {
                item: item.to_owned(),
                message: message.clone(),
                field,
            });
        }
    }
}

/// The format string and the other arguments (as text) of `#[error("...", args)]`; `None` when
/// the first is not a string literal (`#[error(transparent)]`).
fn format_args(tokens: proc_macro2::TokenStream) -> Option<(String, Vec<String>)> {
    let mut args: Vec<Vec<proc_macro2::TokenTree>> = vec![Vec::new()];
    for tree in tokens {
        match &tree {
            proc_macro2::TokenTree::Punct(p) if p.as_char() == ',' => args.push(Vec::new()),
            _ => args.last_mut()?.push(tree),
        }
    }
    let mut args = args.into_iter();
    let first: proc_macro2::TokenStream = args.next()?.into_iter().collect();
    let message = syn::parse2::<syn::LitStr>(first).ok()?.value();
    let extra = args
        .filter(|a| !a.is_empty())
        .map(|a| a.into_iter().collect::<proc_macro2::TokenStream>().to_string())
        .collect();
    Some((message, extra))
}

/// The field a thiserror format argument reads: `.0`, `.source`, `.source.to_string()`,
/// `name = .source`.
fn field_of(arg: &str) -> Option<String> {
    let text: String = arg.chars().filter(|c| !c.is_whitespace()).collect();
    let text = text.split_once('=').map_or(text.as_str(), |(_, v)| v);
    let rest = text.strip_prefix('.')?;
    let name: String = rest
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

/// The placeholders of a format string: `Some(name)` for `{name}`/`{0:?}`, `None` for `{}`.
fn placeholders(message: &str) -> Vec<Option<String>> {
    let mut out = Vec::new();
    let mut chars = message.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
            }
            '{' => {
                let inner: String = chars.by_ref().take_while(|c| *c != '}').collect();
                let name = inner.split(':').next().unwrap_or_default().trim();
                out.push((!name.is_empty()).then(|| name.to_owned()));
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const SAMPLE: &str = r#"
        #[derive(Debug, thiserror::Error)]
        pub enum E {
            #[error("read the member list: {0}")]
            Tuple(#[from] std::io::Error),
            #[error("write {path}: {source}")]
            Named { path: String, #[source] source: std::io::Error },
            #[error("open {}: {:?}", .path, .cause)]
            Args { path: String, #[source] cause: std::io::Error },
            #[error("plain source field: {source}")]
            Implicit { source: std::io::Error },
            #[error("{0} did not answer")]
            NotTheSource(String, #[source] std::io::Error),
            #[error("read the member list of {cluster}")]
            Good { cluster: String, #[source] source: std::io::Error },
            #[error("{{0}} is literal")]
            Escaped(#[from] std::fmt::Error),
            #[error(transparent)]
            Transparent(#[from] std::num::ParseIntError),
            #[error("no source: {0}")]
            NoSource(String),
        }

        mod inner {
            #[derive(Debug, thiserror::Error)]
            #[error("dial {addr}: {source}")]
            pub struct Dial { addr: String, source: std::io::Error }
        }
    "#;

    #[test]
    fn flags_each_message_that_names_its_source_field_and_nothing_else() {
        let found: Vec<(String, String)> = repeats_in(SAMPLE)
            .unwrap()
            .into_iter()
            .map(|r| (r.item, r.field))
            .collect();
        let expected: Vec<(String, String)> = [
            ("E::Tuple", "0"),
            ("E::Named", "source"),
            ("E::Args", "cause"),
            ("E::Implicit", "source"),
            ("Dial", "source"),
        ]
        .iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect();
        assert_eq!(found, expected);
    }

    #[test]
    fn a_file_that_is_not_rust_is_an_error_not_a_pass() {
        assert!(repeats_in("enum {").is_err());
    }
}
