//! `cargo +nightly fuzz run kserve_json`: [`ember_fuzz::checks::kserve_json`] says what it drives and the
//! property it asserts.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ember_fuzz::checks::kserve_json(data);
});
