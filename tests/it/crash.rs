//! Crash safety of saves, measured: a child process saving over a checkpoint is killed at
//! random moments and the checkpoint must then be exactly the old one or the new one; readers
//! in one process keep their values while another process replaces the files; sharded saves
//! commit through their index and clean up after themselves.
//!
//! The child processes are this test binary run again on `child_saves` alone, told what to
//! save where by environment variables.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use nnx::{Archive, Error, SaveOptions, Tensor};

use crate::util::scratch;

/// Environment variable naming the checkpoint the child saves (`a` or `b`).
const CHECKPOINT_VAR: &str = "NNX_CRASH_CHECKPOINT";
/// Environment variable naming the layout the child saves in.
const LAYOUT_VAR: &str = "NNX_CRASH_LAYOUT";
/// Environment variable holding the target path.
const TARGET_VAR: &str = "NNX_CRASH_TARGET";
/// Printed by the child once the checkpoint is built, right before the save starts.
const READY: &str = "nnx-crash-child: saving";
/// Printed by the child once the save has returned.
const SAVED: &str = "nnx-crash-child: saved";

/// Entries of 256 KiB: a multiple of the 16 KiB page, so page-aligned saves place them on pages.
const ENTRY_SHAPE: [usize; 2] = [256, 256];
/// The shard limit of the sharded layout: four entries per shard.
const SHARD_BYTES: u64 = 1 << 20;
/// Kills per layout.
const KILLS: usize = 100;

/// How the checkpoint is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    /// One file.
    Single,
    /// One page-aligned file.
    Aligned,
    /// A folder with shards and `model.safetensors.index.json`.
    Sharded,
}

impl Layout {
    const ALL: [Layout; 3] = [Layout::Single, Layout::Aligned, Layout::Sharded];

    fn name(self) -> &'static str {
        match self {
            Layout::Single => "single",
            Layout::Aligned => "aligned",
            Layout::Sharded => "sharded",
        }
    }

    fn parse(name: &str) -> Layout {
        Layout::ALL
            .into_iter()
            .find(|layout| layout.name() == name)
            .unwrap_or_else(|| panic!("{LAYOUT_VAR} must be single, aligned or sharded, not `{name}`"))
    }

    /// Where the checkpoint lives in `dir`: the file, or the folder of the sharded layout.
    fn target(self, dir: &Path) -> PathBuf {
        match self {
            Layout::Single | Layout::Aligned => dir.join("model.safetensors"),
            Layout::Sharded => dir.join("sharded"),
        }
    }

    /// Saves `archive` at `target` in this layout.
    fn save(self, archive: &Archive, target: &Path) {
        let result = match self {
            Layout::Single => archive.save(target),
            Layout::Aligned => archive.save_with(target, &SaveOptions { page_align: true, ..SaveOptions::default() }),
            Layout::Sharded => {
                std::fs::create_dir_all(target).expect("the checkpoint folder can be created");
                let options = SaveOptions { max_shard_bytes: Some(SHARD_BYTES), ..SaveOptions::default() };
                archive.save_with(target.join("model.safetensors"), &options)
            }
        };
        result.unwrap_or_else(|error| panic!("saving the {} checkpoint failed: {error}", self.name()));
    }
}

/// One of the two checkpoints saved over each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Which {
    A,
    B,
}

impl Which {
    fn name(self) -> &'static str {
        match self {
            Which::A => "a",
            Which::B => "b",
        }
    }

    fn other(self) -> Which {
        match self {
            Which::A => Which::B,
            Which::B => Which::A,
        }
    }

    /// The entries: A has 12 (3 shards), B has 14 (4 shards), with some names in common and
    /// different values everywhere.
    fn entries(self) -> Vec<(String, Vec<f32>)> {
        let (count, seed, first) = match self {
            Which::A => (12, 0x9e37_79b9_7f4a_7c15, 0),
            Which::B => (14, 0xd1b5_4a32_d192_ed03, 4),
        };
        let mut rng = XorShift(seed);
        let len = ENTRY_SHAPE.iter().product();
        (first..first + count)
            .map(|at| (format!("layers.{at}.weight"), (0..len).map(|_| rng.unit()).collect()))
            .collect()
    }

    fn archive(self) -> Archive {
        let mut archive = Archive::new();
        for (name, values) in self.entries() {
            archive.insert(name, Tensor::from_vec(values, &ENTRY_SHAPE).expect("values fill the shape"));
        }
        archive
    }
}

