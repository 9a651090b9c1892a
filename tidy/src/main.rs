//! `cargo run -p ferrite-tidy [ROOT]`: prints every finding of the house
//! style checks in `tidy/allow.txt`'s format, then what differs from that
//! list. Exits 1 when the test (`cargo test -p ferrite-tidy`) would fail.
//! `--why` prints, for each import circle, the imports that close it.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args: Vec<_> = std::env::args_os().skip(1).collect();
    let why = args
        .iter()
        .position(|a| a == "--why")
        .map(|i| args.remove(i));
    let root = args
        .first()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".."));
    let tree = match ferrite_tidy::tree::Tree::load(&root) {
        Ok(tree) => tree,
        Err(e) => {
            eprintln!("tidy: cannot read {}: {e}", root.display());
            return ExitCode::from(2);
        }
    };
    if why.is_some() {
        for (files, imports) in ferrite_tidy::imports::explained(&tree) {
            println!("cycle of {} files:", files.len());
            for line in imports {
                println!("    {line}");
            }
        }
        return ExitCode::SUCCESS;
    }
    let found = ferrite_tidy::findings(&tree);
    for line in &found {
        println!("{line}");
    }
    let allow = std::fs::read_to_string(root.join("tidy/allow.txt")).unwrap_or_default();
    let problems = ferrite_tidy::compare(&found, &allow);
    for p in &problems {
        eprintln!("tidy: {p}");
    }
    if problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
