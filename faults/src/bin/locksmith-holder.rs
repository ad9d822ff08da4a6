//! The holder process of the fault scenarios (see [`conformance::holder`]).

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = std::env::args().skip(1).collect();
    conformance::holder::holder_main(args, |url| async move { locksmith::connect(&url).await })
        .await
}
