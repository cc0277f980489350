//! `cargo +nightly fuzz run safetensors`: [`ember_fuzz::checks::safetensors`] says what it drives and the
//! property it asserts.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ember_fuzz::checks::safetensors(data);
});
