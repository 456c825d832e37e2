//! The progress line on stderr: redrawn in place every half second on a terminal, printed as a
//! new line every few seconds otherwise (so logs and CI output stay readable).

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Cells of a [`bar`].
const BAR_WIDTH: u64 = 24;

/// A bar of `done` out of `total` with its percentage, such as `[######..........]  37%`.
/// ASCII only, so it reads the same in a terminal and in a CI log; a zero `total` is full.
pub fn bar(done: u64, total: u64) -> String {
    let done = done.min(total);
    let (filled, percent) = match (done * BAR_WIDTH).checked_div(total) {
        Some(filled) => (filled, done * 100 / total),
        None => (BAR_WIDTH, 100),
    };
    format!(
        "[{}{}] {percent:3}%",
        "#".repeat(filled as usize),
        ".".repeat((BAR_WIDTH - filled) as usize)
    )
}

/// A [`bar`] of the time since `since` out of `of`.
pub fn time_bar(since: Instant, of: Duration) -> String {
    bar(since.elapsed().as_millis() as u64, of.as_millis() as u64)
}

/// Prints `line()` until stopped.
pub struct Progress {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Progress {
    /// Starts printing; `line` is called at each redraw.
    pub fn start(line: impl Fn() -> String + Send + 'static) -> Self {
        let tty = std::io::stderr().is_terminal();
        let every = if tty {
            Duration::from_millis(500)
        } else {
            Duration::from_secs(5)
        };
        let (stop, mut stopped) = watch::channel(false);
        let started = Instant::now();
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(every) => {}
                    _ = stopped.changed() => break,
                }
                let text = format!("[{:6.1}s] {}", started.elapsed().as_secs_f64(), line());
                let mut err = std::io::stderr().lock();
                if tty {
                    let _ = write!(err, "\r\x1b[2K{text}");
                } else {
                    let _ = writeln!(err, "{text}");
                }
                let _ = err.flush();
            }
            if tty {
                let _ = writeln!(std::io::stderr());
            }
        });
        Progress { stop, task }
    }

    /// Stops printing (ending a redrawn line with a newline).
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_fill_in_proportion_and_never_overflow() {
        assert_eq!(bar(0, 100), format!("[{}]   0%", ".".repeat(24)));
        assert_eq!(
            bar(50, 100),
            format!("[{}{}]  50%", "#".repeat(12), ".".repeat(12))
        );
        assert_eq!(bar(150, 100), format!("[{}] 100%", "#".repeat(24)));
        assert_eq!(bar(0, 0), format!("[{}] 100%", "#".repeat(24)));
        assert!(time_bar(Instant::now(), Duration::from_secs(3600)).ends_with("   0%"));
    }
}
