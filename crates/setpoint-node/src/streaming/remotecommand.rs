//! The protocol-neutral half of `exec` and `attach`: what the request asks for (the kubelet's
//! query parameters), the in-process pipes a wire protocol fills and drains, the call into the
//! [`PodRuntime`], and the outcome as the kubelet reports it on the error channel.
//!
//! A wire protocol (WebSocket channels in [`super::websocket`], or SPDY streams) only moves
//! bytes: it builds [`Pipes`] for the [`Options`], copies the client's frames into
//! [`Pipes::stdin`] and [`Pipes::resize`], copies [`Pipes::stdout`] and [`Pipes::stderr`] out
//! as frames, awaits [`run`], drains what is left of the output, and sends the
//! [`Outcome::status`] last.

use std::sync::Arc;

use serde_json::{json, Value};
use tokio::io::DuplexStream;
use tokio::sync::mpsc;

use crate::runtime::{ExecRequest, PodRuntime, RuntimeError, RuntimePod, StreamIo, TerminalSize};

/// How many bytes each in-process pipe holds before its writer waits: the bound on what a
/// session buffers per stream between the container and the client.
pub const PIPE_BYTES: usize = 64 * 1024;
/// How many terminal resizes may wait for the runtime before the client's reads pause.
const RESIZE_QUEUE: usize = 8;

/// Which operation a session is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// `pods/exec`: run a new command in the container.
    Exec,
    /// `pods/attach`: connect to the container's main process.
    Attach,
}

/// The streams a session asks for, and the command of an exec (the kubelet's query
/// parameters `command`, `stdin`, `stdout`, `stderr`, `tty`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// The command and its arguments (exec only).
    pub command: Vec<String>,
    /// The client sends stdin.
    pub stdin: bool,
    /// The client reads stdout.
    pub stdout: bool,
    /// The client reads stderr (never with a TTY, which merges it into stdout).
    pub stderr: bool,
    /// Run on (attach to) a terminal.
    pub tty: bool,
}

/// Parses the kubelet's streaming query. As in the kubelet, a stream is on only when its
/// parameter is `1` (the API server translates its own booleans so), stderr is dropped with
/// a TTY, and at least one stream must be asked for.
pub fn parse_options(operation: Operation, query: &[(String, String)]) -> Result<Options, String> {
    let flag = |name: &str| {
        query
            .iter()
            .find(|(k, _)| k == name)
            .is_some_and(|(_, v)| v == "1")
    };
    let mut options = Options {
        command: if operation == Operation::Exec {
            query
                .iter()
                .filter(|(k, _)| k == "command")
                .map(|(_, v)| v.clone())
                .collect()
        } else {
            Vec::new()
        },
        stdin: flag("stdin"),
        stdout: flag("stdout"),
        stderr: flag("stderr"),
        tty: flag("tty"),
    };
    if options.tty {
        options.stderr = false;
    }
    if !options.stdin && !options.stdout && !options.stderr {
        return Err("you must specify at least 1 of stdin, stdout, stderr".into());
    }
    if operation == Operation::Exec && options.command.is_empty() {
        return Err("you must specify at least one command for the container".into());
    }
    Ok(options)
}

/// One exec or attach request, resolved to the pod the runtime holds.
pub struct Session {
    /// Exec or attach.
    pub operation: Operation,
    /// The runtime holding the pod.
    pub runtime: Arc<dyn PodRuntime>,
    /// The pod as the runtime knows it.
    pub pod: RuntimePod,
    /// The container's name.
    pub container: String,
    /// What the client asked for.
    pub options: Options,
}

/// The protocol's ends of a session's in-process pipes, and the [`StreamIo`] for the runtime.
/// A stream the client did not ask for is `None` on both sides.
pub struct Pipes {
    /// Handed to the runtime.
    pub io: StreamIo,
    /// Write the client's stdin here; dropping it is the container's EOF.
    pub stdin: Option<DuplexStream>,
    /// Read the container's stdout here; EOF once the runtime is done with it.
    pub stdout: Option<DuplexStream>,
    /// Read the container's stderr here.
    pub stderr: Option<DuplexStream>,
    /// Send the client's terminal resizes here (TTY sessions only).
    pub resize: Option<mpsc::Sender<TerminalSize>>,
}

