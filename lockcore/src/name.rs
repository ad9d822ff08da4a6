//! Validated lock names and their safe mapping into backend key spaces.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use crate::{Error, Result};

/// The longest lock name accepted, in bytes of UTF-8.
pub const MAX_NAME_LEN: usize = 255;

/// A validated lock name: 1 to [`MAX_NAME_LEN`] bytes of UTF-8 without control characters.
///
/// Any other text is allowed (`../x`, `a/b`, quotes, `{tag}`, `*`, `%`, unicode): backends never
/// paste the name into a path, SQL or a key pattern; they use [`LockName::escaped`], a hash, or a
/// bound parameter, so every valid name is its own independent lock.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockName(Arc<str>);

impl LockName {
    /// Validates `name`.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidName`](crate::ErrorKind::InvalidName) when the name is empty, longer
    /// than [`MAX_NAME_LEN`] bytes, or contains a control character (NUL included).
    pub fn new(name: impl AsRef<str>) -> Result<Self> {
        let name = name.as_ref();
        if name.is_empty() {
            return Err(Error::invalid_name("lock name is empty"));
        }
        if name.len() > MAX_NAME_LEN {
            return Err(Error::invalid_name(format!(
                "lock name is {} bytes long; at most {MAX_NAME_LEN} are allowed",
                name.len()
            )));
        }
        if let Some(c) = name.chars().find(|c| c.is_control()) {
            return Err(Error::invalid_name(format!(
                "lock name contains the control character {:?}",
                c
            )));
        }
        Ok(LockName(name.into()))
    }

    /// The name as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// An injective escaping of the name into `[A-Za-z0-9_-]` plus `%XX`, with every other byte
    /// (including `.`, `/`, `{`, `}`, `%`, quotes) percent-encoded. Safe as one path segment (it
    /// can never be `.` or `..`), inside a Redis key without choosing a hash slot, and in a
    /// filename. At most three times [`MAX_NAME_LEN`] bytes long.
    pub fn escaped(&self) -> String {
        let mut out = String::with_capacity(self.0.len());
        self.escape_into(&mut out);
        out
    }

    /// Appends [`LockName::escaped`] to `out`: for callers that derive many keys into one
    /// reused buffer (a batch of renewals) instead of a new string per name.
    pub fn escape_into(&self, out: &mut String) {
        for b in self.0.bytes() {
            if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
                out.push(b as char);
            } else {
                out.push('%');
                out.push(
                    char::from_digit((b >> 4) as u32, 16)
                        .unwrap()
                        .to_ascii_uppercase(),
                );
                out.push(
                    char::from_digit((b & 15) as u32, 16)
                        .unwrap()
                        .to_ascii_uppercase(),
                );
            }
        }
    }

    /// Reverses [`LockName::escaped`]; `None` if `escaped` is not such an escaping.
    pub fn from_escaped(escaped: &str) -> Option<LockName> {
        let bytes = escaped.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'%' {
                let hex = escaped.get(i + 1..i + 3)?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            } else {
                out.push(bytes[i]);
                i += 1;
            }
        }
        LockName::new(String::from_utf8(out).ok()?).ok()
    }
}

impl fmt::Debug for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for LockName {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        LockName::new(s)
    }
}

impl TryFrom<&str> for LockName {
    type Error = Error;
    fn try_from(s: &str) -> Result<Self> {
        LockName::new(s)
    }
}

impl TryFrom<String> for LockName {
    type Error = Error;
    fn try_from(s: String) -> Result<Self> {
        LockName::new(s)
    }
}

impl AsRef<str> for LockName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// Anything that names a lock: a [`LockName`] (already valid) or text (validated on use).
pub trait IntoLockName {
    /// Validates and converts.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidName`](crate::ErrorKind::InvalidName), see [`LockName::new`].
    fn into_lock_name(self) -> Result<LockName>;
}

impl IntoLockName for LockName {
    fn into_lock_name(self) -> Result<LockName> {
        Ok(self)
    }
}

impl IntoLockName for &LockName {
    fn into_lock_name(self) -> Result<LockName> {
        Ok(self.clone())
    }
}

impl IntoLockName for &str {
    fn into_lock_name(self) -> Result<LockName> {
        LockName::new(self)
    }
}

impl IntoLockName for String {
    fn into_lock_name(self) -> Result<LockName> {
        LockName::new(self)
    }
}

impl IntoLockName for &String {
    fn into_lock_name(self) -> Result<LockName> {
        LockName::new(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn rejects_bad_names() {
        for bad in ["", "a\0b", "tab\there", "nl\n", "\u{7f}", "\u{85}x"] {
            assert_eq!(
                LockName::new(bad).unwrap_err().kind(),
                ErrorKind::InvalidName,
                "{bad:?}"
            );
        }
        let long = "x".repeat(MAX_NAME_LEN + 1);
        assert_eq!(
            LockName::new(long).unwrap_err().kind(),
            ErrorKind::InvalidName
        );
        assert!(LockName::new("x".repeat(MAX_NAME_LEN)).is_ok());
        // 255 bytes counted in UTF-8, not chars.
        assert!(LockName::new("é".repeat(128)).is_err());
    }

    #[test]
    fn escaping_is_injective_and_safe() {
        let names = [
            "a",
            "../x",
            "a/b",
            "a%2Fb",
            "{tag}",
            "*",
            "'; DROP TABLE locks; --",
            "é",
            ".",
            "..",
        ];
        let mut seen = std::collections::HashSet::new();
        for n in names {
            let name = LockName::new(n).unwrap();
            let e = name.escaped();
            assert!(
                e.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_-%".contains(&b)),
                "{e}"
            );
            assert!(!e.contains('.') && !e.contains('/') && !e.contains('{'));
            assert_eq!(LockName::from_escaped(&e).unwrap(), name);
            assert!(seen.insert(e));
        }
    }
}
