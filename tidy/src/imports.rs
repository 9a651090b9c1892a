//! Import circles between the files of a crate. A file imports another when
//! one of its `use` items or paths (`crate::…`, `super::…`, `self::…`, or a
//! child module's name) names an item defined in the other. Re-exports are
//! followed to the file that defines the item, so `crate::Engine` counts
//! as an import of the file that defines `Engine`, while the `pub use` in
//! `lib.rs` counts as `lib.rs` importing that file. A `mod` declaration is
//! not an import. Test code is left out. The circles are the strongly
//! connected components of more than one file (Tarjan's algorithm).

use std::collections::{BTreeMap, BTreeSet};

use syn::visit::{self, Visit};

use crate::tree::{is_cfg_test, is_test_fn, Tree};

/// A module path inside one crate root, e.g. `["store", "log"]`.
type ModulePath = Vec<String>;

/// What one module declares: its file, the names it defines, the names it
/// brings in by `use` (to absolute paths) and its glob imports.
#[derive(Debug, Default)]
struct Module {
    file: usize,
    defined: BTreeSet<String>,
    used: BTreeMap<String, ModulePath>,
    globs: Vec<ModulePath>,
}

/// The modules of one crate root.
#[derive(Debug, Default)]
struct Crate {
    modules: BTreeMap<ModulePath, Module>,
}

/// Every circle, as the sorted file paths of each component.
pub fn circles(tree: &Tree) -> Vec<Vec<String>> {
    let mut out: Vec<Vec<String>> = explained(tree).into_iter().map(|(c, _)| c).collect();
    out.sort();
    out
}

/// Every circle with its imports: `a.rs -> b.rs (crate::b::Thing)`, one
/// line per import between two of its files.
pub fn explained(tree: &Tree) -> Vec<(Vec<String>, Vec<String>)> {
    let mut out = Vec::new();
    for unit in 0..tree.units.len() {
        let krate = collect(tree, unit);
        let edges = edges(tree, &krate);
        let graph = edges
            .iter()
            .map(|(&a, to)| (a, to.keys().copied().collect()))
            .collect();
        for component in strongly_connected(&graph) {
            if component.len() < 2 {
                continue;
            }
            let name = |i: usize| tree.files[i].path.clone();
            let mut files: Vec<String> = component.iter().map(|&i| name(i)).collect();
            files.sort();
            let mut why = Vec::new();
            for &a in &component {
                for (b, via) in &edges[&a] {
                    if component.contains(b) {
                        why.push(format!("{} -> {} ({})", name(a), name(*b), via.join("::")));
                    }
                }
            }
            why.sort();
            out.push((files, why));
        }
    }
    out
}

/// Collects the declarations of every module of `unit`.
fn collect(tree: &Tree, unit: usize) -> Crate {
    let mut krate = Crate::default();
    // Every module first, so a `use child::…` resolves whichever file
    // declares `child` comes first.
    for (i, f) in tree.files.iter().enumerate() {
        if let Some((u, path)) = &f.module {
            if *u == unit && !f.test {
                name_modules(&mut krate, i, path, &f.ast.items);
            }
        }
    }
    for (i, f) in tree.files.iter().enumerate() {
        if let Some((u, path)) = &f.module {
            if *u == unit && !f.test {
                declare(&mut krate, i, path, &f.ast.items);
            }
        }
    }
    krate
}

/// Enters module `path` and the inline modules in `items`, empty.
fn name_modules(krate: &mut Crate, file: usize, path: &ModulePath, items: &[syn::Item]) {
    krate.modules.insert(
        path.clone(),
        Module {
            file,
            ..Module::default()
        },
    );
    for item in items {
        if let syn::Item::Mod(m) = item {
            if let (Some((_, inner)), false) = (&m.content, item_is_test(item)) {
                let mut child = path.clone();
                child.push(m.ident.to_string());
                name_modules(krate, file, &child, inner);
            }
        }
    }
}

/// Records what `items` (the body of module `path`, in file `file`) define
/// and import; inline modules become modules of their own.
fn declare(krate: &mut Crate, file: usize, path: &ModulePath, items: &[syn::Item]) {
    let mut module = Module {
        file,
        ..Module::default()
    };
    for item in items {
        if item_is_test(item) {
            continue;
        }
        if let syn::Item::Use(u) = item {
            let mut leaves = Vec::new();
            use_leaves(&u.tree, Vec::new(), &mut leaves);
            for (segments, name) in leaves {
                let Some(abs) = absolute(krate, path, &segments) else {
                    continue;
                };
                match name {
                    Some(name) => {
                        module.used.insert(name, abs);
                    }
                    None => module.globs.push(abs),
                }
            }
        } else if let Some(name) = defined_name(item) {
            module.defined.insert(name);
        }
        if let syn::Item::Mod(m) = item {
            if let Some((_, inner)) = &m.content {
                let mut child = path.clone();
                child.push(m.ident.to_string());
                declare(krate, file, &child, inner);
            }
        }
    }
    krate.modules.insert(path.clone(), module);
}

