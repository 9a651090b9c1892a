//! `ferrite-engine`: the server.
fn main() {
    eprintln!("ferrite-engine: not built yet");
    std::process::exit(1);
}
