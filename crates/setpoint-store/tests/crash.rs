//! Crash safety: SIGKILL a process that is writing as fast as it can, then check that every
//! acknowledged write survived, nothing is torn, and revisions keep increasing.
//!
//! The child is this test binary re-executed with `--ignored --exact crash_child` and the store
//! directory in an environment variable. It prints one line per acknowledged write, only after
//! the write returned Ok. The parent kills it after a random number of acknowledgements (and
//! sometimes before it even opened the store), reopens the directory and checks the history.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use setpoint_store::conformance::collect_events;
use setpoint_store::embedded::{EmbeddedOptions, EmbeddedStore};
use setpoint_store::{Event, Precondition, Revision, Store, StoreError};

const CHILD_DIR_ENV: &str = "SETPOINT_STORE_CRASH_CHILD_DIR";
const ROUNDS: usize = 20;
const CHILD_TASKS: usize = 8;
const KEYS_PER_TASK: usize = 16;
/// The child stops by itself after this long, in case the parent is gone.
const CHILD_LIFETIME: Duration = Duration::from_secs(30);
const ROUND_DEADLINE: Duration = Duration::from_secs(30);

fn fnv1a(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in data {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// A value of random length whose last 8 bytes are the checksum of the rest.
fn checksummed_value(rng: &mut impl Rng) -> Bytes {
    let len = rng.random_range(16..600);
    let mut v: Vec<u8> = (0..len).map(|_| rng.random()).collect();
    let sum = fnv1a(&v);
    v.extend_from_slice(&sum.to_be_bytes());
    Bytes::from(v)
}

fn checksum_ok(v: &[u8]) -> bool {
    v.len() >= 8 && fnv1a(&v[..v.len() - 8]).to_be_bytes() == v[v.len() - 8..]
}

#[test]
#[ignore = "only runs as the child process of crash_recovery"]
fn crash_child() {
    let dir = std::env::var(CHILD_DIR_ENV).expect("crash_child only runs under crash_recovery");
    println!("CHILD STARTED");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let store =
            Arc::new(EmbeddedStore::open(Path::new(&dir), EmbeddedOptions::default()).unwrap());
        println!("CHILD OPENED");
        let start = Instant::now();
        let tasks: Vec<_> = (0..CHILD_TASKS)
            .map(|task| {
                let store = store.clone();
                tokio::spawn(async move {
                    let mut rng = StdRng::from_rng(&mut rand::rng());
                    while start.elapsed() < CHILD_LIFETIME {
                        let key = format!("/crash/{task}/{}", rng.random_range(0..KEYS_PER_TASK));
                        let line = if rng.random_ratio(1, 7) {
                            match store.delete(&key, Precondition::None).await {
                                Ok((_, rev)) => format!("DEL {key} {rev}\n"),
                                Err(StoreError::NotFound { .. }) => continue,
                                Err(e) => panic!("delete: {e}"),
                            }
                        } else {
                            let value = checksummed_value(&mut rng);
                            let hash = fnv1a(&value);
                            let kv = store.put(&key, value, Precondition::None).await.unwrap();
                            format!("PUT {key} {} {hash:016x}\n", kv.mod_revision)
                        };
                        // Printed only once acknowledged; one write call per line.
                        let mut out = std::io::stdout().lock();
                        out.write_all(line.as_bytes()).unwrap();
                        out.flush().unwrap();
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    });
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Ack {
    Put { key: String, hash: u64 },
    Delete { key: String },
}

fn parse_ack(line: &str) -> Option<(Revision, Ack)> {
    let mut parts = line.split_whitespace();
    let kind = parts.next()?;
    let key = parts.next()?.to_owned();
    let rev: Revision = parts.next()?.parse().ok()?;
    match kind {
        "PUT" => Some((
            rev,
            Ack::Put {
                key,
                hash: u64::from_str_radix(parts.next()?, 16).ok()?,
            },
        )),
        "DEL" => Some((rev, Ack::Delete { key })),
        _ => None,
    }
}

/// Runs one child and kills it after `kill_after` acknowledgements (0: as soon as it has
/// started, possibly while it is opening the store). Returns every acknowledgement it printed.
fn run_child(dir: &Path, kill_after: usize) -> Vec<(Revision, Ack)> {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args([
            "crash_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DIR_ENV, dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child");
    // A reader thread forwards complete lines, so that the parent can wait with a deadline.
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        loop {
            let mut line = String::new();
            match reader.read_line(&mut line) {
                // A line cut short by the kill was never fully printed: not an acknowledgement.
                Ok(0) | Err(_) => return,
                Ok(_) if !line.ends_with('\n') => return,
                Ok(_) => {
                    if tx.send(line).is_err() {
                        return;
                    }
                }
            }
        }
    });

    let deadline = Instant::now() + ROUND_DEADLINE;
    let mut acks = Vec::new();
    let mut killed = false;
    while !killed {
        let Ok(line) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) else {
            let _ = child.kill();
            panic!(
                "child produced {} acknowledgements before the deadline or exited",
                acks.len()
            );
        };
        if let Some(ack) = parse_ack(&line) {
            acks.push(ack);
        }
        // libtest may print its "test crash_child ... " banner on the same line.
        let started = line.contains("CHILD STARTED");
        if (kill_after == 0 && started) || (kill_after > 0 && acks.len() >= kill_after) {
            // std's kill is SIGKILL on unix: no destructor, no flush, no clean close.
            child.kill().expect("kill child");
            killed = true;
        }
    }
    child.wait().unwrap();
    reader.join().unwrap();
    // Lines already in the pipe when the child died were acknowledged too.
    acks.extend(rx.try_iter().filter_map(|l| parse_ack(&l)));
    acks
}

/// Checks the reopened store against the acknowledgements, then makes one more write and
/// returns its revision and value hash.
async fn verify(dir: &Path, acks: &HashMap<Revision, Ack>) -> (Revision, u64) {
    let store = EmbeddedStore::open(dir, EmbeddedOptions::default()).expect("reopen after kill");
    let current = store.current_revision().await.unwrap();
    let max_acked = acks.keys().copied().max().unwrap_or(0);
    assert!(
        current >= max_acked,
        "current revision {current} < acknowledged {max_acked}"
    );

    // No compaction happens here, so the whole history is in the log: every acknowledged write
    // must be there at exactly its revision.
    let mut watch = store.watch("", 0).await.unwrap();
    let events = collect_events(&mut watch, current as usize).await;
    for (rev, ack) in acks {
        let event = &events[(*rev - 1) as usize];
        assert_eq!(event.revision(), *rev);
        match (ack, event) {
            (Ack::Put { key, hash }, Event::Put { kv, .. }) => {
                assert_eq!(&*kv.key, key, "revision {rev}");
                assert_eq!(
                    fnv1a(&kv.value),
                    *hash,
                    "value of acknowledged write at {rev}"
                );
            }
            (Ack::Delete { key }, Event::Delete { key: k, .. }) => assert_eq!(&**k, key),
            _ => panic!("acknowledged {ack:?} at {rev}, history has {event:?}"),
        }
    }
    // The latest state: each key holds its last acknowledged write or a later one, and no value
    // is torn.
    let mut latest_ack: HashMap<&str, (Revision, &Ack)> = HashMap::new();
    for (rev, ack) in acks {
        let key = match ack {
            Ack::Put { key, .. } | Ack::Delete { key } => key.as_str(),
        };
        let e = latest_ack.entry(key).or_insert((*rev, ack));
        if *rev > e.0 {
            *e = (*rev, ack);
        }
    }
    for (key, (rev, ack)) in latest_ack {
        match (store.get(key).await.unwrap(), ack) {
            (Some(kv), Ack::Put { hash, .. }) if kv.mod_revision == rev => {
                assert_eq!(fnv1a(&kv.value), *hash)
            }
            (Some(kv), _) => assert!(kv.mod_revision > rev, "{key} went back to {kv:?}"),
            (None, Ack::Delete { .. }) => {}
            (None, Ack::Put { .. }) => {
                let later = events[rev as usize..].iter().any(|e| e.key() == key);
                assert!(later, "{key}: acknowledged put at {rev} lost");
            }
        }
    }
    for e in &events {
        if let Event::Put { kv, .. } = e {
            assert!(
                checksum_ok(&kv.value),
                "torn value at revision {}",
                kv.mod_revision
            );
        }
    }
    // New writes continue above everything acknowledged and everything recovered.
    let value = checksummed_value(&mut rand::rng());
    let hash = fnv1a(&value);
    let kv = store
        .put("/crash/after", value, Precondition::None)
        .await
        .unwrap();
    assert_eq!(kv.mod_revision, current + 1);
    store.close().await;
    (kv.mod_revision, hash)
}

#[test]
fn crash_recovery() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut rng = rand::rng();
    let mut acks: HashMap<Revision, Ack> = HashMap::new();
    let mut total = 0;
    for round in 0..ROUNDS {
        let kill_after = if round % 5 == 4 {
            0
        } else {
            rng.random_range(1..=400)
        };
        for (rev, ack) in run_child(dir.path(), kill_after) {
            total += 1;
            if let Some(old) = acks.insert(rev, ack.clone()) {
                panic!("revision {rev} acknowledged twice: {old:?} and {ack:?}");
            }
        }
        let (rev, hash) = rt.block_on(verify(dir.path(), &acks));
        // The parent's own write is part of the history too.
        acks.insert(
            rev,
            Ack::Put {
                key: "/crash/after".into(),
                hash,
            },
        );
    }
    assert!(
        total > ROUNDS,
        "children acknowledged too few writes to test anything: {total}"
    );
}
