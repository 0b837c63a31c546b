//! Standard output for every command, and what a closed one means.
//!
//! Every command writes through [`stdout`] (the crate denies `print!`/`println!`, whose failure
//! is a panic). A write that fails because the reader went away (`vqos ... | head -1`: EPIPE)
//! is noted here, and `main` then ends the run quietly with [`crate::exit::CLOSED_PIPE`] instead
//! of printing the error, whatever command it was and however the error was wrapped.

use std::io::{self, StdoutLock, Write};
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once a write to stdout failed with EPIPE.
static CLOSED: AtomicBool = AtomicBool::new(false);

/// The process's stdout, locked, noting a closed pipe (see the module's documentation).
pub struct Stdout(StdoutLock<'static>);

/// Stdout for a command to write to (line-buffered: a closed pipe shows at the first line).
pub fn stdout() -> Stdout {
    Stdout(io::stdout().lock())
}

/// Whether stdout is a terminal (else a file or a pipe: no escape codes).
pub fn is_terminal() -> bool {
    io::IsTerminal::is_terminal(&io::stdout())
}

/// Whether a write to stdout has failed because its reader closed it.
pub fn closed() -> bool {
    CLOSED.load(Ordering::Relaxed)
}

/// Passes `r` on, noting an EPIPE.
fn note<T>(r: io::Result<T>) -> io::Result<T> {
    if let Err(e) = &r {
        if e.kind() == io::ErrorKind::BrokenPipe {
            CLOSED.store(true, Ordering::Relaxed);
        }
    }
    r
}

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        note(self.0.write(buf))
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        note(self.0.write_all(buf))
    }

    fn flush(&mut self) -> io::Result<()> {
        note(self.0.flush())
    }
}

/// `println!` through [`stdout`], returning the write's `io::Result` for `?`.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!($crate::out::stdout(), $($arg)*)
    }};
}

/// `print!` through [`stdout`], returning the write's `io::Result` for `?`.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        write!($crate::out::stdout(), $($arg)*)
    }};
}

pub(crate) use {out, outln};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_broken_pipe_counts_as_closed() {
        let other: io::Result<()> = Err(io::Error::other("disk full"));
        assert!(note(other).is_err());
        assert!(!closed());
        let pipe: io::Result<()> = Err(io::ErrorKind::BrokenPipe.into());
        assert!(note(pipe).is_err());
        assert!(closed());
    }
}
