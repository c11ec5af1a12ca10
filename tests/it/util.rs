//! Helpers shared by the integration tests: locating the fixtures and scratch folders.

use std::path::PathBuf;

/// The golden fixtures (`tests/fixtures` in the repository, or `NNX_FIXTURES`), or a panic
/// that says where they were looked for.
pub fn fixtures() -> PathBuf {
    let dir = std::env::var_os("NNX_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests").join("fixtures"));
    assert!(
        dir.join("README.md").is_file(),
        "fixtures not found at `{}`: they live in the repository's `tests/fixtures`, or set NNX_FIXTURES",
        dir.display()
    );
    dir
}

/// A fresh scratch folder, removed when dropped.
pub fn scratch() -> tempfile::TempDir {
    tempfile::tempdir().expect("a scratch folder can be created")
}

/// Where `scripts/setup.sh` installs what the tests compare against: `NNX_CACHE`, else
/// `~/.cache/nnx`.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("NNX_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache").join("nnx"))
}

/// The `nnx` binary: `NNX_BINARY` when set (another build, to measure what a fix changed), else
/// the one package `nnx-cli` builds beside the test binaries. It is a binary of another package,
/// so `cargo test --workspace` builds it and `cargo test -p nnx` does not.
pub fn nnx_binary() -> PathBuf {
    if let Some(binary) = std::env::var_os("NNX_BINARY") {
        return PathBuf::from(binary);
    }
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    let binary = deps.parent().unwrap().join(format!("nnx{}", std::env::consts::EXE_SUFFIX));
    assert!(
        binary.is_file(),
        "the nnx binary is not built at `{}`: build it with `cargo build -p nnx-cli` (or run the \
         tests with `cargo test --workspace`, which builds it; `cargo test -p nnx` does not)",
        binary.display()
    );
    binary
}

/// Runs the `nnx` binary with `args`: exit status (-1 when killed), stdout and stderr.
pub fn run_nnx<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> (i32, String, String) {
    let output = std::process::Command::new(nnx_binary()).args(args).output().expect("the nnx binary runs");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Runs `nnx` with `args`, which must succeed, and returns its stdout; a failure names the
/// arguments and shows stderr.
pub fn nnx_ok(args: &[&str]) -> String {
    let (code, out, err) = run_nnx(args);
    assert_eq!(code, 0, "nnx {args:?}: {err}");
    out
}

/// A path as the `&str` an argument list takes (scratch and fixture paths are UTF-8).
pub fn text(path: &std::path::Path) -> &str {
    path.to_str().expect("scratch and fixture paths are UTF-8")
}

/// The field `key` of a JSON reference file, deserialized as `T` (a panic names the key).
pub fn json_field<T: serde::de::DeserializeOwned>(value: &serde_json::Value, key: &str) -> T {
    serde_json::from_value(value[key].clone()).unwrap_or_else(|error| panic!("reference field `{key}`: {error}"))
}

/// The largest absolute difference between `ours` and `expected`, after checking that they
/// have the same length (a zip alone would silently compare a prefix).
pub fn max_abs_diff(ours: &[f32], expected: &[f32], what: &str) -> f32 {
    assert_eq!(ours.len(), expected.len(), "{what}: {} values, the reference has {}", ours.len(), expected.len());
    ours.iter().zip(expected).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max)
}

/// The example binary `name`, which `cargo test` builds beside the test binaries.
pub fn example_binary(name: &str) -> PathBuf {
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    let binary = deps.parent().unwrap().join("examples").join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        binary.is_file(),
        "the {name} example is not built at `{}`: run `cargo test` (it builds examples)",
        binary.display()
    );
    binary
}

/// What a bounded run of the `nnx` binary gave.
#[derive(Debug)]
pub struct Bounded {
    /// The exit code; `None` when a signal ended the process (an abort, or the timeout's kill).
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
    /// Whether the timeout killed it.
    pub timed_out: bool,
    /// The largest resident set the process reached, in bytes.
    pub peak_memory: u64,
}

impl Bounded {
    /// Asserts the outcome every hostile input must have: exit status 1, no panic and no abort,
    /// and exactly one `error:` line, which names `input` (a file, an entry or a URL).
    pub fn assert_refused(&self, input: &str) {
        assert!(!self.timed_out, "nnx ran past its timeout on `{input}`:\n{}", self.stderr);
        assert_eq!(self.code, Some(1), "nnx must exit 1 on `{input}`:\n{}", self.stderr);
        assert!(!self.stderr.contains("panicked"), "a panic on `{input}`:\n{}", self.stderr);
        assert!(!self.stderr.contains("memory allocation"), "an abort on `{input}`:\n{}", self.stderr);
        let errors: Vec<&str> = self.stderr.lines().filter(|line| line.starts_with("error:")).collect();
        assert_eq!(errors.len(), 1, "one `error:` line for `{input}`:\n{}", self.stderr);
        assert!(errors[0].contains(input), "the error names `{input}`: {}", errors[0]);
    }
}

