//! The binary's usage contract: its name and version, and the exit codes of bad invocations
//! (1, except 2 for `diff`, whose 1 means "different"). Being an integration test, it also makes
//! `cargo test --workspace` build the binary, which nnx's own integration tests run.

use std::process::Command;

/// Runs `nnx` with `args`: exit code, stdout and stderr.
fn nnx(args: &[&str]) -> (Option<i32>, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_nnx")).args(args).output().expect("the nnx binary runs");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn version_names_the_binary() {
    let (code, stdout, _) = nnx(&["--version"]);
    assert_eq!(code, Some(0));
    assert_eq!(stdout, format!("nnx {}\n", env!("CARGO_PKG_VERSION")));
}

#[test]
fn help_lists_every_command() {
    let (code, stdout, _) = nnx(&["--help"]);
    assert_eq!(code, Some(0));
    for command in ["inspect", "quantize", "dequantize", "convert", "diff", "download"] {
        assert!(stdout.contains(&format!("\n  {command} ")), "`{command}` missing from:\n{stdout}");
    }
}

#[test]
fn usage_errors_exit_1_and_diff_usage_errors_exit_2() {
    let (code, _, stderr) = nnx(&["bogus"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("unrecognized subcommand 'bogus'"), "{stderr}");
    let (code, _, stderr) = nnx(&["inspect"]);
    assert_eq!(code, Some(1), "{stderr}");
    let (code, _, stderr) = nnx(&["diff", "a.safetensors"]);
    assert_eq!(code, Some(2), "{stderr}");
    let (code, _, stderr) = nnx(&["diff", "a", "b", "--atol", "-1"]);
    assert_eq!(code, Some(2), "{stderr}");
}
