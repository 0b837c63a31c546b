//! Generates the aggregators' gRPC messages and service from `proto/aggregator.proto` when the
//! `rpc` feature is on (protoc is a build dependency already: etcd-client compiles etcd's).

fn main() {
    println!("cargo:rerun-if-changed=proto/aggregator.proto");
    #[cfg(feature = "rpc")]
    if let Err(e) = tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_protos(&["proto/aggregator.proto"], &["proto"])
    {
        panic!(
            "compiling proto/aggregator.proto: {e} (is protoc installed? scripts/deps.sh build)"
        );
    }
}
