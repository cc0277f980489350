//! `cargo +nightly fuzz run json_lines`: [`ember_fuzz::checks::json_lines`] says what it drives and the
//! property it asserts.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ember_fuzz::checks::json_lines(data);
});
