//! What the workspace's source checks read from its Rust files — the string
//! literals and the paths of the production code — parsed with `syn`, so
//! that comments, doc comments, raw strings and char literals need no
//! lexer of our own. Items under `#[cfg(test)]` (unit tests, test-only
//! helpers) are left out, and so is a file that is `#![cfg(test)]` whole.
//!
//! Macro arguments are tokens, not syntax: their string literals are read
//! token by token, and so are `crate::name` sequences in them; a `super::`
//! chain inside a macro call is not seen.

use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// Every `.rs` file under `dir`, sorted.
pub fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).expect("a readable directory") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// What the production code of one source says.
#[derive(Debug, Default, PartialEq)]
pub struct Production {
    /// Every string literal's value (escapes resolved), in the order of the
    /// source; doc comments are not literals.
    pub literals: Vec<String>,
    /// Every path of two segments or more, as its segments: in code and
    /// types (`crate::x::f()`), each one a `use` tree spells out
    /// (`use crate::{a::B, c}` is `crate::a::B` and `crate::c`), and
    /// `crate::name` in macro arguments.
    pub paths: Vec<Vec<String>>,
}

/// Parses `source` and reads its production code; `None` for a file that is
/// `#![cfg(test)]` whole. Panics on a source that does not parse (the
/// compiler would refuse it too).
pub fn production(source: &str) -> Option<Production> {
    let file = syn::parse_file(source).expect("a Rust source that parses");
    if file.attrs.iter().any(is_cfg_test) {
        return None;
    }
    let mut reader = Production::default();
    reader.visit_file(&file);
    Some(reader)
}

/// `#[cfg(test)]`.
fn is_cfg_test(attr: &syn::Attribute) -> bool {
    attr.path().is_ident("cfg")
        && attr.parse_args::<syn::Ident>().is_ok_and(|ident| ident == "test")
}

impl Production {
    /// String literals and `crate::name` sequences in the tokens of a macro
    /// call or an attribute.
    fn read_tokens(&mut self, tokens: proc_macro2::TokenStream) {
        let tokens: Vec<proc_macro2::TokenTree> = tokens.into_iter().collect();
        for (i, token) in tokens.iter().enumerate() {
            match token {
                proc_macro2::TokenTree::Group(group) => self.read_tokens(group.stream()),
                proc_macro2::TokenTree::Literal(literal) => {
                    if let syn::Lit::Str(text) = syn::Lit::new(literal.clone()) {
                        self.literals.push(text.value());
                    }
                }
                proc_macro2::TokenTree::Ident(ident) if ident == "crate" => {
                    let after_dollar = i > 0
                        && matches!(&tokens[i - 1], proc_macro2::TokenTree::Punct(p) if p.as_char() == '$');
                    let path_sep = tokens.get(i + 1..i + 3).is_some_and(|pair| {
                        pair.iter().all(
                            |t| matches!(t, proc_macro2::TokenTree::Punct(p) if p.as_char() == ':'),
                        )
                    });
                    if let (false, true, Some(proc_macro2::TokenTree::Ident(name))) =
                        (after_dollar, path_sep, tokens.get(i + 3))
                    {
                        self.paths.push(vec!["crate".to_owned(), name.to_string()]);
                    }
                }
                _ => {}
            }
        }
    }

    /// The paths a `use` tree spells out, each after `prefix`.
    fn read_use(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(path) => {
                prefix.push(path.ident.to_string());
                self.read_use(prefix, &path.tree);
                prefix.pop();
            }
            syn::UseTree::Name(name) => self.push_use(prefix, name.ident.to_string()),
            syn::UseTree::Rename(rename) => self.push_use(prefix, rename.ident.to_string()),
            syn::UseTree::Glob(_) => self.push_use(prefix, "*".to_owned()),
            syn::UseTree::Group(group) => {
                for tree in &group.items {
                    self.read_use(prefix, tree);
                }
            }
        }
    }

    fn push_use(&mut self, prefix: &[String], last: String) {
        let path: Vec<String> = prefix.iter().cloned().chain([last]).collect();
        if path.len() >= 2 {
            self.paths.push(path);
        }
    }
}

