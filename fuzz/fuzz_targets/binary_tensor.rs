//! `cargo +nightly fuzz run binary_tensor`: [`ember_fuzz::checks::binary_tensor`] says what it drives and the
//! property it asserts.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ember_fuzz::checks::binary_tensor(data);
});
