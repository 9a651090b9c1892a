//! The repository keeps its house style: every finding of the checks in
//! `ferrite_tidy` is excused by a line of `tidy/allow.txt`, and every line
//! of that list still excuses something (so the list only shrinks).

use std::path::Path;

#[test]
fn the_repository_keeps_the_house_style() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let problems = ferrite_tidy::check(&root).expect("the repository reads");
    assert!(
        problems.is_empty(),
        "tidy (see tidy/src/lib.rs for the rules; `cargo run -p ferrite-tidy` lists them):\n{}",
        problems.join("\n")
    );
}