/// Bounded pipes for the streams `options` asks for.
pub fn pipes(options: &Options) -> Pipes {
    let mut io = StreamIo::default();
    let mut pipes = Pipes {
        io: StreamIo::default(),
        stdin: None,
        stdout: None,
        stderr: None,
        resize: None,
    };
    if options.stdin {
        let (ours, theirs) = tokio::io::duplex(PIPE_BYTES);
        io.stdin = Some(Box::new(theirs));
        pipes.stdin = Some(ours);
    }
    if options.stdout {
        let (ours, theirs) = tokio::io::duplex(PIPE_BYTES);
        io.stdout = Some(Box::new(theirs));
        pipes.stdout = Some(ours);
    }
    if options.stderr && !options.tty {
        let (ours, theirs) = tokio::io::duplex(PIPE_BYTES);
        io.stderr = Some(Box::new(theirs));
        pipes.stderr = Some(ours);
    }
    if options.tty {
        let (tx, rx) = mpsc::channel(RESIZE_QUEUE);
        io.resize = Some(rx);
        pipes.resize = Some(tx);
    }
    pipes.io = io;
    pipes
}

/// A terminal size as the client sends it on the resize stream: JSON
/// `{"Width":80,"Height":24}` (Go decodes field names case-insensitively, so does this).
pub fn parse_resize(bytes: &[u8]) -> Result<TerminalSize, String> {
    let v: Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    let obj = v.as_object().ok_or("a resize must be a JSON object")?;
    let field = |name: &str| -> Result<u16, String> {
        match obj.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)) {
            None => Ok(0),
            Some((_, n)) => n
                .as_u64()
                .and_then(|n| u16::try_from(n).ok())
                .ok_or_else(|| format!("{name}: not a terminal dimension: {n}")),
        }
    };
    Ok(TerminalSize {
        width: field("Width")?,
        height: field("Height")?,
    })
}

/// How a session ended, as the error channel reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The command exited 0, or the attach ended normally.
    Success,
    /// The command exited with this non-zero code.
    ExitCode {
        /// The code.
        code: i32,
        /// The command, for the message.
        command: Vec<String>,
    },
    /// The runtime could not run the command or attach.
    Failed {
        /// Exec or attach, which words the message.
        operation: Operation,
        /// What went wrong.
        error: String,
    },
}

impl Outcome {
    /// The kubelet's `metav1.Status` for the outcome: `Success`; `Failure` with reason
    /// `NonZeroExitCode` and a cause `ExitCode` carrying the code (what kubectl turns into its
    /// own exit code); or the `InternalError` the kubelet writes when the runtime fails.
    pub fn status(&self) -> Value {
        match self {
            Outcome::Success => json!({"metadata": {}, "status": "Success"}),
            Outcome::ExitCode { code, command } => json!({
                "metadata": {},
                "status": "Failure",
                "message": format!(
                    "command terminated with non-zero exit code: command '{}' exited with {code}",
                    command.join(" ")
                ),
                "reason": "NonZeroExitCode",
                "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
            }),
            Outcome::Failed { operation, error } => {
                let error = match operation {
                    Operation::Exec => format!("error executing command in container: {error}"),
                    Operation::Attach => format!("error attaching to container: {error}"),
                };
                json!({
                    "metadata": {},
                    "status": "Failure",
                    "message": format!("Internal error occurred: {error}"),
                    "reason": "InternalError",
                    "details": {"causes": [{"message": error}]},
                    "code": 500,
                })
            }
        }
    }

    /// What the protocols before v4 (which carry plain text on the error channel) send:
    /// nothing on success, else the status message.
    pub fn text(&self) -> Option<String> {
        match self {
            Outcome::Success => None,
            other => other
                .status()
                .get("message")
                .and_then(Value::as_str)
                .map(String::from),
        }
    }
}

