//! Generates trespass-grpc's service code from proto/echo.proto, with protox (a protobuf
//! compiler in Rust, so no protoc is needed on the build host) and tonic's code generator.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/echo.proto");
    let descriptors = protox::compile(["proto/echo.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
