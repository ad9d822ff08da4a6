//! One error type, with kinds shared by every backend.

use std::fmt;

/// What went wrong, independent of the backend.
///
/// Contention is not an error: `try_lock` on a held lock returns `Ok(None)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The lock name is empty, too long, or contains characters that are not allowed.
    InvalidName,
    /// An option, TTL or URL is malformed or out of range.
    InvalidConfig,
    /// `lock()` did not get the lock before its wait deadline.
    Timeout,
    /// Release or extend of a lease that is no longer the caller's (expired, taken over or
    /// already released). Nothing was changed.
    NotHeld,
    /// The backend cannot do what was asked (for example fencing tokens or FIFO waiting).
    Unsupported,
    /// The backend could not be reached or did not answer in time; the outcome may be unknown.
    Unavailable,
    /// The backend answered with an error that fits no other kind.
    Backend,
    /// The name is held in a way this acquisition cannot join: as a semaphore with another
    /// permit limit, or as a semaphore by some and a mutex or read-write lock by others. Not
    /// contention: waiting would not help. Nothing was changed.
    Conflict,
    /// The server refused the credentials: a wrong user or password, none given where the
    /// server needs them, or a user without the rights for the lock's commands (Redis
    /// `WRONGPASS`/`NOAUTH`/`NOPERM`, PostgreSQL 28P01/28000, MySQL/MariaDB 1045, etcd's
    /// authentication and permission errors, ZooKeeper `AuthFailed`/`NoAuth`). The same kind on
    /// every backend; retrying does not help. Nothing was changed.
    Auth,
    /// The tokio runtime the [`Locker`](crate::Locker) was made on has shut down (a `static`
    /// locker shared by `#[tokio::test]`s, each with a runtime of its own): its connections,
    /// renewals and background releases ran there. Refused before any I/O; make a locker on the
    /// runtime that uses it.
    RuntimeGone,
}

impl ErrorKind {
    /// A short stable name for logs and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidName => "invalid name",
            ErrorKind::InvalidConfig => "invalid config",
            ErrorKind::Timeout => "timeout",
            ErrorKind::NotHeld => "not held",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Backend => "backend error",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Auth => "authentication failed",
            ErrorKind::RuntimeGone => "runtime gone",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The error of every locksmith operation: a kind, a message and, where there is one, the
/// client error it came from ([`source()`](std::error::Error::source)).
///
/// `Display` (`{}`) prints the kind and message only, never the source's text: error reporters
/// that walk `source()` (anyhow, eyre) print each cause once. Print `{:#}` to get the whole chain
/// in one line (`unavailable: connecting to cache:6379: connection refused`).
pub struct Error {
    kind: ErrorKind,
    message: String,
    source: Option<BoxError>,
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A new error of `kind`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// Attaches the underlying error.
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// The kind of error.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message, without the kind.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Shorthand for an [`ErrorKind::InvalidName`] error.
    pub fn invalid_name(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::InvalidName, message)
    }

    /// Shorthand for an [`ErrorKind::InvalidConfig`] error.
    pub fn invalid_config(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::InvalidConfig, message)
    }

    /// Shorthand for an [`ErrorKind::NotHeld`] error.
    pub fn not_held(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::NotHeld, message)
    }

    /// Shorthand for an [`ErrorKind::Unsupported`] error.
    pub fn unsupported(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Unsupported, message)
    }

    /// Shorthand for an [`ErrorKind::Unavailable`] error with its source.
    pub fn unavailable(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Error::new(ErrorKind::Unavailable, message).with_source(source)
    }

    /// Shorthand for an [`ErrorKind::Backend`] error with its source.
    pub fn backend(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Error::new(ErrorKind::Backend, message).with_source(source)
    }

    /// Shorthand for an [`ErrorKind::Conflict`] error.
    pub fn conflict(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Conflict, message)
    }

    /// Shorthand for an [`ErrorKind::Auth`] error with its source.
    pub fn auth(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Error::new(ErrorKind::Auth, message).with_source(source)
    }

    /// Shorthand for an [`ErrorKind::Timeout`] error.
    pub fn timeout(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Timeout, message)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Error");
        d.field("kind", &self.kind).field("message", &self.message);
        if let Some(source) = &self.source {
            // The whole chain: `{:?}` is for debugging, and the source's own `Display` may
            // leave its causes to `source()`, as this type's does.
            d.field("source", &format_args!("{}", ChainDisplay(&**source)));
        }
        d.finish()
    }
}

