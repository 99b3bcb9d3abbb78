//! `sheaf-full`: the whole `sheaf` command ([`sheaf_cli::run`]) on the
//! process's arguments and streams, its code the exit status.

fn main() {
    let code = sheaf_cli::run(std::env::args_os(), &mut sheaf_cli::Io::process());
    std::process::exit(code)
}
