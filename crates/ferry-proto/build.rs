//! Compiles `proto/*.proto` with protox (pure Rust, so no system `protoc` is needed) and generates the
//! tonic client and server code.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(["broker.proto"], ["proto"])?;
    // Every message is encoded into a buffer reserved at its length (see `src/codec.rs`).
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .bytes(".ferry.v1")
        .codec_path("crate::codec::SizedCodec")
        .compile_fds(fds)?;
    Ok(())
}
