//! The modules of both crates (`src/`, `dev/src/`) import each other one way: no circle of
//! imports, however long. A file is a module; an edge `a -> b` is any path in `a` that names
//! something in `b` (`use super::x`, `crate::b::f()`, a parent's `child::X`, a glob re-export).
//! A parent `mod.rs` that uses its children while they use it is a circle too: what children
//! share lives in a sibling of theirs, and the parent only declares, wires and re-exports.
//!
//! Why a parser of `use` lines and not crates the compiler keeps apart: splitting the operator
//! into a crate per layer would enforce the same order, but would cost a crate boundary (and a
//! longer build) per layer for what one fast test checks as well, and would not see circles
//! inside a layer.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

/// A module: its path from the crate root (`["controller", "execution"]`).
type Module = Vec<String>;

/// Every module of the crate rooted at `root`, with its file.
fn modules(root: &Path) -> BTreeMap<Module, PathBuf> {
    fn walk(dir: &Path, files: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("readable source directory") {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                walk(&path, files);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(root, &mut files);
    let mut modules = BTreeMap::new();
    for file in files {
        let relative = file
            .strip_prefix(root)
            .expect("under the root")
            .with_extension("");
        let mut module: Module = relative
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if module.last().is_some_and(|last| last == "mod") {
            module.pop();
        }
        // The library is the root; `main.rs` is a crate of its own that uses the library by its
        // name, so it stays a module beside it (`main`), which nothing imports.
        if module == ["lib"] {
            module.clear();
        }
        modules.insert(module, file);
    }
    modules
}

/// `source` with comments, string and character literals blanked (newlines kept, so that line
/// numbers still hold).
fn code_only(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if c == 'r'
            && (next == Some('"') || next == Some('#'))
            && !chars[..i]
                .last()
                .is_some_and(|p| p.is_alphanumeric() || *p == '_')
        {
            // A raw string: r"…", r#"…"#, …
            let mut j = i + 1;
            while chars.get(j) == Some(&'#') {
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            let hashes = j - i - 1;
            let mut k = j + 1;
            while k < chars.len() {
                if chars[k] == '"' && (1..=hashes).all(|h| chars.get(k + h) == Some(&'#')) {
                    k += 1 + hashes;
                    break;
                }
                k += 1;
            }
            chars[i..k.min(chars.len())]
                .iter()
                .for_each(|c| out.push(blank(*c)));
            i = k;
        } else if c == '"' {
            let mut k = i + 1;
            while k < chars.len() && chars[k] != '"' {
                k += if chars[k] == '\\' { 2 } else { 1 };
            }
            chars[i..(k + 1).min(chars.len())]
                .iter()
                .for_each(|c| out.push(blank(*c)));
            i = k + 1;
        } else if c == '\'' {
            // A character literal ('x', '\n', '\''), not a lifetime ('a).
            let end = if next == Some('\\') {
                (i + 2..chars.len().min(i + 12)).find(|&k| chars[k] == '\'')
            } else {
                (chars.get(i + 2) == Some(&'\'')).then_some(i + 2)
            };
            match end {
                Some(end) => {
                    (i..=end).for_each(|_| out.push(' '));
                    i = end + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    Path, // ::
    Open,
    Close,
    Comma,
    Paren,
    Other,
}

/// The tokens of `code` that paths are made of, each with its line.
fn tokens(code: &str) -> Vec<(Token, usize)> {
    let chars: Vec<char> = code.chars().collect();
    let mut tokens = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let ident: String = chars[start..i].iter().collect();
            tokens.push((Token::Ident(ident.trim_start_matches("r#").into()), line));
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            tokens.push((Token::Path, line));
            i += 2;
        } else {
            tokens.push((
                match c {
                    '{' => Token::Open,
                    '}' => Token::Close,
                    ',' => Token::Comma,
                    '(' => Token::Paren,
                    _ => Token::Other,
                },
                line,
            ));
            i += 1;
        }
    }
    tokens
}

/// Every path in `tokens` that may name a module of the crate, from `at` on: segments, then,
/// after `::{`, each path of the group with the segments before it.
fn path_at(tokens: &[(Token, usize)], at: usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    let mut segments = prefix;
    let mut i = at;
    while let Some((Token::Ident(name), _)) = tokens.get(i) {
        segments.push(name.clone());
        match (tokens.get(i + 1), tokens.get(i + 2)) {
            (Some((Token::Path, _)), Some((Token::Ident(_), _))) => i += 2,
            (Some((Token::Path, _)), Some((Token::Open, _))) => {
                // A group: each item is a path of its own after these segments.
                let mut k = i + 3;
                let mut depth = 0;
                let mut item_start = true;
                while k < tokens.len() {
                    match &tokens[k].0 {
                        Token::Open => depth += 1,
                        Token::Close if depth == 0 => break,
                        Token::Close => depth -= 1,
                        Token::Comma if depth == 0 => {
                            item_start = true;
                            k += 1;
                            continue;
                        }
                        Token::Ident(_) if item_start && depth == 0 => {
                            path_at(tokens, k, segments.clone(), out);
                        }
                        _ => {}
                    }
                    item_start = false;
                    k += 1;
                }
                // (`use a::{self, …}` names `a` through its `self` item.)
                return;
            }
            _ => break,
        }
    }
    out.push(segments);
}

/// The module a path used in module `current` (the file's module and any inline modules around
/// the path) lands in: the deepest module file it names.
fn resolve(
    modules: &BTreeMap<Module, PathBuf>,
    current: &[String],
    segments: &[String],
) -> Option<Module> {
    let mut base: Module = current.to_vec();
    let mut rest = segments;
    match segments.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &segments[1..];
        }
        Some("self" | "super") => {
            while let Some(first) = rest.first() {
                match first.as_str() {
                    "self" => {}
                    "super" => {
                        base.pop()?;
                    }
                    _ => break,
                }
                rest = &rest[1..];
            }
        }
        // A bare path: a child module of the current one, or nothing of this crate's.
        Some(first) => {
            let mut child = base.clone();
            child.push(first.to_owned());
            if !modules.contains_key(&child) {
                return None;
            }
        }
        None => return None,
    }
    // Inline modules (`mod tests { … }`) are part of their file's module.
    while !modules.contains_key(&base) {
        base.pop()?;
    }
    for segment in rest {
        let mut child = base.clone();
        child.push(segment.clone());
        if !modules.contains_key(&child) {
            break;
        }
        base = child;
    }
    Some(base)
}

/// Each edge of the crate rooted at `root`, with the first file and line that makes it.
fn edges(root: &Path) -> BTreeMap<(Module, Module), String> {
    let modules = modules(root);
    let mut edges = BTreeMap::new();
    for (module, file) in &modules {
        let source = std::fs::read_to_string(file).expect("readable source file");
        let tokens = tokens(&code_only(&source));
        // Inline modules open around a path: (name, brace depth inside it).
        let mut inline: Vec<(String, usize)> = Vec::new();
        let mut depth = 0usize;
        let mut i = 0;
        while i < tokens.len() {
            match &tokens[i].0 {
                Token::Open => depth += 1,
                Token::Close => {
                    if inline.last().is_some_and(|(_, d)| *d == depth) {
                        inline.pop();
                    }
                    depth = depth.saturating_sub(1);
                }
                // `mod name;` declares a child and imports nothing of it; `mod name { … }`
                // opens an inline module.
                Token::Ident(word) if word == "mod" => {
                    if let (Some((Token::Ident(name), _)), Some((Token::Open, _))) =
                        (tokens.get(i + 1), tokens.get(i + 2))
                    {
                        inline.push((name.clone(), depth + 1));
                    }
                    i += 1;
                }
                // `pub(crate)`, `pub(super)`, `pub(in …)` say who may see an item, not what it uses.
                Token::Ident(word)
                    if word == "pub" && tokens.get(i + 1).is_some_and(|t| t.0 == Token::Paren) =>
                {
                    i += 2;
                    while tokens.get(i).is_some_and(|t| t.0 != Token::Other) {
                        i += 1;
                    }
                }
                Token::Ident(word)
                    if !matches!(tokens.get(i.wrapping_sub(1)), Some((Token::Path, _)))
                        && (matches!(word.as_str(), "crate" | "self" | "super")
                            || matches!(tokens.get(i + 1), Some((Token::Path, _)))) =>
                {
                    let mut current = module.clone();
                    current.extend(inline.iter().map(|(name, _)| name.clone()));
                    let mut paths = Vec::new();
                    path_at(&tokens, i, Vec::new(), &mut paths);
                    for path in paths {
                        let Some(target) = resolve(&modules, &current, &path) else {
                            continue;
                        };
                        if &target != module {
                            let place = format!(
                                "{}:{}",
                                file.strip_prefix(root.parent().unwrap_or(root))
                                    .unwrap_or(file)
                                    .display(),
                                tokens[i].1
                            );
                            edges.entry((module.clone(), target)).or_insert(place);
                        }
                    }
                }
                _ => {}
            }
            i += 1;
        }
    }
    edges
}

/// The circles among `edges`: strongly connected components of more than one module.
fn circles(edges: &BTreeMap<(Module, Module), String>) -> Vec<BTreeSet<Module>> {
    let mut next: BTreeMap<&Module, Vec<&Module>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        next.entry(from).or_default().push(to);
        next.entry(to).or_default();
    }
    // Tarjan's algorithm, iteratively.
    let nodes: Vec<&Module> = next.keys().copied().collect();
    let index_of: BTreeMap<&Module, usize> =
        nodes.iter().enumerate().map(|(i, m)| (*m, i)).collect();
    let n = nodes.len();
    let (mut index, mut low, mut on_stack) = (vec![usize::MAX; n], vec![0; n], vec![false; n]);
    let (mut stack, mut counter, mut found) = (Vec::new(), 0, Vec::new());
    for start in 0..n {
        if index[start] != usize::MAX {
            continue;
        }
        let mut work = vec![(start, 0usize)];
        while let Some(&mut (v, ref mut child)) = work.last_mut() {
            if *child == 0 && index[v] == usize::MAX {
                index[v] = counter;
                low[v] = counter;
                counter += 1;
                stack.push(v);
                on_stack[v] = true;
            }
            let successors = &next[nodes[v]];
            if *child < successors.len() {
                let w = index_of[successors[*child]];
                *child += 1;
                if index[w] == usize::MAX {
                    work.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut component = BTreeSet::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    component.insert(nodes[w].clone());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    found.push(component);
                }
            }
        }
    }
    found
}

fn name(module: &Module) -> String {
    if module.is_empty() {
        "crate".into()
    } else {
        module.join("::")
    }
}

/// The circles of the crate at `root`, each with its edges and where they come from.
fn report(root: &Path) -> Vec<String> {
    let edges = edges(root);
    circles(&edges)
        .into_iter()
        .map(|circle| {
            let mut text = format!(
                "a circle of {} modules: {}\n",
                circle.len(),
                circle.iter().map(name).collect::<Vec<_>>().join(", ")
            );
            for ((from, to), place) in &edges {
                if circle.contains(from) && circle.contains(to) {
                    text.push_str(&format!("    {} -> {}  ({place})\n", name(from), name(to)));
                }
            }
            text
        })
        .collect()
}

#[test]
fn the_operator_crate_imports_one_way() {
    let circles = report(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(circles.is_empty(), "{}", circles.join("\n"));
}

/// The controllers share what they share through the layers below them (`crd`, `index`,
/// `status`, …), never through one another: one controller's change cannot break another.
#[test]
fn no_controller_imports_another() {
    const CONTROLLERS: [&str; 4] = ["executor", "execution", "pool", "orphans"];
    let edges = edges(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let controller = |module: &Module| match module.as_slice() {
        [top, name, ..] if top == "controller" && CONTROLLERS.contains(&name.as_str()) => {
            Some(name.clone())
        }
        _ => None,
    };
    let across: Vec<String> = edges
        .iter()
        .filter(|((from, to), _)| {
            matches!((controller(from), controller(to)), (Some(a), Some(b)) if a != b)
        })
        .map(|((from, to), place)| format!("{} -> {}  ({place})", name(from), name(to)))
        .collect();
    assert!(across.is_empty(), "{}", across.join("\n"));
}

#[test]
fn the_dev_crate_imports_one_way() {
    let circles = report(&Path::new(env!("CARGO_MANIFEST_DIR")).join("dev/src"));
    assert!(circles.is_empty(), "{}", circles.join("\n"));
}

#[test]
fn a_circle_through_a_parent_and_its_child_is_found() {
    let dir = tempfile::tempdir().expect("temp dir");
    let write = |path: &str, text: &str| {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write("lib.rs", "mod a;\nmod b;\n");
    // a's children share what a defines, and a re-exports a child: a circle of two. a uses two
    // as well, which only says who may see its item (`pub(super)`): no circle through two.
    write(
        "a/mod.rs",
        "mod one;\nmod two;\npub use one::*;\npub struct Shared;\nfn f() -> two::Two { two::Two }\n",
    );
    write("a/one.rs", "use super::{two::{self, Two}, Shared};\n");
    // A visibility, a raw string and a comment that only look like paths: no edge.
    write(
        "a/two.rs",
        "pub(super) struct Two;\n// super::one\nconst S: &str = r#\"super::one\"#;\n",
    );
    // b uses a one way; its inline test module's `super` is b itself.
    write(
        "b.rs",
        "use crate::a::Shared;\n#[cfg(test)]\nmod tests { use super::*; }\n",
    );
    let circles = report(dir.path());
    assert_eq!(circles.len(), 1, "{circles:?}");
    assert!(
        circles[0].starts_with("a circle of 2 modules: a, a::one\n"),
        "{}",
        circles[0]
    );
    assert!(circles[0].contains("a -> a::one  ("), "{}", circles[0]);
    assert!(circles[0].contains("a::one -> a  ("), "{}", circles[0]);
    let edges = edges(dir.path());
    let named = |from: &[&str], to: &[&str]| {
        let module = |m: &[&str]| m.iter().map(|s| s.to_string()).collect::<Module>();
        edges.contains_key(&(module(from), module(to)))
    };
    assert!(named(&["a", "one"], &["a", "two"]));
    assert!(!named(&["a", "two"], &["a", "one"]));
    assert!(named(&["b"], &["a"]));
    assert!(!named(&["b"], &[]));
}