/// Runs the session's exec or attach on its runtime with `io`, to its end.
pub async fn run(session: &Session, io: StreamIo) -> Outcome {
    let failed = |e: RuntimeError| Outcome::Failed {
        operation: session.operation,
        error: e.to_string(),
    };
    match session.operation {
        Operation::Exec => {
            let request = ExecRequest {
                container: session.container.clone(),
                command: session.options.command.clone(),
                tty: session.options.tty,
            };
            match session.runtime.exec(&session.pod, request, io).await {
                Ok(0) => Outcome::Success,
                Ok(code) => Outcome::ExitCode {
                    code,
                    command: session.options.command.clone(),
                },
                Err(e) => failed(e),
            }
        }
        Operation::Attach => match session
            .runtime
            .attach(&session.pod, &session.container, session.options.tty, io)
            .await
        {
            Ok(()) => Outcome::Success,
            Err(e) => failed(e),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn options_follow_the_kubelet() {
        let o = parse_options(
            Operation::Exec,
            &q(&[
                ("command", "sh"),
                ("command", "-c"),
                ("command", "echo hi"),
                ("stdout", "1"),
                ("stderr", "1"),
            ]),
        )
        .unwrap();
        assert_eq!(o.command, ["sh", "-c", "echo hi"]);
        assert!(o.stdout && o.stderr && !o.stdin && !o.tty);
        // A TTY merges stderr into stdout.
        let o = parse_options(
            Operation::Exec,
            &q(&[
                ("command", "sh"),
                ("stdin", "1"),
                ("stderr", "1"),
                ("tty", "1"),
            ]),
        )
        .unwrap();
        assert!(o.tty && o.stdin && !o.stderr);
        // Only "1" turns a stream on.
        let e = parse_options(
            Operation::Exec,
            &q(&[("command", "sh"), ("stdout", "true")]),
        )
        .unwrap_err();
        assert_eq!(e, "you must specify at least 1 of stdin, stdout, stderr");
        assert!(parse_options(Operation::Exec, &q(&[("stdout", "1")])).is_err());
        let o = parse_options(Operation::Attach, &q(&[("stdout", "1"), ("command", "x")])).unwrap();
        assert!(o.command.is_empty());
    }

    #[test]
    fn resizes_decode_as_go_does() {
        assert_eq!(
            parse_resize(br#"{"Width":120,"Height":40}"#).unwrap(),
            TerminalSize {
                width: 120,
                height: 40
            }
        );
        assert_eq!(parse_resize(br#"{"width":3}"#).unwrap().width, 3);
        assert!(parse_resize(b"[1,2]").is_err());
        assert!(parse_resize(br#"{"Width":-1}"#).is_err());
        assert!(parse_resize(br#"{"Width":70000}"#).is_err());
    }

    #[test]
    fn outcomes_are_the_kubelets_statuses() {
        assert_eq!(
            Outcome::Success.status(),
            json!({"metadata": {}, "status": "Success"})
        );
        assert_eq!(Outcome::Success.text(), None);
        let s = Outcome::ExitCode {
            code: 3,
            command: vec!["sh".into(), "-c".into(), "exit 3".into()],
        }
        .status();
        assert_eq!(s["reason"], "NonZeroExitCode");
        assert_eq!(
            s["details"]["causes"][0],
            json!({"reason": "ExitCode", "message": "3"})
        );
        assert_eq!(
            s["message"],
            "command terminated with non-zero exit code: command 'sh -c exit 3' exited with 3"
        );
        let s = Outcome::Failed {
            operation: Operation::Exec,
            error: "no such file".into(),
        }
        .status();
        assert_eq!(s["reason"], "InternalError");
        assert_eq!(
            s["message"],
            "Internal error occurred: error executing command in container: no such file"
        );
    }

    #[tokio::test]
    async fn pipes_carry_bytes_and_end() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let options = Options {
            stdin: true,
            stdout: true,
            ..Options::default()
        };
        let mut p = pipes(&options);
        assert!(p.stderr.is_none() && p.io.stderr.is_none() && p.resize.is_none());
        let mut stdin = p.stdin.take().unwrap();
        stdin.write_all(b"in").await.unwrap();
        drop(stdin);
        let mut got = Vec::new();
        p.io.stdin
            .take()
            .unwrap()
            .read_to_end(&mut got)
            .await
            .unwrap();
        assert_eq!(got, b"in");
        let mut out = p.io.stdout.take().unwrap();
        out.write_all(b"out").await.unwrap();
        drop(out);
        let mut got = Vec::new();
        p.stdout
            .take()
            .unwrap()
            .read_to_end(&mut got)
            .await
            .unwrap();
        assert_eq!(got, b"out");
    }
}
