//! Compiles the `.proto` files with the `protoc` that `protoc-bin-vendored` ships, so a fresh
//! machine builds without installing protobuf.

use std::{env, error::Error, path::PathBuf};

fn main() -> Result<(), Box<dyn Error>> {
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    let well_known = protoc_bin_vendored::include_path()?;

    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc);
    // A shared list's body is relayed as it arrives, without a copy per message.
    config.bytes([".kubedispatch.v1.ListChunk"]);

    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("kubedispatch_v1_descriptor.bin"))
        .compile_with_config(
            config,
            &[
                PathBuf::from("kubedispatch/v1/dispatcher.proto"),
                PathBuf::from("kubedispatch/v1/loadbalancer.proto"),
                PathBuf::from("kubedispatch/v1/peer.proto"),
                PathBuf::from("kubedispatch/v1/operator.proto"),
            ],
            &[PathBuf::from("."), well_known],
        )?;
    Ok(())
}
