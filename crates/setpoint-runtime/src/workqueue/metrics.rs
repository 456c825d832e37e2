//! Prometheus metrics for work queues, under the names client-go's work queues use so that
//! dashboards written for Go operators work unchanged.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

/// The one label every work queue series carries: the queue's (usually the controller's)
/// name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabels {
    name: String,
}

type HistogramFamily = Family<QueueLabels, Histogram, fn() -> Histogram>;

fn duration_histogram() -> Histogram {
    // 10 ns .. 10 s in decades, the buckets Go's work queue metrics use, so quantiles
    // computed over mixed Go and Setpoint fleets line up.
    Histogram::new(exponential_buckets(1e-8, 10.0, 10))
}

/// Metrics shared by any number of work queues, each labelled with its `name`.
///
/// Create one per process (or per registry), [`register`](Self::register) it once, and hand
/// it to every queue through [`WorkQueueBuilder::metrics`](super::WorkQueueBuilder::metrics).
/// Queues built without it keep no metrics at all.
///
/// | series | type | meaning |
/// |---|---|---|
/// | `workqueue_depth` | gauge | keys ready to be handed out (not in flight, not waiting for a timer) |
/// | `workqueue_adds_total` | counter | adds that queued a key (or marked an in-flight key to run again); de-duplicated adds are not counted, timed adds count when their time comes |
/// | `workqueue_retries_total` | counter | calls of `add_rate_limited` and `add_after` (as in Go, where both go through `AddAfter`) |
/// | `workqueue_queue_duration_seconds` | histogram | time from a key becoming ready to a worker taking it |
/// | `workqueue_work_duration_seconds` | histogram | time a worker held a key |
/// | `workqueue_unfinished_work_seconds` | gauge | summed age of all keys in flight now; it grows steadily when workers are stuck |
/// | `workqueue_longest_running_processor_seconds` | gauge | age of the oldest key in flight now |
///
/// The three gauges are computed when the registry is encoded, from the live queues, so
/// they are exact at scrape time and cost nothing between scrapes. A queue's series
/// disappear once the queue and all of its work items are dropped.
#[derive(Clone, Debug)]
pub struct WorkQueueMetrics {
    adds: Family<QueueLabels, Counter>,
    retries: Family<QueueLabels, Counter>,
    queue_duration: HistogramFamily,
    work_duration: HistogramFamily,
    probes: ProbeList,
}

impl Default for WorkQueueMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl WorkQueueMetrics {
    /// Creates the metrics without registering them anywhere.
    pub fn new() -> Self {
        Self {
            adds: Family::default(),
            retries: Family::default(),
            queue_duration: Family::new_with_constructor(duration_histogram),
            work_duration: Family::new_with_constructor(duration_histogram),
            probes: ProbeList::default(),
        }
    }

    /// Registers every series into `registry`. Call it once per registry: registering the
    /// same metrics twice would print each series twice.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "workqueue_depth",
            "Current depth of the work queue: keys ready and waiting for a worker",
            self.scrape_gauge(Sampled::Depth),
        );
        registry.register(
            "workqueue_adds",
            "Total number of adds handled by the work queue",
            self.adds.clone(),
        );
        registry.register(
            "workqueue_retries",
            "Total number of rate-limited and delayed adds handled by the work queue",
            self.retries.clone(),
        );
        registry.register_with_unit(
            "workqueue_queue_duration",
            "How long a key waits in the work queue before a worker takes it",
            Unit::Seconds,
            self.queue_duration.clone(),
        );
        registry.register_with_unit(
            "workqueue_work_duration",
            "How long processing a key taken from the work queue takes",
            Unit::Seconds,
            self.work_duration.clone(),
        );
        registry.register_with_unit(
            "workqueue_unfinished_work",
            "Seconds of work in progress that work_duration has not observed yet; \
             steady growth means stuck workers",
            Unit::Seconds,
            self.scrape_gauge(Sampled::UnfinishedWork),
        );
        registry.register_with_unit(
            "workqueue_longest_running_processor",
            "How long the longest-running worker of the work queue has held its key",
            Unit::Seconds,
            self.scrape_gauge(Sampled::LongestRunning),
        );
    }

    fn scrape_gauge(&self, which: Sampled) -> ScrapeGauge {
        ScrapeGauge {
            which,
            probes: self.probes.clone(),
        }
    }

    /// The per-queue handles a queue records into; looked up once so that recording is a
    /// plain atomic add, not a family lookup.
    pub(crate) fn for_queue(&self, name: &str) -> QueueMetrics {
        let labels = QueueLabels {
            name: name.to_owned(),
        };
        QueueMetrics {
            adds: self.adds.get_or_create_owned(&labels),
            retries: self.retries.get_or_create_owned(&labels),
            queue_duration: self.queue_duration.get_or_create_owned(&labels),
            work_duration: self.work_duration.get_or_create_owned(&labels),
        }
    }

    /// Makes a live queue visible to the scrape-time gauges.
    pub(crate) fn attach(&self, name: &str, probe: Weak<dyn Probe>) {
        let mut probes = self.probes.0.lock();
        // Dropped queues are pruned here as well as at scrape time, so a process that
        // creates queues but is never scraped does not accumulate dead entries.
        probes.retain(|(_, p)| p.strong_count() > 0);
        probes.push((name.to_owned(), probe));
    }
}

