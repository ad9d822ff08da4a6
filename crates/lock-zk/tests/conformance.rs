fn main() -> std::process::ExitCode {
    conformance::run_tests(vec![])
}
