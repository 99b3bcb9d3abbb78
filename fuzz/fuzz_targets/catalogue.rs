#![no_main]
use libfuzzer_sys::fuzz_target;

// A pool location's pools.json is fetched from a web server: untrusted. An
// accepted catalogue must never name a source outside its location.
fuzz_target!(|data: &[u8]| {
    if let Ok(offers) = sheaf_pool::parse_catalogue(data) {
        for o in offers {
            assert!(!o.source.starts_with('/'));
            assert!(o.source.split('/').all(|c| c != ".." && !c.is_empty()));
            assert!(sheaf_pool::parse_name(&o.pool).is_ok());
        }
    }
});
