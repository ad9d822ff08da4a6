//! The gRPC code in `src/rpc/generated/` is what tonic-prost-build makes from `proto/` today.
//!
//! Upstream etcd-client generates it in a build script that runs `protoc`; this fork checks it in
//! so that building needs nothing but Rust. This test regenerates it with `protox` (a protobuf
//! compiler written in Rust) and fails when the checked-in copy differs. After changing `proto/`
//! or upgrading tonic/prost, rewrite the copy with
//! `LOCKSMITH_REGENERATE_ETCD_PROTO=1 cargo test -p locksmith-etcd-client --test generated_code_is_current`.

use std::path::{Path, PathBuf};

/// The protos upstream's build script compiles (its `build.rs`, etcd-client 0.21.1).
/// Their imports (google.api, openapiv2 options) generate modules too, which nothing uses.
const PROTOS: [&str; 5] = [
    "etcd/api/authpb/auth.proto",
    "etcd/api/etcdserverpb/rpc.proto",
    "etcd/api/mvccpb/kv.proto",
    "etcd/server/etcdserver/api/v3election/v3electionpb/v3election.proto",
    "etcd/server/etcdserver/api/v3lock/v3lockpb/v3lock.proto",
];

/// The modules `src/rpc/pb.rs` includes, one per protobuf package.
const MODULES: [&str; 5] = [
    "authpb",
    "etcdserverpb",
    "mvccpb",
    "v3electionpb",
    "v3lockpb",
];

#[test]
fn generated_code_is_current() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let proto_dir = root.join("proto");
    let checked_in = root.join("src/rpc/generated");
    let fresh = std::env::temp_dir().join(format!("locksmith-etcd-gen-{}", std::process::id()));
    std::fs::create_dir_all(&fresh).unwrap();

    let descriptors = protox::compile(PROTOS, [&proto_dir]).expect("protox compiles the protos");
    tonic_prost_build::configure()
        // The same settings as upstream's build script without its `build-server` feature.
        .build_server(false)
        .out_dir(&fresh)
        .compile_fds(descriptors)
        .expect("tonic-prost-build generates the code");

    let regenerate = std::env::var_os("LOCKSMITH_REGENERATE_ETCD_PROTO").is_some();
    let mut stale = Vec::new();
    for module in MODULES {
        let name = format!("{module}.rs");
        let path: PathBuf = fresh.join(&name);
        let new = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        let target = checked_in.join(&name);
        if std::fs::read_to_string(&target).ok().as_deref() != Some(new.as_str()) {
            if regenerate {
                std::fs::write(&target, &new).unwrap();
            } else {
                stale.push(name);
            }
        }
    }
    std::fs::remove_dir_all(&fresh).ok();
    assert!(
        stale.is_empty(),
        "the checked-in gRPC code differs from what the protos generate: {stale:?}; run \
         LOCKSMITH_REGENERATE_ETCD_PROTO=1 cargo test -p locksmith-etcd-client --test generated_code_is_current"
    );
}
