//! Per-file checks: functions over [`FUNCTION_LINES_MAX`] lines, files over
//! [`FILE_LINES_MAX`] lines of non-test code, and constants named with the
//! qualifier first (`MAX_BATCH`; the house style puts qualifiers and units
//! last: `BATCH_MAX`, `SIZE_BYTES`). Test code (`#[test]` functions and
//! `#[cfg(test)]` items) is not checked.

use syn::spanned::Spanned;
use syn::visit::{self, Visit};

use crate::tree::{is_cfg_test, is_test_fn, SourceFile};

/// The longest function allowed, counting from its `fn` line to its
/// closing brace.
pub const FUNCTION_LINES_MAX: usize = 80;
/// The longest file allowed, not counting `#[cfg(test)]` items.
pub const FILE_LINES_MAX: usize = 800;

/// Qualifiers that belong at the end of a constant's name.
const QUALIFIERS: [&str; 2] = ["MAX", "MIN"];

/// A function and its length in lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LongFunction {
    pub name: String,
    pub lines: usize,
}

/// What [`measure`] found in one file.
#[derive(Debug, Default)]
pub struct Measured {
    /// Every function longer than [`FUNCTION_LINES_MAX`].
    pub long_functions: Vec<LongFunction>,
    /// Lines of the file outside `#[cfg(test)]` items.
    pub code_lines: usize,
    /// Constants and statics whose name starts with a qualifier.
    pub qualifier_first: Vec<String>,
}

/// Measures one non-test file.
pub fn measure(file: &SourceFile) -> Measured {
    let mut v = Visitor {
        scope: Vec::new(),
        out: Measured::default(),
        test_lines: 0,
    };
    v.visit_file(&file.ast);
    let total = file.text.lines().count();
    v.out.code_lines = total.saturating_sub(v.test_lines);
    v.out
}

struct Visitor {
    /// Names of the enclosing impl type / function, joined by `::`.
    scope: Vec<String>,
    out: Measured,
    test_lines: usize,
}

impl Visitor {
    /// Records a function of `lines` lines; visits its body via `walk`.
    fn function(&mut self, ident: &syn::Ident, first: usize, last: usize) {
        let lines = last + 1 - first;
        if lines > FUNCTION_LINES_MAX {
            let mut name = self.scope.join("::");
            if !name.is_empty() {
                name.push_str("::");
            }
            name.push_str(&ident.to_string());
            self.out.long_functions.push(LongFunction { name, lines });
        }
    }

    fn constant(&mut self, ident: &syn::Ident) {
        let name = ident.to_string();
        let first = name.split('_').next().unwrap_or("");
        if name.contains('_') && QUALIFIERS.contains(&first) {
            self.out.qualifier_first.push(name);
        }
    }

    /// Skips a test item, counting its lines as test lines.
    fn skip_test(&mut self, attrs: &[syn::Attribute], span: proc_macro2::Span) -> bool {
        if !is_cfg_test(attrs) && !is_test_fn(attrs) {
            return false;
        }
        let first = attrs
            .first()
            .map_or(span.start().line, |a| a.span().start().line);
        self.test_lines += span.end().line + 1 - first;
        true
    }
}

/// Line of a block's closing brace.
fn last_line(block: &syn::Block) -> usize {
    block.brace_token.span.close().end().line
}

impl<'ast> Visit<'ast> for Visitor {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs = match item {
            syn::Item::Mod(m) => &m.attrs,
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Use(u) => &u.attrs,
            syn::Item::Const(c) => &c.attrs,
            syn::Item::Static(s) => &s.attrs,
            syn::Item::Struct(s) => &s.attrs,
            syn::Item::Enum(e) => &e.attrs,
            syn::Item::Trait(t) => &t.attrs,
            syn::Item::Macro(m) => &m.attrs,
            _ => return visit::visit_item(self, item),
        };
        if !self.skip_test(attrs, item.span()) {
            visit::visit_item(self, item);
        }
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.function(
            &f.sig.ident,
            f.sig.fn_token.span.start().line,
            last_line(&f.block),
        );
        self.scope.push(f.sig.ident.to_string());
        visit::visit_item_fn(self, f);
        self.scope.pop();
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        let name = match &*i.self_ty {
            syn::Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
            _ => None,
        };
        self.scope.push(name.unwrap_or_else(|| "impl".to_string()));
        visit::visit_item_impl(self, i);
        self.scope.pop();
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if self.skip_test(&f.attrs, f.span()) {
            return;
        }
        self.function(
            &f.sig.ident,
            f.sig.fn_token.span.start().line,
            last_line(&f.block),
        );
        self.scope.push(f.sig.ident.to_string());
        visit::visit_impl_item_fn(self, f);
        self.scope.pop();
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(block) = &f.default {
            self.function(
                &f.sig.ident,
                f.sig.fn_token.span.start().line,
                last_line(block),
            );
        }
        visit::visit_trait_item_fn(self, f);
    }

    fn visit_item_const(&mut self, c: &'ast syn::ItemConst) {
        self.constant(&c.ident);
        visit::visit_item_const(self, c);
    }

    fn visit_item_static(&mut self, s: &'ast syn::ItemStatic) {
        self.constant(&s.ident);
        visit::visit_item_static(self, s);
    }

    fn visit_impl_item_const(&mut self, c: &'ast syn::ImplItemConst) {
        self.constant(&c.ident);
        visit::visit_impl_item_const(self, c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::Tree;

    fn measured(text: &str) -> Measured {
        let tree = Tree::from_sources(&[("a/src/lib.rs", text)]);
        measure(&tree.files[0])
    }

    #[test]
    fn long_functions_are_found_and_test_code_is_not() {
        let body = "    let x = 1;\n".repeat(FUNCTION_LINES_MAX);
        let text = format!(
            "struct S;\nimpl S {{\n    fn long() {{\n{body}    }}\n    fn short() {{}}\n}}\n\
             #[cfg(test)]\nmod tests {{\n    fn also_long() {{\n{body}    }}\n}}\n"
        );
        let m = measured(&text);
        assert_eq!(
            m.long_functions,
            [LongFunction {
                name: "S::long".into(),
                lines: FUNCTION_LINES_MAX + 2
            }]
        );
        // struct, impl (3 + body + 2 lines): the test module is not counted.
        assert_eq!(m.code_lines, 1 + 1 + FUNCTION_LINES_MAX + 4);
    }

    #[test]
    fn qualifiers_go_last_in_constant_names() {
        let m =
            measured("const MAX_BATCH: u32 = 1;\nconst BATCH_MAX: u32 = 1;\nconst MAX: u8 = 0;");
        assert_eq!(m.qualifier_first, ["MAX_BATCH"]);
    }
}