/// xorshift64: a seeded, dependency-free source of test values and kill delays.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A value in [0, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// A value in [0, `limit`).
    fn below(&mut self, limit: u64) -> u64 {
        self.next() % limit.max(1)
    }
}

/// The child: saves checkpoint `NNX_CRASH_CHECKPOINT` in layout `NNX_CRASH_LAYOUT` at
/// `NNX_CRASH_TARGET`, saying when the save starts and when it has returned. Without those
/// variables (a plain `--ignored` run) there is nothing to save.
#[test]
#[ignore = "a child process of the crash tests, run by them with its settings"]
fn child_saves() {
    let Some(target) = std::env::var_os(TARGET_VAR) else {
        eprintln!("{TARGET_VAR} is not set: this test is run by the crash tests as a child process");
        return;
    };
    let layout = Layout::parse(&std::env::var(LAYOUT_VAR).unwrap_or_default());
    let which = match std::env::var(CHECKPOINT_VAR).as_deref() {
        Ok("a") => Which::A,
        Ok("b") => Which::B,
        other => panic!("{CHECKPOINT_VAR} must be a or b, not {other:?}"),
    };
    let archive = which.archive();
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{READY}").and_then(|()| stdout.flush()).expect("the parent reads the child's output");
    layout.save(&archive, Path::new(&target));
    writeln!(stdout, "{SAVED}").and_then(|()| stdout.flush()).expect("the parent reads the child's output");
}

/// This test binary. On Linux `/proc/self/exe`, which still runs the same program when the
/// file has been rebuilt (replaced) since this process started.
fn test_binary() -> PathBuf {
    let this_process = Path::new("/proc/self/exe");
    if this_process.exists() {
        return this_process.to_path_buf();
    }
    std::env::current_exe().expect("the test binary knows its path")
}

/// A child process, killed and reaped when dropped, so that a failing test leaves none behind.
struct ChildGuard {
    child: Child,
    lines: BufReader<ChildStdout>,
}

impl ChildGuard {
    /// Starts [`child_saves`] saving `which` in `layout` at `target`.
    fn spawn(layout: Layout, which: Which, target: &Path) -> ChildGuard {
        let mut child = Command::new(test_binary())
            .args(["crash::child_saves", "--ignored", "--exact", "--nocapture", "--test-threads=1"])
            .env(LAYOUT_VAR, layout.name())
            .env(CHECKPOINT_VAR, which.name())
            .env(TARGET_VAR, target)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the test binary starts as a child");
        let stdout = child.stdout.take().expect("the child's stdout is piped");
        ChildGuard { child, lines: BufReader::new(stdout) }
    }

    /// Reads the child's output up to the line holding `marker`.
    fn wait_for(&mut self, marker: &str) {
        let mut line = String::new();
        loop {
            line.clear();
            let read = self.lines.read_line(&mut line).expect("the child's output can be read");
            assert!(read > 0, "the child ended before printing `{marker}`");
            if line.contains(marker) {
                return;
            }
        }
    }

