//! The holder process of the fault scenarios (see [`faults::holder`]).

#[tokio::main(flavor = "current_thread")]
async fn main() {
    faults::holder::holder_main(std::env::args().skip(1).collect()).await
}
