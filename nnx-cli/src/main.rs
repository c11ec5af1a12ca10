//! The `nnx` binary: the command line of [`nnx_cli`].

fn main() -> std::process::ExitCode {
    nnx_cli::main()
}
