//! `cargo +nightly fuzz run pool_args`: [`ember_fuzz::checks::pool_args`] says what it drives and the
//! property it asserts.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ember_fuzz::checks::pool_args(data);
});
