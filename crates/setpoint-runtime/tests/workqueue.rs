//! Work queue acceptance tests. All run under tokio's paused clock: sleeps complete by
//! auto-advancing virtual time, so exact delays can be asserted and nothing really waits.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use futures::poll;
use prometheus_client::registry::Registry;
use proptest::prelude::*;
use setpoint_runtime::workqueue::{WorkItem, WorkQueue, WorkQueueMetrics};
use tokio::time::{advance, sleep, timeout, Duration, Instant};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A queue with the default backoff and no token bucket.
fn queue<K: setpoint_runtime::workqueue::QueueKey>() -> WorkQueue<K> {
    WorkQueue::<K>::builder("test").no_rate_limit().build()
}

/// Asserts that nothing is handed out for (virtual) `d`.
async fn assert_nothing_for<K: setpoint_runtime::workqueue::QueueKey>(
    q: &WorkQueue<K>,
    d: Duration,
) {
    if let Ok(item) = timeout(d, q.get()).await {
        panic!("expected nothing for {d:?}, got {item:?}");
    }
}

// ---------------------------------------------------------------------------------------
// Dedup and one worker per key

#[tokio::test(start_paused = true)]
async fn dedup_hundred_adds_one_get() {
    let q = queue::<&str>();
    for _ in 0..100 {
        q.add("k");
    }
    assert_eq!(q.len(), 1);
    let item = q.get().await.unwrap();
    assert_eq!(*item.key(), "k");
    assert!(q.try_get().is_none());
    item.done();
    assert!(q.is_empty());
    assert_nothing_for(&q, Duration::from_secs(60)).await;
}

#[tokio::test(start_paused = true)]
async fn readd_while_in_flight_runs_once_after_done() {
    let q = queue::<&str>();
    q.add("k");
    q.add("other");
    let item = q.get().await.unwrap();
    assert_eq!(*item.key(), "k");
    for _ in 0..100 {
        q.add("k");
    }
    // Only "other" can be handed out while "k" is held.
    let other = q.try_get().unwrap();
    assert_eq!(*other.key(), "other");
    assert!(q.try_get().is_none());
    assert_eq!(q.len(), 0);
    assert_eq!(q.in_flight(), 2);
    drop(item); // dropping releases, like done()
    assert_eq!(q.len(), 1);
    let again = q.get().await.unwrap();
    assert_eq!(*again.key(), "k");
    again.done();
    other.done();
    assert!(q.try_get().is_none());
}

#[tokio::test(start_paused = true)]
async fn many_workers_never_share_a_key() {
    const KEYS: usize = 5;
    const WORKERS: usize = 8;
    let q = queue::<usize>();
    let active: Arc<Vec<AtomicUsize>> = Arc::new((0..KEYS).map(|_| AtomicUsize::new(0)).collect());
    let processed = Arc::new(AtomicUsize::new(0));

    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let q = q.clone();
        let active = active.clone();
        let processed = processed.clone();
        workers.push(tokio::spawn(async move {
            let mut rng = Rng(w as u64 + 1);
            while let Some(item) = q.get().await {
                let k = *item.key();
                assert_eq!(
                    active[k].fetch_add(1, Ordering::SeqCst),
                    0,
                    "key {k} on two workers"
                );
                sleep(ms(rng.below(4))).await;
                // Events for the key arrive while it is being processed.
                if rng.below(3) == 0 {
                    q.add(k);
                }
                active[k].fetch_sub(1, Ordering::SeqCst);
                processed.fetch_add(1, Ordering::SeqCst);
                match rng.below(4) {
                    0 => item.retry(),
                    1 => item.requeue_after(ms(rng.below(5))),
                    _ => {
                        item.forget();
                        item.done();
                    }
                }
            }
        }));
    }

    let mut rng = Rng(99);
    for _ in 0..2_000 {
        q.add(rng.below(KEYS as u64) as usize);
        if rng.below(2) == 0 {
            sleep(ms(rng.below(3))).await;
        }
    }
    sleep(Duration::from_secs(1)).await;
    q.shutdown_with_drain().await;
    for w in workers {
        w.await.unwrap();
    }
    assert_eq!(q.in_flight(), 0);
    assert!(processed.load(Ordering::SeqCst) > 100);
}