    /// Kills the child (SIGKILL) and waits until it is gone.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for the child to end by itself and checks that it succeeded.
    fn finish(mut self) {
        let status = self.child.wait().expect("the child can be waited for");
        assert!(status.success(), "the child failed: {status}");
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Opens the checkpoint at `target` and says which of A and B it is, panicking unless it is
/// exactly one of them (names in order and every value) and read from no temporary file.
fn identify(target: &Path, a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)]) -> Which {
    let archive = Archive::open(target)
        .unwrap_or_else(|error| panic!("the checkpoint at `{}` cannot be opened: {error}", target.display()));
    let names: Vec<&str> = archive.names().collect();
    let which = if names.iter().copied().eq(a.iter().map(|(name, _)| name.as_str())) {
        Which::A
    } else if names.iter().copied().eq(b.iter().map(|(name, _)| name.as_str())) {
        Which::B
    } else {
        panic!("the checkpoint is neither A nor B: its names are {names:?}");
    };
    let expected = if which == Which::A { a } else { b };
    for (name, values) in expected {
        let info = archive.info(name).unwrap_or_else(|error| panic!("`{name}` cannot be read: {error}"));
        let file = info.location.expect("entries of an opened checkpoint come from files").path;
        let file_name = file.file_name().and_then(|name| name.to_str()).unwrap_or_default();
        assert!(!file_name.starts_with('.') && !file_name.contains(".tmp-"), "`{name}` was read from `{file_name}`");
        let found = archive.try_get(name).unwrap_or_else(|error| panic!("`{name}` cannot be read: {error}"));
        assert!(
            found.to_vec::<f32>().unwrap() == *values,
            "the checkpoint has the names of {which:?} but `{name}` does not hold its values (a mix of saves)"
        );
    }
    which
}

/// What the kills of one layout saw.
#[derive(Debug)]
struct Tally {
    layout: Layout,
    kills: usize,
    old: usize,
    new: usize,
    /// Kills that left a partly written file behind (a temporary file, or for shards also
    /// complete shards that no index names yet): they cut a save in the middle.
    cut: usize,
    save: Duration,
    elapsed: Duration,
}

/// Saves over a checkpoint in `layout` [`KILLS`] times, killing the saving child after a
/// delay drawn uniformly from zero to a little past the longest save seen in calibration, and
/// checks after each kill that the checkpoint is the complete old or the complete new one.
fn kill_saves(layout: Layout, rng: &mut XorShift, a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)]) -> Tally {
    let started = Instant::now();
    let dir = scratch();
    let target = layout.target(dir.path());
    layout.save(&Which::A.archive(), &target);
    let mut current = Which::A;

    // Calibration: complete saves, timed from the child's start signal to its end signal.
    let mut save = Duration::ZERO;
    for _ in 0..3 {
        let mut child = ChildGuard::spawn(layout, current.other(), &target);
        child.wait_for(READY);
        let begun = Instant::now();
        child.wait_for(SAVED);
        save = save.max(begun.elapsed());
        child.finish();
        current = current.other();
        assert_eq!(identify(&target, a, b), current, "a complete save leaves the new checkpoint");
    }

    let window = save.as_micros() as u64 * 5 / 4;
    let folder = if layout == Layout::Sharded { target.clone() } else { dir.path().to_path_buf() };
    let (mut old, mut new, mut cut) = (0, 0, 0);
    for _ in 0..KILLS {
        let before = leftovers(&folder);
        let mut child = ChildGuard::spawn(layout, current.other(), &target);
        child.wait_for(READY);
        std::thread::sleep(Duration::from_micros(rng.below(window)));
        child.kill();
        if !leftovers(&folder).is_subset(&before) {
            cut += 1;
        }
        let seen = identify(&target, a, b);
        if seen == current {
            old += 1;
        } else {
            new += 1;
        }
        current = seen;
    }
    Tally { layout, kills: KILLS, old, new, cut, save, elapsed: started.elapsed() }
}

/// The files in `dir` that are not part of the checkpoint there: temporary files, and shard
/// files that the index does not name.
fn leftovers(dir: &Path) -> BTreeSet<String> {
    let indexed =
        if dir.join("model.safetensors.index.json").is_file() { indexed_shards(dir) } else { BTreeSet::new() };
    listing(dir)
        .into_iter()
        .filter(|name| name.contains(".tmp-") || (name.contains("-of-") && !indexed.contains(name)))
        .collect()
}