/// Runs the `nnx` binary with `args` and `envs` under an address-space limit of `memory` bytes
/// (`RLIMIT_AS`, so that an input that makes nnx allocate more fails instead of swapping) and a
/// wall-clock `timeout`, after which it is killed; the binary is [`nnx_binary`].
#[cfg(unix)]
// The child is reaped by `wait4` below, not by `Child::wait`.
#[allow(clippy::zombie_processes)]
pub fn run_nnx_bounded<S: AsRef<std::ffi::OsStr>>(
    args: &[S],
    envs: &[(&str, &std::ffi::OsStr)],
    memory: u64,
    timeout: std::time::Duration,
) -> Bounded {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};

    let binary = nnx_binary();
    // The peak memory of a process forked from this one starts at this process's own resident
    // set, which the other tests inflate; GNU time, a small program that forks nnx from itself,
    // reports nnx's alone. Without it, the figure is an upper bound.
    let time = std::path::Path::new("/usr/bin/time");
    let report = tempfile::NamedTempFile::new().expect("a scratch file for the memory report");
    let mut command = if time.is_file() {
        let mut command = Command::new(time);
        command.arg("--format=%M").arg("--output").arg(report.path()).arg(&binary);
        command
    } else {
        Command::new(&binary)
    };
    // A group of its own, so that a timeout kills nnx and not only the program timing it.
    command.process_group(0);
    command.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (name, value) in envs {
        command.env(name, value);
    }
    // SAFETY: the closure runs in the child between fork and exec and only calls `setrlimit`,
    // which is async-signal-safe, on a value built before the fork.
    unsafe {
        command.pre_exec(move || {
            let limit = libc::rlimit { rlim_cur: memory as libc::rlim_t, rlim_max: memory as libc::rlim_t };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn().expect("the nnx binary runs");
    // Both pipes are drained on their own threads, so a chatty child never blocks on a full pipe.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut text);
            }
            String::from_utf8_lossy(&text).into_owned()
        })
    };
    let stdout = drain(child.stdout.take().map(|pipe| Box::new(pipe) as Box<dyn Read + Send>));
    let stderr = drain(child.stderr.take().map(|pipe| Box::new(pipe) as Box<dyn Read + Send>));
    let deadline = std::time::Instant::now() + timeout;
    let pid = child.id() as libc::pid_t;
    let mut timed_out = false;
    let (status, usage) = loop {
        let mut status = 0;
        // SAFETY: `rusage` is plain data that `wait4` fills; the pid is this test's own child,
        // which nothing else waits for.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: both pointers are to live locals of the right types.
        let done = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if done == pid {
            break (status, usage);
        }
        assert!(done == 0, "waiting for nnx failed: {}", std::io::Error::last_os_error());
        if !timed_out && std::time::Instant::now() >= deadline {
            timed_out = true;
            // SAFETY: a plain system call on the group this test created for its child.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    // GNU time exits with 128 plus the signal that ended nnx; nnx itself exits with 0, 1 or 2.
    let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)).filter(|code| *code <= 128);
    // The report's last line is the peak in KiB (a line before it may say how nnx ended).
    let reported = std::fs::read_to_string(report.path()).ok().and_then(|text| {
        text.lines().filter_map(|line| line.trim().parse::<u64>().ok()).next_back().map(|kib| kib * 1024)
    });
    Bounded {
        code,
        peak_memory: reported.unwrap_or_else(|| u64::try_from(usage.ru_maxrss).unwrap_or(0) * 1024),
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
        timed_out,
    }
}

/// A JSON array of rows of numbers (reference logits), row after row, as f32.
pub fn floats(value: &serde_json::Value) -> Vec<f32> {
    value
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|row| row.as_array().unwrap())
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

/// A JSON array of token ids.
pub fn ids(value: &serde_json::Value) -> Vec<u32> {
    value.as_array().unwrap().iter().map(|id| id.as_u64().unwrap() as u32).collect()
}

/// Asserts that `archive` holds exactly the entries of `reference`, bit for bit.
pub fn assert_same(archive: &nnx::Archive, reference: &nnx::Archive, what: &str) {
    let mut names: Vec<&str> = archive.names().collect();
    let mut expected: Vec<&str> = reference.names().collect();
    names.sort_unstable();
    expected.sort_unstable();
    assert_eq!(names, expected, "{what}: entry names");
    for name in expected {
        let (got, want) = (archive.try_get(name).unwrap(), reference.try_get(name).unwrap());
        assert_eq!((got.dtype(), got.shape()), (want.dtype(), want.shape()), "{what}: `{name}`");
        assert_eq!(got.to_bytes().unwrap(), want.to_bytes().unwrap(), "{what}: `{name}` differs");
    }
}
