//! Generates the gRPC messages, server and client from `proto/grpc_service.proto` (and the `model_config.proto` it imports), parsed by
//! protox (pure Rust: no `protoc` needed).

fn main() -> Result<(), Box<dyn std::error::Error>> {
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