#[test]
fn killed_saves_leave_the_old_or_the_new_checkpoint() {
    let (a, b) = (Which::A.entries(), Which::B.entries());
    let mut rng = XorShift(0x5eed_c4a5_4e55_0f0f);
    let tallies: Vec<Tally> = Layout::ALL.into_iter().map(|layout| kill_saves(layout, &mut rng, &a, &b)).collect();
    for tally in &tallies {
        println!(
            "{}: {} kills, old seen {}, new seen {}, {} cut a save mid-write; a save took {:.1} ms, the layout {:.1} s",
            tally.layout.name(),
            tally.kills,
            tally.old,
            tally.new,
            tally.cut,
            tally.save.as_secs_f64() * 1e3,
            tally.elapsed.as_secs_f64()
        );
        assert_eq!(tally.old + tally.new, tally.kills);
    }
    // Delays span the whole save, so both outcomes occur; a layout that only ever showed one of
    // them would mean the kills missed the save.
    for tally in &tallies {
        assert!(tally.old > 0 && tally.new > 0, "kills must land before and after the commit: {tally:?}");
    }
}

/// The file names in `dir`, sorted.
fn listing(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .expect("the folder can be listed")
        .map(|item| item.expect("the folder can be listed").file_name().to_string_lossy().into_owned())
        .collect()
}

/// The shard file names the index in `dir` names.
fn indexed_shards(dir: &Path) -> BTreeSet<String> {
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("model.safetensors.index.json")).expect("the index exists"))
            .expect("the index is JSON");
    let map = index["weight_map"].as_object().expect("the index has a weight map");
    map.values().map(|shard| shard.as_str().expect("shard names are strings").to_string()).collect()
}

#[test]
fn readers_keep_their_values_while_another_process_replaces_the_files() {
    let (a, b) = (Which::A.entries(), Which::B.entries());
    for layout in [Layout::Single, Layout::Sharded] {
        let dir = scratch();
        let target = layout.target(dir.path());
        layout.save(&Which::A.archive(), &target);
        let archive = Archive::open(&target).unwrap();
        let held: Vec<(String, Tensor)> =
            archive.names().map(|name| (name.to_string(), archive.get(name).unwrap())).collect();
        assert!(held.iter().all(|(_, tensor)| tensor.is_mapped()), "{layout:?}: tensors are views of the files");

        ChildGuard::spawn(layout, Which::B, &target).finish();

        for ((name, tensor), (expected_name, values)) in held.iter().zip(&a) {
            assert_eq!(name, expected_name);
            assert!(tensor.is_mapped());
            assert_eq!(&tensor.to_vec::<f32>().unwrap(), values, "{layout:?}: `{name}` keeps the old values");
            // The archive opened before the save has its files mapped and reads the old values.
            assert_eq!(&archive.get(name).unwrap().to_vec::<f32>().unwrap(), values);
        }
        assert_eq!(identify(&target, &a, &b), Which::B, "{layout:?}: a fresh open sees the new checkpoint");
        if layout == Layout::Sharded {
            let mut expected = indexed_shards(&target);
            expected.insert("model.safetensors.index.json".into());
            assert_eq!(listing(&target), expected, "the old shards are gone once the new index is in place");
        }
    }
}

