//! The fuzz harness of the workspace's peer-bytes decoders, shared by the `fuzz_decoders`
//! tests of sideway, stride-perf and the examples (each includes this file with `#[path]`).
//!
//! Why proptest and not cargo-fuzz: cargo-fuzz needs a nightly toolchain and libFuzzer, which
//! the CI machines and the SoftRoCE guest do not have. proptest runs on stable under
//! `cargo test`, is deterministic with a fixed seed (a failure reproduces on every machine),
//! catches a decoder's panic as a failed case and shrinks the input to a minimal one. What it
//! lacks against libFuzzer, coverage guidance, the inputs make up for in part: besides
//! arbitrary bytes, most cases are valid encodings with a few bytes flipped, inserted,
//! deleted, cut off or swapped for edge values (`+`, huge numbers, NUL, ESC, non-UTF-8).
//!
//! Each target first replays its corpus, `tests/fuzz-corpus/<target>/` of its crate: one
//! input per file, the seeds and every input that ever failed. Then come the random cases: a
//! few hundred in a plain `cargo test`; with `FUZZ_SECONDS=N`, as many as fit in N seconds.
//! A failing random case's minimal input is written under the target directory, to be added
//! to the corpus with the fix.

#![allow(dead_code, unreachable_pub)]

use std::fmt::Debug;
use std::fs;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::{Config, RngAlgorithm, TestError, TestRng, TestRunner};

/// Random cases per target in a plain `cargo test`.
const DEFAULT_CASES: u32 = 256;
/// Random cases per round of a timed run (`FUZZ_SECONDS`); each round has its own seed.
const ROUND_CASES: u32 = 2048;
/// The variable that turns a plain run into a timed one: seconds per target.
pub const SECONDS_ENV: &str = "FUZZ_SECONDS";
/// The longest input the random cases make from scratch.
const MAX_RANDOM_LEN: usize = 256;

/// The corpus directory of `target` in the crate at `manifest_dir`.
pub fn corpus_dir(manifest_dir: &str, target: &str) -> PathBuf {
    Path::new(manifest_dir)
        .join("tests/fuzz-corpus")
        .join(target)
}

/// The corpus of a target: every file in `dir`, by name.
pub fn corpus(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<_> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("the fuzz corpus {} cannot be read: {e}", dir.display()))
        .map(|entry| {
            let path = entry.expect("a corpus entry").path();
            let name = path
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
            let bytes =
                fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
            (name, bytes)
        })
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "the fuzz corpus {} is empty",
        dir.display()
    );
    files
}

/// The bytes as a Rust byte-string literal, for messages.
pub fn show(bytes: &[u8]) -> String {
    format!("b\"{}\"", bytes.escape_ascii())
}

/// One edit of an input: which kind, where (taken modulo the length), and a byte.
type Edit = (u8, usize, u8);

/// Bytes worth trying in place of any other: the ends of ranges, signs, separators, NUL,
/// the escape character, a C1 control, the first bytes of multi-byte UTF-8, digits.
const EDGE_BYTES: &[u8] = &[
    0, 1, 0x7f, 0x80, 0xff, b'+', b'-', b':', b'\n', b'\r', 0x1b, 0x9b, 0xc2, 0xe2, 0xf0, b'0',
    b'9', b'f', b'F', b'g', b' ', b'"', b'\\', b'{', b'}', b'[', b']', b'.', b'e',
];

/// Tokens worth putting where a number was: overflows of every width, signs, exponents.
const EDGE_NUMBERS: &[&str] = &[
    "0",
    "-1",
    "+1",
    "+fff",
    "255",
    "256",
    "65535",
    "65536",
    "4294967295",
    "4294967296",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775809",
    "1e309",
    "-1e309",
    "1.5",
    "0x10",
    "NaN",
    "null",
    "ffffffffffffffffffffffffffffffff",
];

