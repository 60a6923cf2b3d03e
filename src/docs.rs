//! Fast-tier checks of the docs book (`docs/src/`) and `README.md`: every relative link's target
//! exists, every `#anchor` names a heading of its file (mdBook's and GitHub's slugs), SUMMARY.md
//! lists every page and every page it lists exists, and each alert's runbook URL points at a
//! heading of the book. The book itself is built by mdbook in `tests/docs.rs`.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

/// The anchor mdBook and GitHub give a heading: inline markup dropped (code spans keep their
/// text, links their label), lowercase, whitespace → `-`, punctuation other than `-` and `_`
/// dropped.
pub fn slug(heading: &str) -> String {
    let text = strip_links(heading);
    text.chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '-' || c == '_' {
                Some(c.to_lowercase().collect::<String>())
            } else if c.is_whitespace() {
                Some("-".into())
            } else {
                None
            }
        })
        .collect()
}

/// `[label](target)` → `label`.
fn strip_links(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(open) = rest.find('[') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match after.find("](") {
            Some(close) if !after[..close].contains('[') => {
                out.push_str(&after[..close]);
                let tail = &after[close + 2..];
                rest = tail.find(')').map_or("", |end| &tail[end + 1..]);
            }
            _ => {
                out.push('[');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Lines outside fenced code blocks.
fn prose_lines(text: &str) -> Vec<&str> {
    let mut fence = false;
    let mut lines = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
            continue;
        }
        if !fence {
            lines.push(line);
        }
    }
    lines
}

/// The anchors of a Markdown file's headings (outside code blocks), duplicates numbered as
/// mdBook and GitHub do (`x`, `x-1`, …).
pub fn anchors(text: &str) -> BTreeSet<String> {
    let mut anchors = BTreeSet::new();
    for line in prose_lines(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(line[hashes..].trim());
        let mut anchor = base.clone();
        let mut n = 0;
        while anchors.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        anchors.insert(anchor);
    }
    anchors
}

/// Removes inline code spans, whose brackets are not links.
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
        } else if !in_code {
            out.push(c);
        }
    }
    out
}

/// The targets of the inline links and images of a Markdown file, outside code.
pub fn links(text: &str) -> Vec<String> {
    let mut links = Vec::new();
    for line in prose_lines(text) {
        let line = without_code_spans(line);
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let tail = &rest[at + 2..];
            let Some(end) = tail.find(')') else { break };
            let target = tail[..end].split_whitespace().next().unwrap_or_default();
            links.push(target.to_owned());
            rest = &tail[end + 1..];
        }
    }
    links
}

/// `a/b/../c` → `a/c`, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Every broken relative link of the Markdown file `file` (relative to `root`), as messages.
pub fn broken_links(root: &Path, file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(root.join(file)).unwrap_or_default();
    let mut broken = Vec::new();
    for link in links(&text) {
        if link.is_empty()
            || link.contains("://")
            || link.starts_with("mailto:")
            || link.starts_with('<')
        {
            continue;
        }
        let (path, anchor) = match link.split_once('#') {
            Some((path, anchor)) => (path, Some(anchor)),
            None => (link.as_str(), None),
        };
        let target = if path.is_empty() {
            file.to_path_buf()
        } else {
            normalize(&file.parent().unwrap_or(Path::new("")).join(path))
        };
        let full = root.join(&target);
        if !full.exists() {
            broken.push(format!(
                "{}: link {link}: {} does not exist",
                file.display(),
                target.display()
            ));
            continue;
        }
        if let Some(anchor) = anchor {
            let is_markdown = target.extension().is_some_and(|e| e == "md");
            let text = std::fs::read_to_string(&full).unwrap_or_default();
            if !is_markdown || !anchors(&text).contains(anchor) {
                broken.push(format!(
                    "{}: link {link}: no heading of {} has the anchor #{anchor}",
                    file.display(),
                    target.display()
                ));
            }
        }
    }
    broken
}

/// The pages SUMMARY.md links to, relative to its directory.
pub fn summary_pages(summary: &str) -> Vec<String> {
    links(summary)
        .into_iter()
        .filter(|l| !l.is_empty() && !l.contains("://"))
        .map(|l| l.split('#').next().unwrap_or_default().to_owned())
        .collect()
}

