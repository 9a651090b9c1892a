//! `ferrite`: the command-line client. Every subcommand lives in its own
//! module under `cli/`; this file only parses and dispatches.

use clap::{Parser, Subcommand};

/// mimalloc instead of glibc's malloc: the request path allocates small, short-lived
/// buffers on every xstream (decoded keys, batch futures), where glibc spent about a
/// tenth of the engine's CPU in mdtest-hard-write (perf).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod cli;

/// Ferrite: a thread-per-core storage engine. With no `--engine`, commands
/// that need an engine start one embedded in this process on a temp directory.
#[derive(Parser, Debug)]
#[command(name = "ferrite", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the IO500-style benchmark (Ferrite's main job).
    Io500(cli::io500::Args),
    /// Benchmarks: xstream, store, kv, jobs.
    #[command(subcommand)]
    Bench(cli::bench::BenchCommand),
    /// Measure a block device: IOPS, bandwidth and latency percentiles.
    Bdevperf(cli::bdevperf::Args),
    /// Store a value under a key.
    Put(cli::kv::PutArgs),
    /// Print the value of a key.
    Get(cli::kv::GetArgs),
    /// Delete a key.
    Del(cli::kv::DelArgs),
    /// List keys.
    Ls(cli::kv::LsArgs),
    /// Show the engine's targets, regions and counters.
    Stat(cli::kv::StatArgs),
    /// Mount the file namespace with FUSE.
    Mount(cli::mount::MountArgs),
    /// Unmount a FUSE mount made by `ferrite mount`.
    Umount(cli::mount::UmountArgs),
    /// Submit, list, watch and cancel DAG jobs.
    #[command(subcommand)]
    Job(cli::job::JobCommand),
    /// Offer this process's execution streams to an engine's resource manager.
    Worker(cli::job::WorkerArgs),
}

fn main() -> std::process::ExitCode {
    ferrite_xstream::tune_allocator();
    let cli = Cli::parse();
    cli::init_tracing();
    let result = match cli.command {
        Command::Io500(a) => cli::io500::run(a),
        Command::Bench(b) => cli::bench::run(b),
        Command::Bdevperf(a) => cli::bdevperf::run(a),
        Command::Put(a) => cli::kv::put(a),
        Command::Get(a) => cli::kv::get(a),
        Command::Del(a) => cli::kv::del(a),
        Command::Ls(a) => cli::kv::ls(a),
        Command::Stat(a) => cli::kv::stat(a),
        Command::Mount(a) => cli::mount::mount(a),
        Command::Umount(a) => cli::mount::umount(a),
        Command::Job(j) => cli::job::run(j),
        Command::Worker(a) => cli::job::worker(a),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferrite: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
