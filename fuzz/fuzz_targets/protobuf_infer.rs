//! `cargo +nightly fuzz run protobuf_infer`: [`ember_fuzz::checks::protobuf_infer`] says what it drives and the
//! property it asserts.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ember_fuzz::checks::protobuf_infer(data);
});
