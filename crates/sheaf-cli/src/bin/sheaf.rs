//! `sheaf`: mounts local images itself and runs `sheaf-full`, the whole
//! tool, for everything else (why: `sheaf_cli`'s crate documentation).

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(code) = sheaf_cli::front::try_mount(&args) {
        std::process::exit(code);
    }
    let err = sheaf_cli::front::hand_over(&args);
    eprintln!("sheaf: error: {err}");
    std::process::exit(127);
}
