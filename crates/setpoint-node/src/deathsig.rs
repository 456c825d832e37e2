//! Child processes that die with the process that started them: the kernel sends them SIGKILL
//! when their parent dies, however it dies (`PR_SET_PDEATHSIG`), so a parent killed with
//! SIGKILL leaves no daemon behind.
//!
//! The death signal follows the *thread* that forked the child, not the process: spawn from a
//! thread that lives as long as the parent (the private containerd from its supervising
//! thread, `setpoint chaos`' components from its spawner thread), never from a runtime worker
//! thread that may end first.

#![allow(unsafe_code)]

use std::os::unix::process::CommandExt;
use std::process::Command;

/// Arms `command` so that the child it spawns is SIGKILLed when the spawning thread dies, and
/// exits at once (status 1) if the parent died before the signal was armed.
pub fn die_with_parent(command: &mut Command) {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: prctl, getppid and _exit are async-signal-safe and touch no parent memory.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}
