//! `pollbox load` without the rest of the binary, for working on the generator alone:
//! `cargo run --release -p pollbox-load --example load -- --url http://127.0.0.1:8080`.
//! It is also the wiring the `pollbox` binary needs: run, print the table, exit 1 past
//! `--max-error-rate`.

use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    load: pollbox_load::LoadArgs,
}

fn main() {
    let cli = Cli::parse();
    match pollbox_load::run(&cli.load) {
        Ok(report) => {
            let _ = pollbox_load::print_report(&report, &mut std::io::stdout().lock());
            if !report.passed() {
                std::process::exit(1);
            }
        }
        Err(e) => {
            eprintln!("pollbox load: {e}");
            std::process::exit(2);
        }
    }
}
