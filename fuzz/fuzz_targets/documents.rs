//! Small documents other parties hand sheaf, and the text rules applied to
//! what it prints. The first byte picks what the rest is:
//! 0 — a repository's blob link (`BlobLink::parse`): a parsed link names
//!     only its own layer;
//! 1 — a mount request (`MountRequest::decode`): a parsed request encodes
//!     and decodes back to itself;
//! else — text redacted for display (`redact_text`): idempotent, and no
//!     `user:password@` survives.
//! Nothing may panic or hang.
#![no_main]
use libfuzzer_sys::fuzz_target;

fn run(data: &[u8]) {
    let Some((&kind, rest)) = data.split_first() else {
        return;
    };
    match kind {
        0 => {
            if let Ok(l) = sheaf_oci::BlobLink::parse(rest) {
                assert_eq!(l.layer, sheaf_oci::record::layer_name(&l.diff_id));
            }
        }
        1 => {
            if let Ok(r) = sheaf_mount::MountRequest::decode(rest) {
                let again = sheaf_mount::MountRequest::decode(&r.encode()).expect("round trip");
                assert_eq!(again, r);
            }
        }
        _ => {
            let text = String::from_utf8_lossy(rest);
            let once = sheaf_net::redact_text(&text);
            assert_eq!(sheaf_net::redact_text(&once), once, "not idempotent");
        }
    }
}

fuzz_target!(|data: &[u8]| run(data));