/// `input` with `edits` applied in order.
pub fn mutate(input: &[u8], edits: &[Edit]) -> Vec<u8> {
    let mut out = input.to_vec();
    for &(kind, at, byte) in edits {
        let len = out.len();
        let at_in = |n: usize| if n == 0 { 0 } else { at % n };
        match kind % 9 {
            0 if len > 0 => out[at_in(len)] ^= 1 << (byte % 8),
            1 if len > 0 => out[at_in(len)] = EDGE_BYTES[usize::from(byte) % EDGE_BYTES.len()],
            2 => out.insert(at_in(len + 1), byte),
            3 if len > 0 => {
                out.remove(at_in(len));
            }
            4 => out.truncate(at_in(len + 1)),
            5 if len > 0 => {
                // Repeat a piece: a field twice, a frame twice.
                let start = at_in(len);
                let end = (start + usize::from(byte) + 1).min(len);
                let piece = out[start..end].to_vec();
                out.splice(start..start, piece);
            }
            6 => {
                // A run of digits becomes an edge number.
                let token = EDGE_NUMBERS[usize::from(byte) % EDGE_NUMBERS.len()].as_bytes();
                let digits: Vec<usize> = (0..len).filter(|&i| out[i].is_ascii_digit()).collect();
                if let Some(&start) = digits.get(at_in(digits.len())) {
                    let end = (start..len)
                        .find(|&i| !out[i].is_ascii_hexdigit())
                        .unwrap_or(len);
                    out.splice(start..end, token.iter().copied());
                }
            }
            7 if len > 0 => out[at_in(len)] = byte,
            _ => out.push(byte),
        }
    }
    out
}

/// Inputs for a decoder: arbitrary bytes, and `seeds` (valid encodings and the corpus) with
/// a few edits; a quarter of the seeds are tried as they are.
pub fn inputs(seeds: Vec<Vec<u8>>) -> BoxedStrategy<Vec<u8>> {
    assert!(!seeds.is_empty(), "no seeds");
    let edit = (any::<u8>(), any::<usize>(), any::<u8>());
    prop_oneof![
        1 => prop::collection::vec(any::<u8>(), 0..=MAX_RANDOM_LEN),
        1 => select(seeds.clone()),
        6 => (select(seeds), prop::collection::vec(edit, 1..8))
            .prop_map(|(seed, edits)| mutate(&seed, &edits)),
    ]
    .boxed()
}

/// How many seconds each target runs, when a timed run is asked for.
fn seconds() -> Option<u64> {
    let text = std::env::var(SECONDS_ENV).ok()?;
    Some(
        text.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{SECONDS_ENV}={text:?} is not a number of seconds")),
    )
}

