//! `cargo +nightly fuzz run resp`: [`ember_fuzz::checks::resp`] says what it drives and the
//! property it asserts.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ember_fuzz::checks::resp(data);
});