/// Every problem of the book in `root/docs/src` and of `root/README.md`.
pub fn check_book(root: &Path) -> Vec<String> {
    let src = Path::new("docs/src");
    let mut pages = Vec::new();
    let mut stack = vec![root.join(src)];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.push(path.strip_prefix(root).unwrap().to_path_buf());
            }
        }
    }
    pages.sort();
    let mut problems = Vec::new();
    let summary_path = src.join("SUMMARY.md");
    let summary = std::fs::read_to_string(root.join(&summary_path)).unwrap_or_default();
    if summary.is_empty() {
        problems.push("docs/src/SUMMARY.md is missing or empty".into());
    }
    let listed: BTreeSet<PathBuf> = summary_pages(&summary)
        .iter()
        .map(|p| normalize(&src.join(p)))
        .collect();
    for page in &listed {
        if !root.join(page).is_file() {
            problems.push(format!(
                "SUMMARY.md lists {}, which does not exist",
                page.display()
            ));
        }
    }
    for page in &pages {
        if page != &summary_path && !listed.contains(page) {
            problems.push(format!("SUMMARY.md does not list {}", page.display()));
        }
    }
    // SUMMARY.md's own links were checked above.
    let files = pages.iter().filter(|p| **p != summary_path);
    for file in files.chain([PathBuf::from("README.md")].iter()) {
        problems.extend(broken_links(root, file));
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo() -> &'static Path {
        Path::new(env!("CARGO_MANIFEST_DIR"))
    }

    #[test]
    fn the_books_links_anchors_and_summary_hold() {
        let problems = check_book(repo());
        assert!(
            problems.is_empty(),
            "docs/src or README.md:\n{}",
            problems.join("\n")
        );
    }

    /// Where the alerts' `runbook_url`s point: the book's pages as GitHub shows them.
    const RUNBOOK_BASE: &str = "https://github.com/briq-cloud/briq-operator/blob/main/";

    #[test]
    fn every_alerts_runbook_url_points_at_a_heading_of_the_book() {
        let path = "charts/briq-operator/alerts/briq-operator.rules.yaml";
        let rules: serde_json::Value =
            serde_yaml_ng::from_str(&std::fs::read_to_string(repo().join(path)).unwrap()).unwrap();
        let mut alerts = 0;
        for group in rules["groups"].as_array().unwrap() {
            for rule in group["rules"].as_array().unwrap() {
                let name = rule["alert"].as_str().unwrap();
                alerts += 1;
                let url = rule["annotations"]["runbook_url"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{path}: {name} has no runbook_url"));
                let target = url
                    .strip_prefix(RUNBOOK_BASE)
                    .unwrap_or_else(|| panic!("{name}: {url} is not under {RUNBOOK_BASE}"));
                let (page, anchor) = target
                    .split_once('#')
                    .unwrap_or_else(|| panic!("{name}: {url} has no #anchor"));
                assert!(page.starts_with("docs/src/"), "{name}: {url}");
                let text = std::fs::read_to_string(repo().join(page))
                    .unwrap_or_else(|_| panic!("{name}: {url}: {page} does not exist"));
                assert!(
                    anchors(&text).contains(anchor),
                    "{name}: {url}: no heading of {page} has the anchor #{anchor}"
                );
            }
        }
        assert!(alerts >= 5, "{alerts} alerts");
    }

    #[test]
    fn slugs_follow_mdbook_and_github() {
        assert_eq!(slug("When briq has a bad day"), "when-briq-has-a-bad-day");
        assert_eq!(
            slug("Before and after (same machine, same benchmark)"),
            "before-and-after-same-machine-same-benchmark"
        );
        assert_eq!(slug("The operator's RBAC"), "the-operators-rbac");
        assert_eq!(slug("`BriqExecutor` fields"), "briqexecutor-fields");
        assert_eq!(
            slug("API server cost (issue 28)"),
            "api-server-cost-issue-28"
        );
        assert_eq!(slug("[Pools](pools.md) and_more"), "pools-and_more");
        let numbered = anchors("# A\n## A\n```\n# not a heading\n```\n## B\n");
        assert_eq!(numbered.into_iter().collect::<Vec<_>>(), ["a", "a-1", "b"]);
    }

    #[test]
    fn links_skip_code() {
        let text = "see [a](a.md#x) and `[b](b.md)`\n```\n[c](c.md)\n```\n![img](i.png \"t\")\n";
        assert_eq!(links(text), ["a.md#x", "i.png"]);
    }

    /// The checker itself fails on a broken file, a broken anchor, a page missing from
    /// SUMMARY.md and a SUMMARY.md entry without its page.
    #[test]
    fn a_broken_book_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("docs/src/sub")).unwrap();
        let write = |path: &str, text: &str| std::fs::write(root.join(path), text).unwrap();
        write(
            "docs/src/SUMMARY.md",
            "# Summary\n\n- [A](a.md)\n- [Gone](gone.md)\n",
        );
        write(
            "docs/src/a.md",
            "# A page\n\n## Good one\n\n[ok](#good-one) [ok](sub/b.md#b-title) \
             [bad anchor](sub/b.md#nope) [missing](missing.md) [web](https://example.com/x#y)\n",
        );
        write("docs/src/sub/b.md", "# B title\n\n[up](../a.md#a-page)\n");
        write(
            "README.md",
            "[book](docs/src/a.md#good-one) [bad](docs/src/a.md#bad)\n",
        );
        let problems = check_book(root);
        let expect = [
            "SUMMARY.md lists docs/src/gone.md, which does not exist",
            "SUMMARY.md does not list docs/src/sub/b.md",
            "docs/src/a.md: link sub/b.md#nope: no heading of docs/src/sub/b.md has the anchor #nope",
            "docs/src/a.md: link missing.md: docs/src/missing.md does not exist",
            "README.md: link docs/src/a.md#bad: no heading of docs/src/a.md has the anchor #bad",
        ];
        for message in expect {
            assert!(
                problems.iter().any(|p| p == message),
                "{message} not in {problems:#?}"
            );
        }
        assert_eq!(problems.len(), expect.len(), "{problems:#?}");
    }
}
