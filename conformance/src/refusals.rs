//! A check every backend's configuration tests make: bad input is refused as
//! [`InvalidConfig`](lockcore::ErrorKind::InvalidConfig), and the refusal never repeats a secret
//! that was in it.

use lockcore::ErrorKind;

/// Runs `parse` on each of `inputs`, with `{secret}` in it replaced by `secret`, and asserts
/// that it refuses every one with [`ErrorKind::InvalidConfig`] and that no refusal (its
/// `Display` or its `Debug`) contains `secret`.
///
/// ```
/// use lockcore::Error;
/// let secret = "hunter2";
/// let bad = ["user:{secret}@", ""];
/// let parse = |s: &str| Err::<(), _>(Error::invalid_config(format!("bad input of {} bytes", s.len())));
/// conformance::refuses_without_leaking(secret, &bad, parse);
/// ```
///
/// # Panics
/// When an input is accepted, refused with another kind, or its refusal shows the secret (the
/// message names the input).
pub fn refuses_without_leaking<S: AsRef<str>, T>(
    secret: &str,
    inputs: &[S],
    parse: impl Fn(&str) -> lockcore::Result<T>,
) {
    for input in inputs {
        let input = input.as_ref().replace("{secret}", secret);
        let input = input.as_str();
        let Err(e) = parse(input) else {
            panic!("{input:?} was accepted");
        };
        assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{input}: {e}");
        let shown = format!("{e} {e:?}");
        assert!(!shown.contains(secret), "{input} leaked: {shown}");
    }
}
