//! A check every backend's configuration tests make: bad input is refused, and the refusal
//! never repeats a secret that was in it.

use std::fmt::{Debug, Display};

/// Runs `parse` on each of `inputs`, asserts that it refuses every one and that no refusal
/// (its `Display` or its `Debug`) contains `secret`; returns each input with its error, for the
/// caller to check the error's kind.
///
/// ```
/// let secret = "hunter2";
/// let bad = vec![format!("user:{secret}@"), "".to_owned()];
/// let parse = |s: &str| if s.is_empty() { Err("empty") } else { Err("no host") }.map(drop);
/// for (input, e) in faultkit::refusals_without(secret, &bad, parse) {
///     assert!(!e.is_empty(), "{input}");
/// }
/// ```
///
/// # Panics
/// When an input is accepted or its refusal shows the secret (the message names the input).
pub fn refusals_without<S: AsRef<str>, T, E: Display + Debug>(
    secret: &str,
    inputs: &[S],
    parse: impl Fn(&str) -> Result<T, E>,
) -> Vec<(String, E)> {
    inputs
        .iter()
        .map(|input| {
            let input = input.as_ref();
            let Err(e) = parse(input) else {
                panic!("{input:?} was accepted");
            };
            let shown = format!("{e} {e:?}");
            assert!(!shown.contains(secret), "{input} leaked: {shown}");
            (input.to_owned(), e)
        })
        .collect()
}
