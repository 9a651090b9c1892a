//! The repository's Rust sources: every `.rs` file outside build output
//! and vendored code, parsed, and the module tree of each crate root
//! (`src/lib.rs`, `src/main.rs`, `src/bin/*.rs`) found by following `mod`
//! declarations, so each file knows its module path and whether it is test
//! code (under a `tests/` folder or declared by a `#[cfg(test)] mod`).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// Folders never searched for sources.
const SKIPPED_DIRS: [&str; 7] = [
    "target",
    "vendor",
    ".git",
    "corpus",
    "artifacts",
    "third_party",
    "node_modules",
];

/// One parsed source file.
pub struct SourceFile {
    /// Path relative to the repository root, with `/` separators.
    pub path: String,
    pub text: String,
    pub ast: syn::File,
    /// Test code: under a `tests/` folder or declared by `#[cfg(test)] mod`.
    pub test: bool,
    /// The crate root whose module tree holds the file and the file's
    /// module path in it (empty for the root itself), if any tree does.
    pub module: Option<(usize, Vec<String>)>,
}

/// A crate root: one compilation unit whose files' imports can circle.
#[derive(Debug)]
pub struct Unit {
    /// The root file's path, e.g. `engine/src/lib.rs`.
    pub root: String,
}

/// Every source of the repository.
#[derive(Default)]
pub struct Tree {
    pub files: Vec<SourceFile>,
    pub units: Vec<Unit>,
    /// Files that did not parse, with the parser's message.
    pub unparsed: Vec<(String, String)>,
}

impl Tree {
    /// Reads and parses every source under `root`.
    pub fn load(root: &Path) -> std::io::Result<Tree> {
        let mut paths = Vec::new();
        walk(root, root, &mut paths)?;
        paths.sort();
        let mut tree = Tree::default();
        for rel in paths {
            let text = fs::read_to_string(root.join(&rel))?;
            match syn::parse_file(&text) {
                Ok(ast) => tree.files.push(SourceFile {
                    test: rel.split('/').any(|c| c == "tests"),
                    path: rel,
                    text,
                    ast,
                    module: None,
                }),
                Err(e) => tree.unparsed.push((rel, e.to_string())),
            }
        }
        tree.link_units();
        Ok(tree)
    }

    /// Builds a tree from in-memory files (path, text); for tests.
    pub fn from_sources(sources: &[(&str, &str)]) -> Tree {
        let mut tree = Tree::default();
        for (path, text) in sources {
            let ast = syn::parse_file(text).expect("test source parses");
            tree.files.push(SourceFile {
                path: path.to_string(),
                text: text.to_string(),
                ast,
                test: path.split('/').any(|c| c == "tests"),
                module: None,
            });
        }
        tree.link_units();
        tree
    }

    /// The index of the file at `path`.
    pub fn index_of(&self, path: &str) -> Option<usize> {
        self.files.iter().position(|f| f.path == path)
    }

    /// Finds the crate roots and walks each one's `mod` declarations.
    fn link_units(&mut self) {
        let roots: Vec<usize> = (0..self.files.len())
            .filter(|&i| is_crate_root(&self.files[i].path))
            .collect();
        for file in roots {
            let unit = self.units.len();
            self.units.push(Unit {
                root: self.files[file].path.clone(),
            });
            self.link(unit, file, Vec::new(), false);
        }
    }

    /// Gives `file` its module path and follows the modules it declares.
    fn link(&mut self, unit: usize, file: usize, module: Vec<String>, test: bool) {
        if self.files[file].module.is_some() {
            return;
        }
        self.files[file].module = Some((unit, module.clone()));
        self.files[file].test |= test;
        let dir = child_dir(&self.files[file].path, module.is_empty());
        let mut found = Vec::new();
        declared_modules(&self.files[file].ast.items, &dir, &module, test, &mut found);
        for (path, child, child_test) in found {
            if let Some(i) = self.index_of(&path) {
                self.link(unit, i, child, child_test);
            }
        }
    }
}

