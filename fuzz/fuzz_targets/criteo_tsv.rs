//! `cargo +nightly fuzz run criteo_tsv`: [`ember_fuzz::checks::criteo_tsv`] says what it drives and the
//! property it asserts.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ember_fuzz::checks::criteo_tsv(data);
});