/// A fixed seed per target and round, so that a run is the same on every machine.
fn seed(target: &str, round: u64) -> [u8; 32] {
    // FNV-1a over the name, then the round: no dependency, and stable across Rust versions.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in target.bytes().chain(round.to_le_bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    let mut out = [0u8; 32];
    for (i, chunk) in out.chunks_exact_mut(8).enumerate() {
        let word = h.rotate_left(u32::try_from(i * 17).unwrap_or(0)) ^ (i as u64);
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    out
}

/// Runs `check` on random values of `strategy`: [`DEFAULT_CASES`] of them, or, when `timed`
/// and `FUZZ_SECONDS` is set, rounds of [`ROUND_CASES`] until that many seconds have passed.
/// A failure (an `Err`, or a panic) panics with the minimal failing value; `save` writes it
/// where it can be copied into the corpus, and says where.
pub fn run<S>(
    target: &str,
    timed: bool,
    strategy: S,
    check: impl Fn(S::Value) -> Result<(), TestCaseError>,
    save: impl Fn(&S::Value) -> String,
) where
    S: Strategy,
    S::Value: Debug,
{
    let limit = seconds().filter(|_| timed).map(Duration::from_secs);
    let started = Instant::now();
    let mut cases = 0u64;
    for round in 0.. {
        let config = Config {
            cases: if limit.is_some() {
                ROUND_CASES
            } else {
                DEFAULT_CASES
            },
            failure_persistence: None,
            ..Config::default()
        };
        let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed(target, round));
        let mut runner = TestRunner::new_with_rng(config.clone(), rng);
        match runner.run(&strategy, &check) {
            Ok(()) => {}
            Err(TestError::Fail(reason, value)) => {
                let saved = save(&value);
                panic!("fuzz target {target}: {reason}\nminimal failing input: {value:?}\n{saved}");
            }
            Err(TestError::Abort(reason)) => panic!("fuzz target {target} gave up: {reason}"),
        }
        cases += u64::from(config.cases);
        match limit {
            Some(limit) if started.elapsed() < limit => {}
            _ => break,
        }
    }
    println!(
        "fuzz target {target}: {cases} random cases in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// Replays `target`'s corpus through `check`, then runs it on [`inputs`] made from the
/// corpus and `valid` (valid encodings); see [`run`].
pub fn fuzz_bytes(
    manifest_dir: &str,
    target: &str,
    valid: Vec<Vec<u8>>,
    check: impl Fn(&[u8]) -> Result<(), TestCaseError>,
) {
    fuzz_bytes_with(manifest_dir, target, valid, true, check);
}

/// [`fuzz_bytes`] for a target whose cases are costly (a TCP connection each): the corpus,
/// then [`DEFAULT_CASES`] random cases even in a timed run, when `timed` is false.
pub fn fuzz_bytes_with(
    manifest_dir: &str,
    target: &str,
    valid: Vec<Vec<u8>>,
    timed: bool,
    check: impl Fn(&[u8]) -> Result<(), TestCaseError>,
) {
    let dir = corpus_dir(manifest_dir, target);
    let corpus = corpus(&dir);
    for (name, bytes) in &corpus {
        match catch_unwind(AssertUnwindSafe(|| check(bytes))) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!(
                "fuzz target {target}: corpus input {}: {e}\ninput: {}",
                dir.join(name).display(),
                show(bytes)
            ),
            Err(_) => panic!(
                "fuzz target {target}: corpus input {} panicked (message above)\ninput: {}",
                dir.join(name).display(),
                show(bytes)
            ),
        }
    }
    let mut seeds = valid;
    seeds.extend(corpus.into_iter().map(|(_, bytes)| bytes));
    run(
        target,
        timed,
        inputs(seeds),
        |bytes| check(&bytes),
        |bytes| save_failure(target, &dir, bytes),
    );
}

/// Writes a failing input under the target directory; says where, and where it belongs.
fn save_failure(target: &str, corpus: &Path, bytes: &[u8]) -> String {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("fuzz-failures")
        .join(target);
    let name = format!("crash-{:016x}", u64::from_le_bytes(seed_of(bytes)));
    let path = dir.join(&name);
    match fs::create_dir_all(&dir).and_then(|()| fs::write(&path, bytes)) {
        Ok(()) => format!(
            "as bytes: {}\nwritten to {}: fix the decoder and copy the file into {}",
            show(bytes),
            path.display(),
            corpus.display()
        ),
        Err(e) => format!(
            "as bytes: {}\n(could not write it to {}: {e}); add it to {}",
            show(bytes),
            path.display(),
            corpus.display()
        ),
    }
}

/// Eight bytes that name an input: its FNV-1a hash.
fn seed_of(bytes: &[u8]) -> [u8; 8] {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h.to_le_bytes()
}

/// Runs a property of structured values (a round trip) on [`DEFAULT_CASES`] of them, timed
/// run or not (the byte targets get the time): see [`run`]; a failure shows the value, which
/// has no file form.
pub fn fuzz_values<S>(
    target: &str,
    strategy: S,
    check: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S: Strategy,
    S::Value: Debug,
{
    run(target, false, strategy, check, |_| {
        "add a case for it to the round-trip test".to_owned()
    });
}

/// True when `text` holds nothing that drives a terminal or reorders a line: no control
/// character but the line break, no C1 control, no bidirectional-text control.
pub fn harmless(text: &str) -> bool {
    !text.chars().any(|c| {
        (c.is_control() && c != '\n')
            || ('\u{80}'..='\u{9f}').contains(&c)
            || sideway::peer_text::is_bidi_control(c)
    })
}

/// Chunk sizes for feeding `bytes` to a stream decoder: the same for the same input,
/// different across inputs, from 1 byte up to 64.
pub fn chunk_sizes(bytes: &[u8]) -> impl Iterator<Item = usize> {
    let mut state = u64::from_le_bytes(seed_of(bytes)) | 1;
    std::iter::repeat_with(move || {
        // xorshift64
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        1 + (state % 64) as usize
    })
}