/// Counters and histograms of one queue (clones share the series).
#[derive(Clone, Debug)]
pub(crate) struct QueueMetrics {
    pub(crate) adds: Counter,
    pub(crate) retries: Counter,
    pub(crate) queue_duration: Histogram,
    pub(crate) work_duration: Histogram,
}

/// A queue's state as the scrape-time gauges need it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Sample {
    pub(crate) depth: i64,
    pub(crate) unfinished_seconds: f64,
    pub(crate) longest_running_seconds: f64,
}

/// Implemented by a queue's shared state; type-erases the key type.
pub(crate) trait Probe: Send + Sync {
    fn sample(&self) -> Sample;
}

/// A live queue as the scrape-time gauges see it: its name and a handle that does not keep
/// it alive.
type Attached = (String, Weak<dyn Probe>);

#[derive(Clone, Default)]
struct ProbeList(Arc<Mutex<Vec<Attached>>>);

impl fmt::Debug for ProbeList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProbeList")
            .field("queues", &self.0.lock().len())
            .finish()
    }
}

impl ProbeList {
    /// Samples every live queue, merging queues that share a name (depth and unfinished
    /// work add up; the longest-running processor is the longest of them).
    fn sample(&self) -> BTreeMap<String, Sample> {
        // Upgrade under the list lock, sample outside it: sampling takes each queue's own
        // lock, and queue construction takes the list lock.
        let live: Vec<(String, Arc<dyn Probe>)> = {
            let mut probes = self.0.lock();
            probes.retain(|(_, p)| p.strong_count() > 0);
            probes
                .iter()
                .filter_map(|(name, p)| p.upgrade().map(|p| (name.clone(), p)))
                .collect()
        };
        let mut out: BTreeMap<String, Sample> = BTreeMap::new();
        for (name, probe) in live {
            let s = probe.sample();
            let acc = out.entry(name).or_default();
            acc.depth += s.depth;
            acc.unfinished_seconds += s.unfinished_seconds;
            acc.longest_running_seconds =
                acc.longest_running_seconds.max(s.longest_running_seconds);
        }
        out
    }

    fn is_empty(&self) -> bool {
        self.0.lock().iter().all(|(_, p)| p.strong_count() == 0)
    }
}

#[derive(Clone, Copy, Debug)]
enum Sampled {
    Depth,
    UnfinishedWork,
    LongestRunning,
}

/// A gauge family whose values are read from the live queues while the registry is encoded.
#[derive(Debug)]
struct ScrapeGauge {
    which: Sampled,
    probes: ProbeList,
}

impl EncodeMetric for ScrapeGauge {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), fmt::Error> {
        for (name, sample) in self.probes.sample() {
            let labels = QueueLabels { name };
            let family = encoder.encode_family(&labels)?;
            match self.which {
                Sampled::Depth => ConstGauge::new(sample.depth).encode(family)?,
                Sampled::UnfinishedWork => {
                    ConstGauge::new(sample.unfinished_seconds).encode(family)?
                }
                Sampled::LongestRunning => {
                    ConstGauge::new(sample.longest_running_seconds).encode(family)?
                }
            }
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }

    fn is_empty(&self) -> bool {
        self.probes.is_empty()
    }
}
