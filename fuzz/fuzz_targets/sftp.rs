#![no_main]
use libfuzzer_sys::fuzz_target;

// Replies of an SFTP server (ssh:// images): untrusted bytes.
fuzz_target!(|data: &[u8]| sheaf_net::sftp::fuzz_replies(data));
