//! The protocol's messages, server and client, generated from `proto/` by `build.rs`, and the
//! codec they use. [`crate::grpc`] re-exports them as `grpc::pb`.

use std::marker::PhantomData;

use bytes::Bytes;
use tonic::Status;
use tonic::codec::{BufferSettings, DecodeBuf, Decoder, EncodeBuf, Encoder};

/// The messages, server and client generated from `proto/grpc_service.proto`.
#[allow(missing_docs, missing_debug_implementations, clippy::all)]
pub mod pb {
    tonic::include_proto!("inference");
}

/// The protobuf codec of the generated code: prost's, except that a message that does not decode
/// is the client's fault (INVALID_ARGUMENT), not the server's (tonic's INTERNAL).
#[derive(Debug)]
pub struct Codec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Codec(PhantomData)
    }
}

impl<T, U> tonic::codec::Codec for Codec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProtoEncoder<T>;
    type Decoder = ProtoDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProtoEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProtoDecoder(PhantomData)
    }
}

/// Encodes `T` with prost.
#[derive(Debug)]
pub struct ProtoEncoder<T>(PhantomData<T>);

impl<T: prost::Message> Encoder for ProtoEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        // `EncodeBuf` grows as needed, so encoding cannot run out of room.
        buf.reserve(item.encoded_len());
        item.encode(buf)
            .map_err(|e| Status::internal(format!("encoding the response: {e}")))
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}

/// Decodes `U` with prost; errors are INVALID_ARGUMENT.
#[derive(Debug)]
pub struct ProtoDecoder<U>(PhantomData<U>);

impl<U: prost::Message + Default> Decoder for ProtoDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf)
            .map(Some)
            .map_err(|e| Status::invalid_argument(format!("malformed protobuf message: {e}")))
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}

/// Raw little-endian bytes of `values` (for clients building `raw_input_contents`).
pub fn raw_bytes<T: Copy, const W: usize>(values: &[T], to_le: impl Fn(T) -> [u8; W]) -> Bytes {
    let mut b = bytes::BytesMut::with_capacity(values.len() * W);
    for &v in values {
        b.extend_from_slice(&to_le(v));
    }
    b.freeze()
}
