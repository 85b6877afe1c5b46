//! The load test names no strategy: every production source file under
//! `loadtest/src` is read, and a string literal that is a registered
//! strategy's wire name (`seckill::strategy::StrategyName::ALL`), starts
//! with one and a space, or is a family prefix of one (`"lock/"`) fails the
//! test. What the load test knows of a strategy comes from its
//! registration. Comments and `#[cfg(test)]` items (unit tests, fixtures)
//! do not count: tests name the strategies they check, and so does this
//! test-only file (`#![cfg(test)]`).

#![cfg(test)]

use std::ops::Range;
use std::path::{Path, PathBuf};

use seckill::strategy::StrategyName;

/// A string literal of a source: where it stands and what it holds (as
/// written, escapes unresolved).
#[derive(Debug, PartialEq)]
struct Literal {
    at: usize,
    text: String,
}

/// The source with comments and the contents of string and char literals
/// blanked (so that braces count right), and its string literals.
fn lex(source: &str) -> (Vec<char>, Vec<Literal>) {
    let chars: Vec<char> = source.chars().collect();
    let mut code = chars.clone();
    let mut literals = Vec::new();
    let mut i = 0;
    let blank = |code: &mut Vec<char>, range: Range<usize>| {
        for c in &mut code[range] {
            if *c != '\n' {
                *c = ' ';
            }
        }
    };
    while i < chars.len() {
        let next = chars.get(i + 1).copied();
        let ident_before = i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
        if chars[i] == '/' && next == Some('/') {
            let end = chars[i..].iter().position(|&c| c == '\n').map_or(chars.len(), |n| i + n);
            blank(&mut code, i..end);
            i = end;
        } else if chars[i] == '/' && next == Some('*') {
            let end = block_comment_end(&chars, i);
            blank(&mut code, i..end);
            i = end;
        } else if chars[i] == 'r' && !ident_before && matches!(next, Some('"' | '#')) {
            let hashes = chars[i + 1..].iter().take_while(|&&c| c == '#').count();
            if chars.get(i + 1 + hashes) != Some(&'"') {
                i += 1;
                continue;
            }
            let open = i + 2 + hashes;
            let close = raw_end(&chars, open, hashes);
            literals.push(Literal { at: i, text: chars[open..close].iter().collect() });
            blank(&mut code, open..close);
            i = close + 1 + hashes;
        } else if chars[i] == '"' {
            let close = quoted_end(&chars, i + 1);
            literals.push(Literal { at: i, text: chars[i + 1..close].iter().collect() });
            blank(&mut code, i + 1..close);
            i = close + 1;
        } else if chars[i] == '\'' {
            i = char_literal_end(&chars, i)
                .inspect(|&end| blank(&mut code, i + 1..end - 1))
                .unwrap_or(i + 1);
        } else {
            i += 1;
        }
    }
    (code, literals)
}

/// Past the `*/` closing the (nested) block comment opening at `start`.
fn block_comment_end(chars: &[char], start: usize) -> usize {
    let (mut depth, mut i) = (0, start);
    while i + 1 < chars.len() {
        match (chars[i], chars[i + 1]) {
            ('/', '*') => (depth, i) = (depth + 1, i + 2),
            ('*', '/') if depth == 1 => return i + 2,
            ('*', '/') => (depth, i) = (depth - 1, i + 2),
            _ => i += 1,
        }
    }
    chars.len()
}

/// The index of the `"` closing a string whose contents start at `from`.
fn quoted_end(chars: &[char], from: usize) -> usize {
    let mut i = from;
    while i < chars.len() && chars[i] != '"' {
        i += if chars[i] == '\\' { 2 } else { 1 };
    }
    i.min(chars.len())
}

/// The index of the `"` followed by `hashes` `#` that closes a raw string
/// whose contents start at `from`.
fn raw_end(chars: &[char], from: usize, hashes: usize) -> usize {
    (from..chars.len())
        .find(|&i| chars[i] == '"' && (1..=hashes).all(|h| chars.get(i + h) == Some(&'#')))
        .unwrap_or(chars.len())
}

/// Past a char literal opening at `start` (`'x'`, `'\n'`, `'\u{1F600}'`);
/// `None` for a lifetime or a label.
fn char_literal_end(chars: &[char], start: usize) -> Option<usize> {
    if chars.get(start + 1) == Some(&'\\') {
        let close = (start + 3..chars.len()).find(|&i| chars[i] == '\'')?;
        return Some(close + 1);
    }
    (chars.get(start + 2) == Some(&'\'')).then_some(start + 3)
}

