//! `sheaf`: mounts local images itself and runs `sheaf-full`, the whole
//! tool, for everything else (why: `sheaf_front`'s crate documentation); it links
//! nothing of `sheaf_cli`.

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(code) = sheaf_front::front::try_mount(&args) {
        std::process::exit(code);
    }
    let err = sheaf_front::front::hand_over(&args);
    eprintln!("sheaf: error: {err}");
    std::process::exit(127);
}