impl<'ast> Visit<'ast> for Production {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs = match item {
            syn::Item::Const(i) => &i.attrs,
            syn::Item::Enum(i) => &i.attrs,
            syn::Item::Fn(i) => &i.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Macro(i) => &i.attrs,
            syn::Item::Mod(i) => &i.attrs,
            syn::Item::Static(i) => &i.attrs,
            syn::Item::Struct(i) => &i.attrs,
            syn::Item::Trait(i) => &i.attrs,
            syn::Item::Type(i) => &i.attrs,
            syn::Item::Use(i) => &i.attrs,
            _ => return syn::visit::visit_item(self, item),
        };
        if !attrs.iter().any(is_cfg_test) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        let attrs = match item {
            syn::ImplItem::Const(i) => &i.attrs,
            syn::ImplItem::Fn(i) => &i.attrs,
            syn::ImplItem::Type(i) => &i.attrs,
            _ => return syn::visit::visit_impl_item(self, item),
        };
        if !attrs.iter().any(is_cfg_test) {
            syn::visit::visit_impl_item(self, item);
        }
    }

    fn visit_attribute(&mut self, attr: &'ast syn::Attribute) {
        // A doc comment is prose, not a literal of the code.
        if !attr.path().is_ident("doc") {
            if let syn::Meta::List(list) = &attr.meta {
                self.read_tokens(list.tokens.clone());
            }
            syn::visit::visit_attribute(self, attr);
        }
    }

    fn visit_lit_str(&mut self, literal: &'ast syn::LitStr) {
        self.literals.push(literal.value());
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.read_tokens(mac.tokens.clone());
        syn::visit::visit_macro(self, mac);
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        self.read_use(&mut Vec::new(), &item.tree);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.segments.len() >= 2 {
            self.paths.push(path.segments.iter().map(|s| s.ident.to_string()).collect());
        }
        syn::visit::visit_path(self, path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_in_code_macros_and_attributes_but_not_comments_or_tests() {
        let source = r##"
            //! "in a module doc"
            // "in a comment"
            /* "in a block" /* "nested" */ */
            /// "in a doc comment"
            #[arg(long, default_value = "in an attribute")]
            fn f(s: &str) -> bool { s == "in code" || s.starts_with(r#"raw"#) }
            fn g<'a>(c: char) -> bool { c == '"' || c == '{' }
            fn h() { tracing::info!(strategy = "in a macro", "and {}", "another") }
            #[cfg(test)]
            mod tests { fn t() { let _ = ["in a test"]; } }
            impl X { #[cfg(test)] fn t() { "in a test method"; } fn u() { "in a method"; } }
            const AFTER: &str = "after";
        "##;
        let found = production(source).unwrap().literals;
        let expected = [
            "in an attribute",
            "in code",
            "raw",
            "in a macro",
            "and {}",
            "another",
            "in a method",
            "after",
        ];
        assert_eq!(found, expected);
        assert_eq!(production("#![cfg(test)]\nconst X: &str = \"x\";"), None);
    }

    #[test]
    fn paths_in_uses_groups_code_and_macros_but_not_comments_strings_or_macro_rules() {
        let source = r##"
            //! Docs may mention crate::http freely.
            use crate::sale::{Sale, SaleId};
            use crate::{backends::RedisHandle, config::Config};
            use super::sibling;
            pub(crate) fn f() -> crate::outcome::Outcome {
                let s = "crate::purchase in a string";
                crate::telemetry::metrics_handle();
                tracing::info!(x = ?crate::audit::X);
                todo!()
            }
            macro_rules! m { () => { $crate::startup::run() } }
        "##;
        let paths: Vec<String> =
            production(source).unwrap().paths.iter().map(|p| p.join("::")).collect();
        let expected = [
            "crate::sale::Sale",
            "crate::sale::SaleId",
            "crate::backends::RedisHandle",
            "crate::config::Config",
            "super::sibling",
            "crate::outcome::Outcome",
            "crate::telemetry::metrics_handle",
            "crate::audit",
            "tracing::info",
        ];
        assert_eq!(paths, expected);
    }
}