/// An opening and a closing brace (named, so that no brace stands in a
/// char literal inside the functions below).
const OPEN: char = '\u{7b}';
const CLOSE: char = '\u{7d}';

/// The ranges of `#[cfg(test)]` items in blanked `code`: from the
/// attribute to the `;` or the brace closing the item.
fn test_items(code: &[char]) -> Vec<Range<usize>> {
    let attribute: Vec<char> = "#[cfg(test)]".chars().collect();
    let mut ranges = Vec::new();
    let mut i = 0;
    while i + attribute.len() <= code.len() {
        if code[i..i + attribute.len()] != attribute[..] {
            i += 1;
            continue;
        }
        let end = item_end(code, i + attribute.len());
        ranges.push(i..end + 1);
        i = end + 1;
    }
    ranges
}

/// Where the item starting at `from` ends: its `;`, or the brace closing
/// its body.
fn item_end(code: &[char], from: usize) -> usize {
    let mut j = from;
    while j < code.len() && code[j] != ';' && code[j] != OPEN {
        j += 1;
    }
    if j < code.len() && code[j] == OPEN {
        let mut depth = 0;
        while j < code.len() {
            match code[j] {
                c if c == OPEN => depth += 1,
                c if c == CLOSE && depth == 1 => break,
                c if c == CLOSE => depth -= 1,
                _ => {}
            }
            j += 1;
        }
    }
    j
}

/// Whether `text` names a strategy: one of `names`, one of them followed by
/// a space, or a family prefix (`lock/`) of one.
fn names_a_strategy(text: &str, names: &[&str]) -> bool {
    names.iter().any(|name| {
        text == *name
            || text.strip_prefix(name).is_some_and(|rest| rest.starts_with(' '))
            || (text.ends_with('/') && name.starts_with(text))
    })
}

/// `line: literal` for each literal of `source` outside tests that names a
/// strategy of `names`.
fn hits(source: &str, names: &[&str]) -> Vec<String> {
    let (code, literals) = lex(source);
    let tests = test_items(&code);
    let chars: Vec<char> = source.chars().collect();
    literals
        .iter()
        .filter(|literal| !tests.iter().any(|range| range.contains(&literal.at)))
        .filter(|literal| names_a_strategy(&literal.text, names))
        .map(|literal| {
            let line = chars[..literal.at].iter().filter(|&&c| c == '\n').count() + 1;
            format!("{line}: {:?}", literal.text)
        })
        .collect()
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
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

#[test]
fn no_production_source_of_the_load_test_names_a_strategy() {
    let names: Vec<&str> = StrategyName::ALL.iter().map(|name| name.as_str()).collect();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = rust_files(&src);
    assert!(files.len() > 20, "{files:?}");
    let mut problems = Vec::new();
    for file in files {
        let source = std::fs::read_to_string(&file).expect("a readable source");
        if lex(&source).0.iter().collect::<String>().contains("#![cfg(test)]") {
            continue;
        }
        for hit in hits(&source, &names) {
            problems.push(format!("{}:{hit}", file.strip_prefix(&src).unwrap().display()));
        }
    }
    assert!(
        problems.is_empty(),
        "strategy names in the load test's production code (read the registration instead):\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_scan_finds_names_in_code_and_skips_comments_and_tests() {
    let names = ["sql", "lock/setnx"];
    let source = r##"
        // "sql" in a comment
        /* "sql" /* nested */ "sql" */
        fn f(s: &str) -> bool { s == "sql" || s.starts_with("lock/") }
        const OTHER: &str = "sql_tps";
        const RAW: &str = r#"lock/setnx"#;
        fn g<'a>(c: char) -> bool { c == '"' || c == '{' }
        const MESSAGE: &str = "lock/setnx needs a key";
        #[cfg(test)]
        mod tests { fn t() { let _ = ["sql", "{"]; } }
        #[cfg(test)]
        use x::y;
        const AFTER: &str = "sql";
    "##;
    let found = hits(source, &names);
    assert_eq!(
        found,
        [
            r#"4: "sql""#,
            r#"4: "lock/""#,
            r#"6: "lock/setnx""#,
            r#"8: "lock/setnx needs a key""#,
            r#"13: "sql""#,
        ],
        "{found:?}"
    );
}