#[tokio::test(start_paused = true)]
async fn waiting_workers_are_woken_one_per_added_key() {
    let q = queue::<u32>();
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let q = q.clone();
            tokio::spawn(async move {
                let item = q.get().await.unwrap();
                let k = *item.key();
                // Hold the key so each worker takes a different one.
                sleep(Duration::from_secs(1)).await;
                k
            })
        })
        .collect();
    sleep(ms(1)).await;
    let t0 = Instant::now();
    for k in 0..4 {
        q.add(k);
    }
    let mut got = Vec::new();
    for w in workers {
        got.push(
            timeout(Duration::from_secs(2), w)
                .await
                .expect("worker never woke")
                .unwrap(),
        );
    }
    got.sort();
    assert_eq!(got, [0, 1, 2, 3]);
    assert_eq!(t0.elapsed(), Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn earlier_timer_wakes_a_worker_sleeping_until_a_later_one() {
    let q = queue::<&str>();
    q.add_after("late", Duration::from_secs(1));
    let worker = tokio::spawn({
        let q = q.clone();
        async move {
            let item = q.get().await.unwrap();
            (*item.key(), Instant::now())
        }
    });
    sleep(ms(1)).await; // the worker now sleeps until the 1 s timer
    let t0 = Instant::now();
    q.add_after("early", ms(10));
    let (key, at) = worker.await.unwrap();
    assert_eq!((key, at - t0), ("early", ms(10)));
}

#[tokio::test(start_paused = true)]
async fn timers_due_together_reach_every_waiting_worker() {
    let q = queue::<u32>();
    let workers: Vec<_> = (0..3)
        .map(|_| {
            let q = q.clone();
            tokio::spawn(async move {
                let item = q.get().await.unwrap();
                let got = (*item.key(), Instant::now());
                sleep(Duration::from_secs(1)).await;
                got
            })
        })
        .collect();
    sleep(ms(1)).await;
    let t0 = Instant::now();
    for k in 0..3 {
        q.add_after(k, ms(50));
    }
    let mut got = Vec::new();
    for w in workers {
        let (k, at) = timeout(Duration::from_secs(10), w)
            .await
            .expect("a due timer never reached a waiting worker")
            .unwrap();
        got.push((k, at - t0));
    }
    got.sort();
    assert_eq!(got, [(0, ms(50)), (1, ms(50)), (2, ms(50))]);
}

// ---------------------------------------------------------------------------------------
// Backoff

#[tokio::test(start_paused = true)]
async fn backoff_doubles_caps_and_resets_on_forget() {
    let q = WorkQueue::<&str>::builder("test")
        .backoff(ms(5), ms(100))
        .no_rate_limit()
        .build();
    q.add("k");
    let mut item = q.get().await.unwrap();
    let mut waits = Vec::new();
    for _ in 0..8 {
        let t = Instant::now();
        item.retry();
        item = q.get().await.unwrap();
        waits.push(t.elapsed());
    }
    assert_eq!(waits, [5, 10, 20, 40, 80, 100, 100, 100].map(ms));
    assert_eq!(item.num_requeues(), 8);
    assert_eq!(q.num_requeues(&"k"), 8);

    item.forget();
    assert_eq!(item.num_requeues(), 0);
    let t = Instant::now();
    item.retry();
    let item = q.get().await.unwrap();
    assert_eq!(t.elapsed(), ms(5));
    assert_eq!(item.num_requeues(), 1);
}

#[tokio::test(start_paused = true)]
async fn default_backoff_runs_5ms_doubling_to_1000s() {
    // Default token bucket included: one key never exhausts a burst of 100.
    let q = WorkQueue::<&str>::new("test");
    q.add("k");
    let mut item = q.get().await.unwrap();
    for n in 0..22u32 {
        let t = Instant::now();
        item.retry();
        item = q.get().await.unwrap();
        let expected = ms(5 * 2u64.pow(n)).min(Duration::from_secs(1000));
        assert_eq!(t.elapsed(), expected, "failure #{n}");
    }
}

#[tokio::test(start_paused = true)]
async fn readds_during_backoff_neither_shorten_nor_inflate_it() {
    let q = queue::<&str>();
    q.add("k");
    let mut item = q.get().await.unwrap();
    for _ in 0..3 {
        item.retry();
        item = q.get().await.unwrap();
    }
    assert_eq!(item.num_requeues(), 3);
    let t0 = Instant::now();
    item.retry(); // fourth failure: 40 ms

    sleep(ms(10)).await;
    for _ in 0..10 {
        q.add("k");
    }
    q.add_after("k", ms(1));
    assert!(q.try_get().is_none());
    assert_eq!(q.len(), 0);
    assert_eq!(q.num_requeues(&"k"), 4);

    let item = q.get().await.unwrap();
    assert_eq!(t0.elapsed(), ms(40));
    assert_eq!(item.num_requeues(), 4);
    // Only one run for all those adds.
    item.done();
    assert_nothing_for(&q, Duration::from_secs(10)).await;
}

#[tokio::test(start_paused = true)]
async fn event_during_failing_reconcile_waits_for_the_backoff() {
    let q = queue::<&str>();
    q.add("k");
    let item = q.get().await.unwrap();
    q.add("k"); // marks it to run again...
    let t0 = Instant::now();
    item.retry(); // ...but the failure's backoff comes first
    assert!(q.try_get().is_none());
    let item = q.get().await.unwrap();
    assert_eq!(t0.elapsed(), ms(5));
    item.done();
    assert_nothing_for(&q, Duration::from_secs(10)).await;
}

#[tokio::test(start_paused = true)]
async fn add_supersedes_a_timed_requeue() {
    let q = queue::<&str>();
    q.add_after("k", Duration::from_secs(1));
    q.add("k");
    let item = q.try_get().expect("a plain add runs at once");
    item.done();
    // The superseded timer does not deliver the key a second time.
    assert_nothing_for(&q, Duration::from_secs(10)).await;
}

// ---------------------------------------------------------------------------------------
// Token bucket

async fn ready_times(q: &WorkQueue<u32>, n: usize) -> Vec<(u32, Duration)> {
    let t0 = Instant::now();
    let mut out = Vec::new();
    for _ in 0..n {
        let item = q.get().await.unwrap();
        out.push((*item.key(), t0.elapsed()));
    }
    out
}

#[tokio::test(start_paused = true)]
async fn token_bucket_spreads_adds_beyond_the_burst_at_qps() {
    let q = WorkQueue::<u32>::builder("test")
        .rate_limit(10.0, 5)
        .build();
    for k in 0..8 {
        q.add_rate_limited(k);
    }
    let got = ready_times(&q, 8).await;
    let mut expected: Vec<(u32, Duration)> = (0..5).map(|k| (k, ms(5))).collect();
    expected.extend([(5, ms(100)), (6, ms(200)), (7, ms(300))]);
    assert_eq!(got, expected);
}

#[tokio::test(start_paused = true)]
async fn default_token_bucket_is_10_qps_burst_100() {
    let q = WorkQueue::<u32>::new("test");
    for k in 0..103 {
        q.add_rate_limited(k);
    }
    let got = ready_times(&q, 103).await;
    assert!(got[..100].iter().all(|(_, t)| *t == ms(5)));
    assert_eq!(got[100..], [(100, ms(100)), (101, ms(200)), (102, ms(300))]);
}

#[tokio::test(start_paused = true)]
async fn disabled_token_bucket_only_backs_off() {
    let q = queue::<u32>();
    for k in 0..300 {
        q.add_rate_limited(k);
    }
    let got = ready_times(&q, 300).await;
    assert!(got.iter().all(|(_, t)| *t == ms(5)));
}

#[tokio::test(start_paused = true)]
async fn per_key_backoff_wins_when_longer_than_the_bucket() {
    let q = WorkQueue::<u32>::builder("test")
        .rate_limit(10.0, 1)
        .build();
    q.add_rate_limited(0); // token 1: free; backoff 5 ms
    for _ in 0..6 {
        q.add_rate_limited(1); // backoffs 5..160 ms; the bucket's waits are 100..600 ms
    }
    // Key 1's last add waited for the bucket (600 ms) rather than its backoff (160 ms).
    assert_eq!(ready_times(&q, 2).await, [(0, ms(5)), (1, ms(600))]);
}

// ---------------------------------------------------------------------------------------
// Timed requeues

#[tokio::test(start_paused = true)]
async fn add_after_hands_out_in_time_order() {
    let q = queue::<&str>();
    q.add_after("a", ms(30));
    q.add_after("b", ms(10));
    q.add_after("c", ms(20));
    let t0 = Instant::now();
    let mut got = Vec::new();
    for _ in 0..3 {
        let item = q.get().await.unwrap();
        got.push((*item.key(), t0.elapsed()));
    }
    assert_eq!(got, [("b", ms(10)), ("c", ms(20)), ("a", ms(30))]);
}

#[tokio::test(start_paused = true)]
async fn add_after_earlier_time_wins() {
    let q = queue::<&str>();
    let t0 = Instant::now();
    q.add_after("late-then-early", ms(50));
    q.add_after("late-then-early", ms(10));
    q.add_after("early-then-late", ms(10));
    q.add_after("early-then-late", ms(50));
    q.add("queued");
    q.add_after("queued", ms(5));

    let first = q.get().await.unwrap();
    assert_eq!((*first.key(), t0.elapsed()), ("queued", ms(0)));
    first.done();
    let mut at_10 = vec![q.get().await.unwrap(), q.get().await.unwrap()];
    assert_eq!(t0.elapsed(), ms(10));
    at_10.sort_by_key(|i| *i.key());
    assert_eq!(*at_10[0].key(), "early-then-late");
    assert_eq!(*at_10[1].key(), "late-then-early");
    drop(at_10);
    // Nothing else: the later times were absorbed by the earlier ones.
    assert_nothing_for(&q, Duration::from_secs(10)).await;
}

#[tokio::test(start_paused = true)]
async fn timer_due_while_in_flight_runs_after_done() {
    let q = queue::<&str>();
    q.add("k");
    let item = q.get().await.unwrap();
    q.add_after("k", ms(10));
    sleep(ms(20)).await;
    assert!(q.try_get().is_none());
    item.done();
    let again = q.try_get().expect("due while in flight: ready on release");
    assert_eq!(*again.key(), "k");
}

#[tokio::test(start_paused = true)]
async fn requeue_after_releases_and_schedules() {
    let q = queue::<&str>();
    q.add("k");
    let t0 = Instant::now();
    q.get().await.unwrap().requeue_after(ms(250));
    let item = q.get().await.unwrap();
    assert_eq!(t0.elapsed(), ms(250));
    assert_eq!(item.num_requeues(), 0);
}

// ---------------------------------------------------------------------------------------
// Shutdown

#[tokio::test(start_paused = true)]
async fn shutdown_wakes_waiting_workers_with_none() {
    let q = queue::<&str>();
    let waiters: Vec<_> = (0..4)
        .map(|_| {
            let q = q.clone();
            tokio::spawn(async move { q.get().await.map(|i| *i.key()) })
        })
        .collect();
    sleep(ms(1)).await;
    q.shutdown();
    assert!(q.is_shutting_down());
    for w in waiters {
        assert_eq!(w.await.unwrap(), None);
    }
}

#[tokio::test(start_paused = true)]
async fn shutdown_with_drain_waits_for_in_flight_then_get_returns_none() {
    let q = queue::<&str>();
    q.add("a");
    q.add("b");
    q.add("queued");
    q.add_after("scheduled", ms(5));
    q.add_rate_limited("failing");
    let a = q.get().await.unwrap();
    let b = q.get().await.unwrap();

    let drain = tokio::spawn({
        let q = q.clone();
        async move { q.shutdown_with_drain().await }
    });
    sleep(Duration::from_secs(1)).await;
    assert!(!drain.is_finished(), "two keys still in flight");
    assert!(q.is_shutting_down());
    // No new keys are handed out, queued and scheduled ones were dropped, adds are ignored.
    assert!(q.get().await.is_none());
    q.add("late");
    assert_eq!(q.len(), 0);
    assert_eq!(q.in_flight(), 2);

    // Workers finish their current item; re-adds from them are ignored too.
    a.retry();
    sleep(Duration::from_secs(1)).await;
    assert!(!drain.is_finished(), "one key still in flight");
    b.done();
    drain.await.unwrap();

    assert_eq!(q.in_flight(), 0);
    assert!(q.get().await.is_none());
    assert!(q.try_get().is_none());
    // Draining an already drained queue returns at once.
    q.shutdown_with_drain().await;
}

// ---------------------------------------------------------------------------------------
// Cancel safety

#[tokio::test(start_paused = true)]
async fn dropped_get_passes_its_wakeup_on() {
    let q = queue::<&str>();
    let mut first = Box::pin(q.get());
    let mut second = Box::pin(q.get());
    assert!(poll!(&mut first).is_pending());
    assert!(poll!(&mut second).is_pending());
    q.add("k"); // wakes `first`, which is dropped before it looks
    drop(first);
    let item = timeout(Duration::from_secs(1), second)
        .await
        .expect("the wake-up was lost")
        .unwrap();
    assert_eq!(*item.key(), "k");
}

#[tokio::test(start_paused = true)]
async fn get_cancelled_by_timeouts_loses_nothing() {
    let q = queue::<u32>();
    let mut rng = Rng(7);
    for k in 0..200 {
        q.add_after(k, ms(1 + rng.below(500)));
    }
    let mut seen = HashSet::new();
    let mut cancelled = 0;
    while seen.len() < 200 {
        tokio::select! {
            item = q.get() => {
                let item = item.unwrap();
                assert!(seen.insert(*item.key()), "delivered twice: {item:?}");
            }
            () = sleep(ms(rng.below(3))) => cancelled += 1,
        }
    }
    assert!(cancelled > 10);
    assert!(q.is_empty());
}

// ---------------------------------------------------------------------------------------
// Metrics

fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
    out
}

