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

/// The checks a backend's configuration file gets (JSON here; any serde format reads the same
/// struct): the file `minimal` validates to what its URL form `from_url` parses to; the file
/// `misspelled` is refused by the deserializer naming `unknown_field` (unknown keys never pass
/// silently); and each file of `bad` deserializes but is refused by `validate` as
/// [`ErrorKind::InvalidConfig`] without showing `secret` ([`refuses_without_leaking`]).
///
/// # Panics
/// When a check fails (the message says which).
pub fn file_config_checks<C, T>(
    minimal: &str,
    from_url: &T,
    (misspelled, unknown_field): (&str, &str),
    secret: &str,
    bad: &[&str],
    validate: impl Fn(C) -> lockcore::Result<T>,
) where
    C: serde::de::DeserializeOwned,
    T: PartialEq + std::fmt::Debug,
{
    let file: C = serde_json::from_str(minimal).expect("the minimal file deserializes");
    assert_eq!(
        &validate(file).expect("the minimal file validates"),
        from_url
    );
    let Err(e) = serde_json::from_str::<C>(misspelled) else {
        panic!("{misspelled} was accepted");
    };
    assert!(
        e.to_string()
            .contains(&format!("unknown field `{unknown_field}`")),
        "{e}"
    );
    let read = |text: &str| validate(serde_json::from_str::<C>(text).expect("deserializes"));
    refuses_without_leaking(secret, bad, read);
}