/// A `use` tree's leaves: (path, the name it binds, or None for a glob).
fn use_leaves(t: &syn::UseTree, prefix: Vec<String>, out: &mut Vec<(Vec<String>, Option<String>)>) {
    let with = |s: String| {
        let mut p = prefix.clone();
        p.push(s);
        p
    };
    match t {
        syn::UseTree::Path(p) => use_leaves(&p.tree, with(p.ident.to_string()), out),
        syn::UseTree::Name(n) if n.ident == "self" => {
            let name = prefix.last().cloned();
            out.push((prefix.clone(), name));
        }
        syn::UseTree::Name(n) => out.push((with(n.ident.to_string()), Some(n.ident.to_string()))),
        syn::UseTree::Rename(r) => {
            out.push((with(r.ident.to_string()), Some(r.rename.to_string())))
        }
        syn::UseTree::Glob(_) => out.push((prefix.clone(), None)),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                use_leaves(t, prefix.clone(), out);
            }
        }
    }
}

/// The name an item defines in its module's namespace, if any.
fn defined_name(item: &syn::Item) -> Option<String> {
    let ident = match item {
        syn::Item::Const(i) => &i.ident,
        syn::Item::Enum(i) => &i.ident,
        syn::Item::Fn(i) => &i.sig.ident,
        syn::Item::Static(i) => &i.ident,
        syn::Item::Struct(i) => &i.ident,
        syn::Item::Trait(i) => &i.ident,
        syn::Item::Type(i) => &i.ident,
        syn::Item::Union(i) => &i.ident,
        syn::Item::Macro(m) => m.ident.as_ref()?,
        _ => return None,
    };
    Some(ident.to_string())
}

fn item_is_test(item: &syn::Item) -> bool {
    match item {
        syn::Item::Mod(m) => is_cfg_test(&m.attrs),
        syn::Item::Use(u) => is_cfg_test(&u.attrs),
        syn::Item::Fn(f) => is_cfg_test(&f.attrs) || is_test_fn(&f.attrs),
        syn::Item::Impl(i) => is_cfg_test(&i.attrs),
        _ => false,
    }
}

/// `segments`, written in module `here`, as an absolute path in the crate,
/// or None when it names something outside the crate. A path starting with
/// a name `here` imports or defines is resolved by the later lookup, so it
/// is kept relative to `here` only when `here` has a child of that name.
fn absolute(krate: &Crate, here: &ModulePath, segments: &[String]) -> Option<ModulePath> {
    let (first, rest) = segments.split_first()?;
    match first.as_str() {
        "crate" => Some(rest.to_vec()),
        "self" => Some([here.as_slice(), rest].concat()),
        "super" => {
            let mut base = here.clone();
            base.pop()?;
            let mut rest = rest;
            while rest.first().is_some_and(|s| s == "super") {
                base.pop()?;
                rest = &rest[1..];
            }
            Some([base.as_slice(), rest].concat())
        }
        _ => {
            let mut child = here.clone();
            child.push(first.clone());
            if krate.modules.contains_key(&child) {
                Some([here.as_slice(), segments].concat())
            } else {
                None
            }
        }
    }
}

/// The file that defines what the absolute path `path` names, following
/// re-exports for at most `depth` steps.
fn defining_file(krate: &Crate, path: &[String], depth: usize) -> Option<usize> {
    let k = (0..=path.len())
        .rev()
        .find(|&k| krate.modules.contains_key(&path[..k]))?;
    let module = &krate.modules[&path[..k]];
    let Some(name) = path.get(k) else {
        return Some(module.file);
    };
    if depth == 0 || module.defined.contains(name) {
        return Some(module.file);
    }
    if let Some(target) = module.used.get(name) {
        let followed = [target.as_slice(), &path[k + 1..]].concat();
        return defining_file(krate, &followed, depth - 1).or(Some(module.file));
    }
    if let [glob] = module.globs.as_slice() {
        let followed = [glob.as_slice(), &path[k..]].concat();
        return defining_file(krate, &followed, depth - 1).or(Some(module.file));
    }
    Some(module.file)
}

/// For each file of the crate, the files it imports, each with the first
/// path (absolute in the crate) that imports it.
fn edges(tree: &Tree, krate: &Crate) -> BTreeMap<usize, BTreeMap<usize, ModulePath>> {
    let mut out: BTreeMap<usize, BTreeMap<usize, ModulePath>> = BTreeMap::new();
    for (path, module) in &krate.modules {
        out.entry(module.file).or_default();
        let mut refs = Vec::new();
        for target in module.used.values().chain(&module.globs) {
            refs.push(target.clone());
        }
        if module_is_file_root(tree, module.file, path) {
            let mut v = PathVisitor {
                krate,
                scope: path.clone(),
                refs: &mut refs,
            };
            v.visit_file(&tree.files[module.file].ast);
        }
        for target in refs {
            if let Some(file) = defining_file(krate, &target, 8) {
                if file != module.file {
                    out.entry(module.file)
                        .or_default()
                        .entry(file)
                        .or_insert(target);
                }
            }
        }
    }
    out
}