fn assert_lines(text: &str, lines: &[&str]) {
    for line in lines {
        assert!(
            text.lines().any(|l| l == *line),
            "missing line {line:?} in:\n{text}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn metrics_report_adds_retries_depth_and_durations() {
    let mut registry = Registry::default();
    let metrics = WorkQueueMetrics::new();
    metrics.register(&mut registry);
    let q = WorkQueue::<&str>::builder("ctrl")
        .no_rate_limit()
        .metrics(&metrics)
        .build();

    q.add("a");
    q.add("b");
    q.add("b"); // deduplicated: not an add
    q.add_rate_limited("c"); // a retry now, an add when its 5 ms are up
    q.add_after("d", Duration::from_secs(1)); // likewise
    let a = q.get().await.unwrap();
    assert_eq!(*a.key(), "a");
    sleep(Duration::from_secs(3)).await;

    assert_lines(
        &encode(&registry),
        &[
            "# TYPE workqueue_depth gauge",
            r#"workqueue_depth{name="ctrl"} 3"#,
            "# TYPE workqueue_adds counter",
            r#"workqueue_adds_total{name="ctrl"} 4"#,
            r#"workqueue_retries_total{name="ctrl"} 2"#,
            "# TYPE workqueue_queue_duration_seconds histogram",
            r#"workqueue_queue_duration_seconds_count{name="ctrl"} 1"#,
            r#"workqueue_queue_duration_seconds_sum{name="ctrl"} 0.0"#,
            r#"workqueue_work_duration_seconds_count{name="ctrl"} 0"#,
            "# TYPE workqueue_unfinished_work_seconds gauge",
            r#"workqueue_unfinished_work_seconds{name="ctrl"} 3.0"#,
            "# TYPE workqueue_longest_running_processor_seconds gauge",
            r#"workqueue_longest_running_processor_seconds{name="ctrl"} 3.0"#,
        ],
    );

    a.done();
    let b = q.get().await.unwrap(); // waited 3 s
    sleep(Duration::from_secs(1)).await;
    let c = q.get().await.unwrap(); // ready at 5 ms, taken at 4 s
    sleep(Duration::from_secs(1)).await;
    assert_eq!((*b.key(), *c.key()), ("b", "c"));
    assert_lines(
        &encode(&registry),
        &[
            r#"workqueue_depth{name="ctrl"} 1"#,
            r#"workqueue_adds_total{name="ctrl"} 4"#,
            r#"workqueue_queue_duration_seconds_count{name="ctrl"} 3"#,
            r#"workqueue_work_duration_seconds_count{name="ctrl"} 1"#,
            r#"workqueue_work_duration_seconds_sum{name="ctrl"} 3.0"#,
            r#"workqueue_work_duration_seconds_bucket{le="1.0",name="ctrl"} 0"#,
            r#"workqueue_work_duration_seconds_bucket{le="10.0",name="ctrl"} 1"#,
            r#"workqueue_unfinished_work_seconds{name="ctrl"} 3.0"#,
            r#"workqueue_longest_running_processor_seconds{name="ctrl"} 2.0"#,
        ],
    );
    let text = encode(&registry);
    // b waited 3 s, c 4 s - 5 ms; a did not wait.
    let sum = value(
        &text,
        r#"workqueue_queue_duration_seconds_sum{name="ctrl"}"#,
    );
    assert!((sum - 6.995).abs() < 1e-9, "queue duration sum {sum}");
    drop((b, c));
}

/// The value of the series named exactly `series` (name and labels).
fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no series {series} in:\n{text}"))
}

#[tokio::test(start_paused = true)]
async fn metrics_are_per_queue_name_and_vanish_with_the_queue() {
    let mut registry = Registry::default();
    let metrics = WorkQueueMetrics::new();
    metrics.register(&mut registry);
    let one = WorkQueue::<u32>::builder("one").metrics(&metrics).build();
    let two = WorkQueue::<String>::builder("two")
        .metrics(&metrics)
        .build();
    one.add(1);
    one.add(2);
    two.add("x".into());
    let text = encode(&registry);
    assert_lines(
        &text,
        &[
            r#"workqueue_depth{name="one"} 2"#,
            r#"workqueue_depth{name="two"} 1"#,
            r#"workqueue_adds_total{name="one"} 2"#,
            r#"workqueue_adds_total{name="two"} 1"#,
        ],
    );
    drop(two);
    let text = encode(&registry);
    assert!(!text.contains(r#"workqueue_depth{name="two"}"#), "{text}");
    assert_lines(&text, &[r#"workqueue_depth{name="one"} 2"#]);
}

#[tokio::test(start_paused = true)]
async fn queue_without_metrics_keeps_none() {
    let q = queue::<u32>();
    q.add(1);
    assert_eq!(q.get().await.map(|i| *i.key()), Some(1));
}

// ---------------------------------------------------------------------------------------
// Property test: random operation sequences against a small model

#[derive(Clone, Debug)]
enum Op {
    Add(u8),
    AddAfter(u8, u64),
    AddRateLimited(u8),
    Forget(u8),
    Get,
    Release(usize, Release),
    Advance(u64),
}

#[derive(Clone, Copy, Debug)]
enum Release {
    Done,
    Retry,
    RequeueAfter(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0u8..4;
    prop_oneof![
        3 => key.clone().prop_map(Op::Add),
        1 => (key.clone(), 0u64..60).prop_map(|(k, d)| Op::AddAfter(k, d)),
        1 => key.clone().prop_map(Op::AddRateLimited),
        1 => key.prop_map(Op::Forget),
        3 => Just(Op::Get),
        2 => (0usize..4, prop_oneof![
            Just(Release::Done),
            Just(Release::Retry),
            (0u64..60).prop_map(Release::RequeueAfter),
        ]).prop_map(|(i, r)| Op::Release(i, r)),
        2 => (0u64..80).prop_map(Op::Advance),
    ]
}

const BASE: Duration = Duration::from_millis(5);
const MAX: Duration = Duration::from_millis(200);

/// What the test knows the queue owes each key.
#[derive(Default)]
struct Model {
    /// Keys added since they were last handed out: each must be handed out exactly once more.
    wanted: HashSet<u8>,
    /// Failures recorded per key (the model of `num_requeues`).
    failures: HashMap<u8, u32>,
    /// Earliest time a key waiting out a backoff may be handed out.
    not_before: HashMap<u8, Instant>,
}

impl Model {
    fn fail(&mut self, k: u8, now: Instant) {
        let n = self.failures.entry(k).or_default();
        let delay = BASE.saturating_mul(2u32.saturating_pow(*n)).min(MAX);
        *n += 1;
        let at = now + delay;
        let floor = self.not_before.entry(k).or_insert(at);
        *floor = (*floor).max(at);
        self.wanted.insert(k);
    }

    fn handed_out(&mut self, k: u8, now: Instant) {
        assert!(
            self.wanted.remove(&k),
            "key {k} handed out without a pending add"
        );
        if let Some(floor) = self.not_before.remove(&k) {
            assert!(now >= floor, "key {k} handed out before its backoff ended");
        }
    }
}

fn run_ops(ops: Vec<Op>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async move {
        let q = WorkQueue::<u8>::builder("prop")
            .backoff(BASE, MAX)
            .no_rate_limit()
            .build();
        let mut model = Model::default();
        let mut held: Vec<WorkItem<u8>> = Vec::new();
        for op in ops {
            let now = Instant::now();
            match op {
                Op::Add(k) => {
                    q.add(k);
                    model.wanted.insert(k);
                }
                Op::AddAfter(k, d) => {
                    q.add_after(k, ms(d));
                    model.wanted.insert(k);
                }
                Op::AddRateLimited(k) => {
                    q.add_rate_limited(k);
                    model.fail(k, now);
                }
                Op::Forget(k) => {
                    q.forget(&k);
                    model.failures.remove(&k);
                }
                Op::Get => {
                    if let Some(item) = q.try_get() {
                        let k = *item.key();
                        assert!(
                            held.iter().all(|h| *h.key() != k),
                            "key {k} handed out twice"
                        );
                        model.handed_out(k, now);
                        held.push(item);
                    }
                }
                Op::Release(i, how) => {
                    if held.is_empty() {
                        continue;
                    }
                    let item = held.swap_remove(i % held.len());
                    let k = *item.key();
                    match how {
                        Release::Done => item.done(),
                        Release::Retry => {
                            item.retry();
                            model.fail(k, now);
                        }
                        Release::RequeueAfter(d) => {
                            item.requeue_after(ms(d));
                            model.wanted.insert(k);
                        }
                    }
                }
                Op::Advance(d) => advance(ms(d)).await,
            }
            for k in 0..4 {
                assert_eq!(
                    q.num_requeues(&k),
                    model.failures.get(&k).copied().unwrap_or(0),
                    "failure count of key {k}"
                );
            }
        }
        // Liveness: once every item is released and every timer has passed, each key
        // still owed is handed out exactly once.
        held.clear();
        advance(Duration::from_secs(3600)).await;
        let now = Instant::now();
        while let Some(item) = q.try_get() {
            model.handed_out(*item.key(), now);
        }
        assert!(
            model.wanted.is_empty(),
            "never handed out: {:?}",
            model.wanted
        );
        assert_eq!(q.in_flight(), 0);
    });
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        // Integration tests have no lib.rs for proptest to file regressions beside.
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_operations_keep_the_queue_invariants(ops in proptest::collection::vec(op(), 0..80)) {
        run_ops(ops);
    }
}

// ---------------------------------------------------------------------------------------

/// A tiny deterministic generator (xorshift) so the concurrency tests repeat exactly.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}
