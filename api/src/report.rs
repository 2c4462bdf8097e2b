//! An error and its causes as one line, for the messages that leave the process (a `Status`
//! message, a condition, an Event, the last line of a failed command). An error's own message
//! names what failed and never repeats its source, so the causes appear here each once; logs
//! record the error itself (`error = &e as &dyn Error`), which lists the causes the same way.

use std::error::Error;
use std::fmt;

/// `error`'s message, then each cause's, `: `-separated.
pub fn chain(error: &(dyn Error + 'static)) -> String {
    Chain(error).to_string()
}

/// Displays an error with its causes (see [`chain`]).
#[derive(Debug, Clone, Copy)]
pub struct Chain<'a>(pub &'a (dyn Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}