#[test]
fn sharded_saves_write_beside_the_shards_in_use_and_remove_them_after() {
    let dir = scratch();
    let path = dir.path().join("model.safetensors");
    let options = SaveOptions { max_shard_bytes: Some(SHARD_BYTES), ..SaveOptions::default() };
    let standard = |count: usize| -> BTreeSet<String> {
        (1..=count).map(|at| format!("model-{at:05}-of-{count:05}.safetensors")).collect()
    };

    // B (4 shards) first, then A (3 shards): the standard names of A are free.
    Which::B.archive().save_with(&path, &options).unwrap();
    assert_eq!(indexed_shards(dir.path()), standard(4));
    Which::A.archive().save_with(&path, &options).unwrap();
    assert_eq!(indexed_shards(dir.path()), standard(3), "the larger save's shards are not reused");
    let files = listing(dir.path());
    assert!(files.iter().all(|name| !name.contains("-of-00004")), "the larger save's shards are removed: {files:?}");

    // A again: its standard names are in use, so a variant is written and the old ones removed.
    Which::A.archive().save_with(&path, &options).unwrap();
    let variant: BTreeSet<String> = (1..=3).map(|at| format!("model-{at:05}-of-00003-v2.safetensors")).collect();
    assert_eq!(indexed_shards(dir.path()), variant);
    let mut expected = variant.clone();
    expected.insert("model.safetensors.index.json".into());
    assert_eq!(listing(dir.path()), expected);

    // And back to the standard names on the next save.
    Which::A.archive().save_with(&path, &options).unwrap();
    assert_eq!(indexed_shards(dir.path()), standard(3));

    // Leftovers of an interrupted save (shards of the stem no index names, temporary files)
    // are removed by the next save; files of other stems are not touched.
    for leftover in [
        "model-00001-of-00007.safetensors",
        "model-00002-of-00003-v2.safetensors",
        ".model-00003-of-00007.safetensors.tmp-1-2",
        ".model.safetensors.index.json.tmp-1-3",
        "other-00001-of-00002.safetensors",
    ] {
        std::fs::write(dir.path().join(leftover), b"partial").unwrap();
    }
    Which::B.archive().save_with(&path, &options).unwrap();
    let mut expected = indexed_shards(dir.path());
    expected.insert("model.safetensors.index.json".into());
    expected.insert("other-00001-of-00002.safetensors".into());
    assert_eq!(listing(dir.path()), expected);
}

#[test]
fn folders_never_take_temporary_files_or_shards_without_an_index_for_a_checkpoint() {
    let dir = scratch();
    let (a, b) = (Which::A.entries(), Which::B.entries());
    // A sharded save interrupted before its first index: shards and a temporary file, no index.
    let options = SaveOptions { max_shard_bytes: Some(SHARD_BYTES), ..SaveOptions::default() };
    Which::A.archive().save_with(dir.path().join("model.safetensors"), &options).unwrap();
    std::fs::remove_file(dir.path().join("model.safetensors.index.json")).unwrap();
    std::fs::write(dir.path().join(".model.safetensors.index.json.tmp-1-0"), b"{\"weight_map\": {}}").unwrap();
    let error = Archive::open(dir.path()).unwrap_err();
    assert!(matches!(error, Error::ShardWithoutIndex { .. }), "{error}");
    let message = error.to_string();
    assert!(message.contains("model-00001-of-00003.safetensors") && message.contains("save the checkpoint again"));

    // Once saved, the index is the checkpoint; the leftovers are ignored, then removed.
    std::fs::write(dir.path().join(".model-00002-of-00004.safetensors.tmp-1-1"), b"partial").unwrap();
    Which::B.archive().save_with(dir.path().join("model.safetensors"), &options).unwrap();
    assert_eq!(identify(dir.path(), &a, &b), Which::B);
    assert!(listing(dir.path()).iter().all(|name| !name.starts_with('.')), "temporary files are removed");

    // A single file with a leftover temporary file beside it: the file is the checkpoint.
    let single = scratch();
    Which::A.archive().save(single.path().join("model.safetensors")).unwrap();
    std::fs::write(single.path().join(".model.safetensors.tmp-1-0"), b"partial").unwrap();
    assert_eq!(identify(single.path(), &a, &b), Which::A);
    assert_eq!(identify(&single.path().join("model.safetensors"), &a, &b), Which::A);
}
