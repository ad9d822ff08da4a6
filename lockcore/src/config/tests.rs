use super::*;
use crate::ErrorKind;
use std::time::Duration;

#[derive(serde::Deserialize, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
struct Opts {
    #[serde(default)]
    flag: bool,
    #[serde(default)]
    secret: Option<crate::Secret>,
    #[serde(rename = "poll_ms", with = "millis", default)]
    poll: Duration,
    #[serde(default)]
    ratio: f64,
    #[serde(default)]
    kind: Option<Kind>,
}

#[derive(serde::Deserialize, Debug, PartialEq)]
#[serde(rename_all = "kebab-case")]
enum Kind {
    RowLock,
    Lease,
}

#[test]
fn pairs_parse_into_typed_fields() {
    let pairs = query_pairs(
        "t",
        "flag=true&secret=hunter%402&poll_ms=250&ratio=0.5&kind=row-lock",
    )
    .unwrap();
    let o: Opts = from_pairs("t", pairs).unwrap();
    assert!(o.flag);
    assert_eq!(o.secret.as_ref().unwrap().expose(), "hunter@2");
    assert_eq!(o.poll, Duration::from_millis(250));
    assert_eq!(o.ratio, 0.5);
    assert_eq!(o.kind, Some(Kind::RowLock));
    assert!(!format!("{o:?}").contains("hunter"));
}

#[test]
fn bad_pairs_are_invalid_config_without_values() {
    for q in [
        "nope=1",
        "poll_ms=abc",
        "poll_ms=-1",
        "flag=maybe",
        "poll_ms=1&poll_ms=2",
        "kind=advisory",
        "poll_ms",
        "Sekrit=1",
        "x=%ff",
    ] {
        let e = query_pairs("t", q)
            .and_then(|p| from_pairs::<Opts>("t", p))
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{q}");
        assert!(
            !e.to_string().contains("abc") && !e.to_string().contains("Sekrit"),
            "{e}"
        );
    }
}

#[test]
fn the_query_reader_refuses_unknown_repeated_and_malformed_parameters() {
    #[derive(serde::Deserialize, Debug, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Url {
        hosts: Vec<String>,
        #[serde(default)]
        namespace: Option<String>,
        #[serde(rename = "poll_ms", with = "millis", default)]
        poll: Duration,
    }
    let known = &["namespace", "poll_ms"];
    let u: Url = from_query("t URL", "namespace=a%2Fb&poll_ms=7", known, &["hosts"]).unwrap();
    assert_eq!(
        u,
        Url {
            hosts: vec![],
            namespace: Some("a/b".into()),
            poll: Duration::from_millis(7)
        }
    );
    let u: Url = from_query("t URL", "", known, &["hosts"]).unwrap();
    assert_eq!(u.namespace, None);
    for (q, says) in [
        (
            "hosts=h",
            "unknown query parameter `hosts` (known: namespace, poll_ms)",
        ),
        ("bogus=hunter2", "unknown query parameter `bogus`"),
        (
            "namespace=a&namespace=hunter2",
            "duplicate field `namespace`",
        ),
        (
            "poll_ms=hunter2",
            "`poll_ms` must be a non-negative whole number",
        ),
        ("hunter2", "no `=value`"),
        ("Hunter2=1", "malformed"),
    ] {
        let e = from_query::<Url>("t URL", q, known, &["hosts"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{q}");
        let shown = format!("{e} {e:?}");
        assert!(e.message().starts_with("t URL: "), "{q}: {shown}");
        assert!(shown.contains(says), "{q}: {shown}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("Hunter2"),
            "{q}: {shown}"
        );
    }
}

#[test]
fn urls_split_into_parts() {
    let p = UrlParts::split(
        "t",
        "Redis://u:p%40w@h1:1,[::1]:2/3/x?a=1&b=2",
        UserInfoAt::HostPart,
    )
    .unwrap();
    assert_eq!(
        p,
        UrlParts {
            scheme: "Redis",
            userinfo: Some("u:p%40w"),
            hosts: "h1:1,[::1]:2",
            path: "/3/x",
            query: "a=1&b=2",
        }
    );
    // A password with `/`, `?` and `@` unencoded: only up to the last `@` of the URL.
    let p = UrlParts::split("t", "etcd://u:p/w?x@d@h:1/ns?ca=y", UserInfoAt::LastAt).unwrap();
    assert_eq!(
        (p.userinfo, p.hosts, p.path, p.query),
        (Some("u:p/w?x@d"), "h:1", "/ns", "ca=y")
    );
    let p = UrlParts::split("t", "zk://h", UserInfoAt::HostPart).unwrap();
    assert_eq!((p.userinfo, p.hosts, p.path, p.query), (None, "h", "", ""));
    for bad in ["zk:h", "redis://u:hunter2@h#x", ""] {
        let e = UrlParts::split("t", bad, UserInfoAt::HostPart).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidConfig);
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }
}