/// Whether `path` is the module a file starts (not an inline module in it).
fn module_is_file_root(tree: &Tree, file: usize, path: &ModulePath) -> bool {
    tree.files[file]
        .module
        .as_ref()
        .is_some_and(|(_, p)| p == path)
}

/// Collects the paths a file's code names, each made absolute in the
/// module (inline modules included) it appears in.
struct PathVisitor<'a> {
    krate: &'a Crate,
    scope: ModulePath,
    refs: &'a mut Vec<ModulePath>,
}

impl<'ast> Visit<'ast> for PathVisitor<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if item_is_test(item) || matches!(item, syn::Item::Use(_)) {
            return;
        }
        if let syn::Item::Mod(m) = item {
            self.scope.push(m.ident.to_string());
            visit::visit_item(self, item);
            self.scope.pop();
            return;
        }
        visit::visit_item(self, item);
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_test_fn(&f.attrs) && !is_cfg_test(&f.attrs) {
            visit::visit_impl_item_fn(self, f);
        }
    }

    /// `pub(crate)`, `pub(super)`: a visibility is not an import.
    fn visit_vis_restricted(&mut self, _: &'ast syn::VisRestricted) {}

    fn visit_path(&mut self, p: &'ast syn::Path) {
        if p.leading_colon.is_none() {
            let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
            if let Some(abs) = absolute(self.krate, &self.scope, &segments) {
                self.refs.push(abs);
            }
        }
        visit::visit_path(self, p);
    }
}

/// Tarjan's strongly connected components of `edges`.
fn strongly_connected(edges: &BTreeMap<usize, BTreeSet<usize>>) -> Vec<Vec<usize>> {
    struct State<'a> {
        edges: &'a BTreeMap<usize, BTreeSet<usize>>,
        index: BTreeMap<usize, usize>,
        low: BTreeMap<usize, usize>,
        stack: Vec<usize>,
        on_stack: BTreeSet<usize>,
        out: Vec<Vec<usize>>,
    }
    fn connect(s: &mut State<'_>, v: usize) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        for &w in s.edges.get(&v).into_iter().flatten() {
            if !s.index.contains_key(&w) {
                connect(s, w);
                let low = s.low[&v].min(s.low[&w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(&w) {
                let low = s.low[&v].min(s.index[&w]);
                s.low.insert(v, low);
            }
        }
        if s.low[&v] == s.index[&v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(&w);
                component.push(w);
                if w == v {
                    break;
                }
            }
            s.out.push(component);
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for &v in edges.keys() {
        if !s.index.contains_key(&v) {
            connect(&mut s, v);
        }
    }
    s.out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn circles_of(sources: &[(&str, &str)]) -> Vec<Vec<String>> {
        circles(&Tree::from_sources(sources))
    }

    #[test]
    fn files_that_import_each_other_are_a_circle() {
        let found = circles_of(&[
            ("a/src/lib.rs", "mod x; mod y; mod z;"),
            ("a/src/x.rs", "use crate::y::Y; pub struct X;"),
            (
                "a/src/y.rs",
                "pub struct Y; fn f() { let _ = super::x::X; }",
            ),
            ("a/src/z.rs", "use crate::x::X;"),
        ]);
        assert_eq!(found, [["a/src/x.rs", "a/src/y.rs"]]);
    }

    #[test]
    fn re_exports_lead_to_the_defining_file() {
        // y uses `crate::X`, which lib.rs re-exports from x: y imports x,
        // lib.rs imports x, and nothing circles.
        let found = circles_of(&[
            ("a/src/lib.rs", "mod x; mod y; pub use x::X; pub use y::*;"),
            ("a/src/x.rs", "pub struct X;"),
            ("a/src/y.rs", "use crate::X; pub fn g() {}"),
        ]);
        assert!(found.is_empty(), "{found:?}");
        // A parent whose own item a child uses, while it re-exports the
        // child: that is a circle.
        let found = circles_of(&[
            ("a/src/lib.rs", "mod x; pub use x::X; pub struct Config;"),
            ("a/src/x.rs", "use crate::Config; pub struct X;"),
        ]);
        assert_eq!(found, [["a/src/lib.rs", "a/src/x.rs"]]);
    }

    #[test]
    fn test_code_does_not_count() {
        let found = circles_of(&[
            ("a/src/lib.rs", "mod x; mod y;"),
            ("a/src/x.rs", "use crate::y::Y; pub struct X;"),
            (
                "a/src/y.rs",
                "pub struct Y;\n#[cfg(test)]\nmod tests { use crate::x::X; }",
            ),
        ]);
        assert!(found.is_empty(), "{found:?}");
    }
}