/// An error and its causes on one line, `error: cause: cause of the cause`, each cause once,
/// with any URL or secret parameter a client's text may echo redacted
/// ([`redact_text`](crate::secret::redact_text)).
///
/// Some client errors print their cause in their own `Display` and return it from `source()`
/// too (the Redis client's I/O and server errors print exactly their source's text): a cause
/// whose text ends what was printed before it is not printed again.
struct ChainDisplay<'a>(&'a (dyn std::error::Error + 'static));

impl fmt::Display for ChainDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = |e: &dyn std::error::Error| crate::secret::redact_text(&e.to_string());
        let mut previous = shown(self.0);
        f.write_str(&previous)?;
        let mut cause = self.0.source();
        while let Some(e) = cause {
            let text = shown(e);
            if !previous.ends_with(&text) {
                write!(f, ": {text}")?;
            }
            previous = text;
            cause = e.source();
        }
        Ok(())
    }
}

/// `{}` shows this error alone (`kind: message`): its cause is reported by
/// [`source()`](std::error::Error::source), so that chain printers (anyhow, eyre, `{:#}` of
/// either) show each cause once. `{:#}` shows the whole chain on one line
/// (`kind: message: cause: cause of the cause`), for logs and messages that print a single value.
impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.message)?;
        if f.alternate()
            && let Some(source) = &self.source
        {
            // Each cause shown alone (`{}`): a cause that is itself a locksmith `Error` must not
            // print its own source again.
            write!(f, ": {}", ChainDisplay(&**source))?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// Why [`Locker::with_lock`](crate::Locker::with_lock) did not return the work's output: three
/// outcomes a caller handles differently.
///
/// Converts into [`Error`] (for `?` in functions returning [`Result`]), dropping the output of
/// [`WithLockError::ReleaseFailed`]; it is a [`std::error::Error`] itself when `T: Debug` (for
/// anyhow and eyre, which also need `T: Send + Sync + 'static`).
#[derive(Debug)]
#[non_exhaustive]
pub enum WithLockError<T> {
    /// The lock was not acquired (the errors of [`Locker::lock`](crate::Locker::lock)); the work
    /// did not run.
    NotAcquired(Error),
    /// The lease was lost while the work ran: the work was dropped at its next await point and
    /// did not finish, so whatever it did after its last completed write must not be assumed.
    /// `error` is of kind [`ErrorKind::NotHeld`] and names the reason.
    Lost {
        /// Why the lease was lost.
        reason: crate::LostReason,
        /// The same as an [`Error`] (kind `NotHeld`).
        error: Error,
    },
    /// The work finished and returned `output`, but releasing the lock failed: `NotHeld` if the
    /// lease ran out or was taken over after the work finished, `Unavailable` or `Backend` if the
    /// release could not be confirmed (the lock then frees after its TTL).
    ReleaseFailed {
        /// What the work returned.
        output: T,
        /// The release's error.
        error: Error,
    },
}

impl<T> WithLockError<T> {
    /// The kind of the underlying error: `NotHeld` for [`WithLockError::Lost`], the release's
    /// kind for [`WithLockError::ReleaseFailed`].
    pub fn kind(&self) -> ErrorKind {
        self.error().kind()
    }

    /// The underlying error.
    pub fn error(&self) -> &Error {
        match self {
            WithLockError::NotAcquired(error)
            | WithLockError::Lost { error, .. }
            | WithLockError::ReleaseFailed { error, .. } => error,
        }
    }

    /// The work's output, if it finished ([`WithLockError::ReleaseFailed`]).
    pub fn into_output(self) -> Option<T> {
        match self {
            WithLockError::ReleaseFailed { output, .. } => Some(output),
            _ => None,
        }
    }

    /// Why the lease was lost, for [`WithLockError::Lost`].
    pub fn lost_reason(&self) -> Option<crate::LostReason> {
        match self {
            WithLockError::Lost { reason, .. } => Some(*reason),
            _ => None,
        }
    }
}

/// `NotAcquired` and `Lost` show their error (`{:#}` its chain); `ReleaseFailed` says the work
/// finished, with the release's error as its source.
impl<T> fmt::Display for WithLockError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WithLockError::NotAcquired(e) | WithLockError::Lost { error: e, .. } => {
                fmt::Display::fmt(e, f)
            }
            WithLockError::ReleaseFailed { .. } => {
                f.write_str("the work under the lock finished, but releasing the lock failed")?;
                if f.alternate() {
                    write!(f, ": {:#}", self.error())?;
                }
                Ok(())
            }
        }
    }
}

impl<T: fmt::Debug> std::error::Error for WithLockError<T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            // Transparent: the error's own source.
            WithLockError::NotAcquired(e) | WithLockError::Lost { error: e, .. } => {
                std::error::Error::source(e)
            }
            WithLockError::ReleaseFailed { error, .. } => Some(error),
        }
    }
}

