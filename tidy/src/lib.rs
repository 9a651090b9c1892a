//! The house style, checked: `cargo test -p ferrite-tidy` fails when the
//! repository breaks a rule and no line of `tidy/allow.txt` excuses it,
//! and also when an allow line excuses nothing any more, so the list only
//! shrinks. The rules:
//!
//! - `fn PATH NAME LINES`: no function over 80 lines (`fn` line to closing
//!   brace); an allowed one may not grow past LINES.
//! - `file PATH LINES`: no file over 800 lines of non-test code.
//! - `const PATH NAME`: qualifiers go last in constant names (`BATCH_MAX`,
//!   not `MAX_BATCH`), as units do (`size_bytes`).
//! - `module PATH`: one module style, `x/mod.rs`; a file `x.rs` beside a
//!   folder `x/` is the other style.
//! - `cycle PATH PATH…`: no files of a crate that import each other, in a
//!   circle of any length (see [`imports`]).
//!
//! Test code (`tests/` folders, `#[cfg(test)]` items, `#[test]` functions)
//! is not checked. `cargo run -p ferrite-tidy` prints what it finds in the
//! allow list's format.
//!
//! ```
//! let tree = ferrite_tidy::tree::Tree::from_sources(&[
//!     ("a/src/lib.rs", "mod x;\npub const MAX_BATCH: usize = 8;"),
//!     ("a/src/x.rs", ""),
//! ]);
//! let found = ferrite_tidy::findings(&tree);
//! assert_eq!(found, ["const a/src/lib.rs MAX_BATCH"]);
//! ```

pub mod imports;
pub mod lengths;
pub mod tree;

use std::collections::BTreeMap;
use std::path::Path;

use lengths::FILE_LINES_MAX;
use tree::Tree;

/// Everything `tree` breaks, one allow-list line each, sorted.
pub fn findings(tree: &Tree) -> Vec<String> {
    let mut out = Vec::new();
    for (path, error) in &tree.unparsed {
        out.push(format!("unparsed {path} {error}"));
    }
    for file in tree.files.iter().filter(|f| !f.test) {
        let m = lengths::measure(file);
        for f in m.long_functions {
            out.push(format!("fn {} {} {}", file.path, f.name, f.lines));
        }
        if m.code_lines > FILE_LINES_MAX {
            out.push(format!("file {} {}", file.path, m.code_lines));
        }
        for name in m.qualifier_first {
            out.push(format!("const {} {name}", file.path));
        }
        let stem = file.path.trim_end_matches(".rs");
        let folder = format!("{stem}/");
        let has_children = tree.files.iter().any(|f| f.path.starts_with(&folder));
        if has_children && !file.path.ends_with("/lib.rs") && !file.path.ends_with("/main.rs") {
            out.push(format!("module {}", file.path));
        }
    }
    for circle in imports::circles(tree) {
        out.push(format!("cycle {}", circle.join(" ")));
    }
    out.sort();
    out.dedup();
    out
}

/// A finding's key (all but a trailing line count) and its count.
fn split_count(line: &str) -> (String, Option<usize>) {
    let counted = line.starts_with("fn ") || line.starts_with("file ");
    match line.rsplit_once(' ') {
        Some((key, n)) if counted => (key.to_string(), n.parse().ok()),
        _ => (line.to_string(), None),
    }
}

/// Compares `found` with the allow list's lines: the problems, each
/// saying what to fix or which allow line to change.
pub fn compare(found: &[String], allow: &str) -> Vec<String> {
    let mut allowed: BTreeMap<String, Option<usize>> = BTreeMap::new();
    for line in allow.lines().map(str::trim) {
        if !line.is_empty() && !line.starts_with('#') {
            let (key, n) = split_count(line);
            allowed.insert(key, n);
        }
    }
    let mut problems = Vec::new();
    let mut used = Vec::new();
    for line in found {
        let (key, n) = split_count(line);
        let Some(&max) = allowed.get(&key) else {
            problems.push(format!("new: {line}"));
            continue;
        };
        used.push(key);
        match (max, n) {
            (Some(max), Some(n)) if n > max => {
                problems.push(format!("grew past its allow line ({max}): {line}"))
            }
            (Some(max), Some(n)) if n < max => {
                problems.push(format!("shrank: lower its allow line from {max}: {line}"))
            }
            _ => {}
        }
    }
    for key in allowed.keys() {
        if !used.contains(key) {
            problems.push(format!("fixed: remove its allow line: {key}"));
        }
    }
    problems
}

/// Checks the repository at `root` against `root/tidy/allow.txt`.
pub fn check(root: &Path) -> std::io::Result<Vec<String>> {
    let tree = Tree::load(root)?;
    let allow = std::fs::read_to_string(root.join("tidy/allow.txt")).unwrap_or_default();
    Ok(compare(&findings(&tree), &allow))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allow_list_excuses_only_what_it_names_and_only_shrinks() {
        let found = vec!["fn a.rs f 90".to_string(), "const a.rs MAX_X".to_string()];
        assert!(compare(&found, "fn a.rs f 90\nconst a.rs MAX_X\n").is_empty());
        let p = compare(&found, "# comment\nfn a.rs f 85\n");
        assert_eq!(
            p,
            [
                "grew past its allow line (85): fn a.rs f 90",
                "new: const a.rs MAX_X"
            ]
        );
        let p = compare(
            &found[..1],
            "fn a.rs f 95\nconst a.rs MAX_X\nfile b.rs 900\n",
        );
        assert_eq!(
            p,
            [
                "shrank: lower its allow line from 95: fn a.rs f 90",
                "fixed: remove its allow line: const a.rs MAX_X",
                "fixed: remove its allow line: file b.rs",
            ]
        );
    }

    #[test]
    fn a_file_beside_its_folder_is_the_other_module_style() {
        let tree = Tree::from_sources(&[
            ("a/src/lib.rs", "mod x; mod y;"),
            ("a/src/x.rs", "mod z;"),
            ("a/src/x/z.rs", ""),
            ("a/src/y/mod.rs", "mod w;"),
            ("a/src/y/w.rs", ""),
        ]);
        assert_eq!(findings(&tree), ["module a/src/x.rs"]);
    }
}
