//! Tells the tests whether `curl` is on the PATH, and generates the gRPC messages, server and client from `proto/grpc_service.proto` (and the `model_config.proto` it imports), parsed by
//! protox (pure Rust: no `protoc` needed).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The TLS tests also drive `curl` where it is on the PATH (a real client with its own TLS
    // stack); without it they check Rust's clients only.
    println!("cargo::rustc-check-cfg=cfg(ember_curl)");
    println!("cargo::rerun-if-env-changed=PATH");
    let path = std::env::var_os("PATH").unwrap_or_default();
    if std::env::split_paths(&path).any(|d| d.join("curl").is_file()) {
        println!("cargo::rustc-cfg=ember_curl");
    }
    let proto = "proto/grpc_service.proto";
    println!("cargo:rerun-if-changed=proto/model_config.proto");
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        // Tensor bytes as `bytes::Bytes`: slices of the received buffer, not copies.
        .bytes(".inference")
        // Protobuf decode errors become INVALID_ARGUMENT (tonic's own codec says INTERNAL).
        .codec_path("crate::proto::Codec")
        .compile_fds(fds)?;
    Ok(())
}