/// `mod name;` declarations in `items` (and in inline modules, whose
/// children live one folder deeper), as (file, module path, test).
fn declared_modules(
    items: &[syn::Item],
    dir: &str,
    module: &[String],
    test: bool,
    out: &mut Vec<(String, Vec<String>, bool)>,
) {
    for item in items {
        let syn::Item::Mod(m) = item else { continue };
        let name = m.ident.to_string();
        let mut child = module.to_vec();
        child.push(name.clone());
        let child_test = test || is_cfg_test(&m.attrs);
        match &m.content {
            Some((_, inner)) => {
                declared_modules(inner, &format!("{dir}/{name}"), &child, child_test, out)
            }
            None => {
                for path in [format!("{dir}/{name}.rs"), format!("{dir}/{name}/mod.rs")] {
                    out.push((path, child.clone(), child_test));
                }
            }
        }
    }
}

/// The folder a file's `mod name;` children live in.
fn child_dir(path: &str, root: bool) -> String {
    let p = Path::new(path);
    let parent = p.parent().map(|d| d.to_string_lossy().into_owned());
    let owns_folder = root || p.file_name().is_some_and(|n| n == "mod.rs");
    match (owns_folder, parent) {
        (true, Some(d)) => d,
        (true, None) => String::new(),
        (false, _) => path.trim_end_matches(".rs").to_string(),
    }
}

/// A crate root file: `src/lib.rs`, `src/main.rs` or `src/bin/*.rs`.
fn is_crate_root(path: &str) -> bool {
    let parts: Vec<&str> = path.split('/').collect();
    match parts.as_slice() {
        [.., "src", "lib.rs"] | [.., "src", "main.rs"] => true,
        [.., "src", "bin", name] => name.ends_with(".rs"),
        _ => false,
    }
}

/// Whether `attrs` hold `#[cfg(test)]`.
pub fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Ident>()
                .is_ok_and(|ident| ident == "test")
    })
}

/// Whether `attrs` hold `#[test]` (or a `#[…::test]` such as
/// `#[tokio::test]`).
pub fn is_test_fn(attrs: &[syn::Attribute]) -> bool {
    attrs
        .iter()
        .any(|a| a.path().segments.last().is_some_and(|s| s.ident == "test"))
}

/// Collects `.rs` files under `dir` as paths relative to `root`.
fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) -> std::io::Result<()> {
    let mut entries: BTreeMap<PathBuf, bool> = BTreeMap::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        entries.insert(entry.path(), entry.file_type()?.is_dir());
    }
    for (path, is_dir) in entries {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        let name = name.unwrap_or_default();
        if is_dir {
            if !SKIPPED_DIRS.contains(&name.as_str()) && !name.starts_with('.') {
                walk(root, &path, out)?;
            }
        } else if name.ends_with(".rs") {
            let rel = path.strip_prefix(root).unwrap_or(&path);
            out.push(rel.to_string_lossy().replace('\\', "/"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modules_are_found_by_their_declarations() {
        let tree = Tree::from_sources(&[
            ("a/src/lib.rs", "mod x; pub mod y; #[cfg(test)] mod t;"),
            ("a/src/x.rs", "mod inner;"),
            ("a/src/x/inner.rs", ""),
            ("a/src/y/mod.rs", "mod z;"),
            ("a/src/y/z.rs", ""),
            ("a/src/t.rs", ""),
            ("a/src/orphan.rs", ""),
        ]);
        let module = |p: &str| tree.files[tree.index_of(p).unwrap()].module.clone();
        assert_eq!(module("a/src/x/inner.rs").unwrap().1, ["x", "inner"]);
        assert_eq!(module("a/src/y/z.rs").unwrap().1, ["y", "z"]);
        assert_eq!(module("a/src/orphan.rs"), None);
        assert!(tree.files[tree.index_of("a/src/t.rs").unwrap()].test);
        assert!(!tree.files[tree.index_of("a/src/x.rs").unwrap()].test);
        assert_eq!(tree.units.len(), 1);
    }
}
