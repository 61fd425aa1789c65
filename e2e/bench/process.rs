//! The bench's own child processes (the operator, agent-sandbox): found beside the bench,
//! given a free loopback port, stopped gracefully, and never outliving the bench.

use std::path::PathBuf;
use std::time::Duration;

use crate::BoxError;

/// A child process that dies with the bench, even when the bench is killed (the operator and
/// agent-sandbox must not outlive a run that was interrupted).
#[allow(unsafe_code)]
pub fn dies_with_us(cmd: &mut std::process::Command) -> &mut std::process::Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// SIGTERM, up to 5 s to exit, then SIGKILL.
#[allow(unsafe_code)]
pub fn stop_child(child: &mut std::process::Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: signalling our own child process.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    for _ in 0..50 {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A binary built beside the bench (target/<profile>/NAME).
pub fn sibling(name: &str) -> Result<PathBuf, BoxError> {
    let path = std::env::current_exe()?
        .parent()
        .ok_or("the bench binary has no directory")?
        .join(name);
    if !path.is_file() {
        return Err(format!("{} is missing: cargo build --bins", path.display()).into());
    }
    Ok(path)
}

pub fn free_port() -> Result<u16, BoxError> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}
