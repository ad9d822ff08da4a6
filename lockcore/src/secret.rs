//! Secrets from URLs (passwords) that never print.

use std::fmt;

/// A secret, such as a password taken from a URL: `Debug` and `Display` show `***`, so it can sit
/// in a configuration struct that derives `Debug` without ever reaching a log, an error or a
/// report.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret.
    pub fn new(secret: impl Into<String>) -> Self {
        Secret(secret.into())
    }

    /// The secret itself, for the one place that sends it to the server.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

/// Read from a config file or a URL like a plain string (it is never serialized back).
impl<'de> serde::Deserialize<'de> for Secret {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Secret)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"***\"")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_prints() {
        let s = Secret::new("hunter2");
        assert_eq!(s.expose(), "hunter2");
        assert!(!format!("{s:?} {s} {:?}", Some(&s)).contains("hunter2"));
    }
}