#[derive(serde::Deserialize, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
struct Addressed {
    hosts: Vec<String>,
    #[serde(default)]
    flag: bool,
}

#[test]
fn url_parts_give_the_scheme_the_query_and_the_hosts() {
    let p = UrlParts::split("t", "ETCDS://h1:1,h2?flag=true", UserInfoAt::LastAt).unwrap();
    assert_eq!(
        p.scheme_among(&["etcd", "etcds"], "etcd:// or etcds://")
            .unwrap(),
        1
    );
    let e = p.scheme_among(&["zk"], "zk:// only").unwrap_err();
    assert_eq!(
        (e.kind(), e.to_string().contains("zk:// only")),
        (ErrorKind::InvalidConfig, true)
    );
    let (config, hosts): (Addressed, _) = p.query_and_hosts("t", &["flag"], "hosts").unwrap();
    assert_eq!(
        config,
        Addressed {
            hosts: Vec::new(),
            flag: true
        }
    );
    assert_eq!(hosts, ["h1:1", "h2"]);
    for bad in ["zk:///x", "zk://h?hosts=a", "zk://h?nope=1"] {
        let p = UrlParts::split("t", bad, UserInfoAt::HostPart).unwrap();
        let e = p
            .query_and_hosts::<Addressed>("t", &["flag"], "hosts")
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{bad}");
    }
}

#[test]
fn user_info_decodes_into_a_secret() {
    let (user, password) = decode_userinfo("t", "me:p%40ss%3Aw").unwrap();
    assert_eq!(user, "me");
    assert_eq!(password.as_ref().unwrap().expose(), "p@ss:w");
    assert!(!format!("{password:?}").contains("p@ss"));
    assert_eq!(decode_userinfo("t", "me").unwrap(), ("me".into(), None));
    let (user, password) = decode_userinfo("t", ":").unwrap();
    assert_eq!((user.as_str(), password.unwrap().expose()), ("", ""));
    let e = decode_userinfo("t", "me:hunter2%FF").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidConfig);
    assert!(e.to_string().contains("password") && !e.to_string().contains("hunter2"));
    assert_eq!(
        redacted_userinfo(Some("me"), Some(&Secret::new("hunter2"))),
        "me:***@"
    );
    assert_eq!(redacted_userinfo(None, Some(&Secret::new("x"))), ":***@");
    assert_eq!(redacted_userinfo(Some("me"), None), "me@");
    assert_eq!(redacted_userinfo(None, None), "");
}

#[test]
fn hosts_durations_and_segments() {
    assert_eq!(
        parse_hosts("t", "h1:1,[::1]:2,h3", 2181).unwrap(),
        ["h1:1", "[::1]:2", "h3:2181"]
    );
    for bad in [
        "", "h,,g", "h:0", "h:99999", "h:x", "[zz]:1", "[::1", "[::1]x", "a b",
    ] {
        let e = parse_hosts("t", bad, 1).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{bad}");
    }
    assert_eq!(host_port("::1", 6379), "[::1]:6379");
    assert_eq!(host_port("h", 6379), "h:6379");
    assert!(check_millis("t", "poll_ms", Duration::from_millis(10), 10, 20).is_ok());
    let e = check_millis("t", "poll_ms", Duration::from_millis(21), 10, 20).unwrap_err();
    assert_eq!(
        e.message(),
        "t: `poll_ms` must be a whole number of milliseconds in 10..=20"
    );
    assert!(is_segment("a-b_c.d") && !is_segment("..") && !is_segment("a/b"));
    assert!(!is_segment(""));
}

#[test]
fn secret_parameters_and_urls_are_redacted() {
    for key in [
        "password",
        "sslpassword",
        "PWD",
        "auth_token",
        "sslkey",
        "credentials",
    ] {
        assert!(is_secret_param(key), "{key}");
    }
    assert!(!is_secret_param("sslmode") && !is_secret_param("namespace"));
    assert_eq!(
        redact_url("etcds://u:hunter2@h/x?credentials=c&ca=y"),
        "etcds://u:***@h/x?credentials=***&ca=y"
    );
    assert_eq!(scheme_of("ZK://h").unwrap(), "zk");
    assert_eq!(
        scheme_of("hunter2").unwrap_err().kind(),
        ErrorKind::InvalidConfig
    );
}
