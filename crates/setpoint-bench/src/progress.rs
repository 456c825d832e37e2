//! The progress line on stderr: redrawn in place every half second on a terminal, printed as a
//! new line every few seconds otherwise (so logs and CI output stay readable).

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;

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
