//! `cargo +nightly fuzz run npz`: [`ember_fuzz::checks::npz`] says what it drives and the
//! property it asserts.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ember_fuzz::checks::npz(data);
});