/// Drops the output of [`WithLockError::ReleaseFailed`]; its error keeps the release's kind and
/// says that the work finished, with the release's error as its source.
impl<T> From<WithLockError<T>> for Error {
    fn from(e: WithLockError<T>) -> Error {
        match e {
            WithLockError::NotAcquired(e) | WithLockError::Lost { error: e, .. } => e,
            WithLockError::ReleaseFailed { error, .. } => Error::new(
                error.kind(),
                "the work under the lock finished, but releasing the lock failed",
            )
            .with_source(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    /// Every kind (a new kind fails to compile here until it is added).
    fn every_kind() -> Vec<ErrorKind> {
        let all = vec![
            ErrorKind::InvalidName,
            ErrorKind::InvalidConfig,
            ErrorKind::Timeout,
            ErrorKind::NotHeld,
            ErrorKind::Unsupported,
            ErrorKind::Unavailable,
            ErrorKind::Backend,
            ErrorKind::Conflict,
            ErrorKind::Auth,
            ErrorKind::RuntimeGone,
        ];
        for k in &all {
            match k {
                ErrorKind::InvalidName
                | ErrorKind::InvalidConfig
                | ErrorKind::Timeout
                | ErrorKind::NotHeld
                | ErrorKind::Unsupported
                | ErrorKind::Unavailable
                | ErrorKind::Backend
                | ErrorKind::Conflict
                | ErrorKind::Auth
                | ErrorKind::RuntimeGone => {}
            }
        }
        all
    }

    /// What anyhow and eyre print: each error of the chain with `{}`.
    fn chain(e: &(dyn std::error::Error + 'static)) -> Vec<String> {
        let mut out = vec![e.to_string()];
        let mut cause = e.source();
        while let Some(c) = cause {
            out.push(c.to_string());
            cause = c.source();
        }
        out
    }

    /// Issue 21: `Display` included the source's text and `source()` returned it, so chain
    /// printers showed every cause twice.
    #[test]
    fn a_printed_chain_shows_each_cause_once() {
        for kind in every_kind() {
            let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused by peer");
            let inner = Error::new(ErrorKind::Backend, "server said no").with_source(io);
            let e = Error::new(kind, "connecting to cache:6379").with_source(inner);
            let segments = chain(&e);
            assert_eq!(segments.len(), 3, "{segments:?}");
            for (i, outer) in segments.iter().enumerate() {
                for inner in &segments[i + 1..] {
                    assert!(
                        !outer.contains(inner.as_str()),
                        "{kind:?}: {inner:?} is printed in {outer:?} and again as its source: {segments:?}"
                    );
                }
            }
            assert_eq!(segments[0], format!("{kind}: connecting to cache:6379"));
            // `{:#}` is the one-line chain, each cause once.
            assert_eq!(
                format!("{e:#}"),
                format!(
                    "{kind}: connecting to cache:6379: backend error: server said no: refused by peer"
                )
            );
            assert!(e.source().is_some());
            // `{:?}` shows the whole chain too.
            assert!(format!("{e:?}").contains("refused by peer"), "{e:?}");
        }
        // Shorthands that take a source keep it out of `Display` too.
        for e in [
            Error::unavailable("connect", "refused by peer"),
            Error::backend("query", "refused by peer"),
        ] {
            assert!(!e.to_string().contains("refused by peer"), "{e}");
            assert_eq!(
                e.source().map(|s| s.to_string()).as_deref(),
                Some("refused by peer")
            );
        }
    }

    /// An error that prints its source's text as its own and returns it from `source()` too,
    /// as the Redis client's errors do.
    #[derive(Debug)]
    struct Echo(std::io::Error);

    impl fmt::Display for Echo {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            self.0.fmt(f)
        }
    }

    impl std::error::Error for Echo {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    /// A client error that echoes its URL shows it redacted, in `{:#}` and `{:?}`.
    #[test]
    fn a_cause_that_echoes_a_url_shows_it_redacted() {
        let e = Error::unavailable("connecting", "cannot reach redis://app:s3cret@cache:6379/0");
        for shown in [format!("{e:#}"), format!("{e:?}")] {
            assert!(!shown.contains("s3cret"), "{shown}");
            assert!(shown.contains("redis://app:***@cache:6379/0"), "{shown}");
        }
    }

    /// Issue 37: with `{:#}`, a Redis error printed its cause twice
    /// (`unavailable: connect: Connection refused: Connection refused`).
    #[test]
    fn a_cause_that_echoes_its_source_is_printed_once() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        let e = Error::unavailable("connecting to cache:6379", Echo(io));
        assert_eq!(
            format!("{e:#}"),
            "unavailable: connecting to cache:6379: Connection refused"
        );
        assert_eq!(
            format!("{e:?}"),
            "Error { kind: Unavailable, message: \"connecting to cache:6379\", source: Connection refused }"
        );
    }
}
