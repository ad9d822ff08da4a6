//! URL helpers: the scheme, its cargo feature, and password redaction (lockcore's, shared with
//! the backends).

pub use lockcore::config::{redact_url, scheme_of};

/// The cargo feature of `locksmith` that a (lowercase) scheme needs, as the registry says
/// ([`backend_for_scheme`](crate::backend_for_scheme)): `Some("redis")` for `redis`, `rediss`,
/// `redis+cluster`, `rediss+cluster`, `redis+sentinel` and `rediss+sentinel`; `postgres` for
/// `postgres` and `postgresql`; `mysql` for `mysql` and `mariadb`; `sqlite`; `zk`; `redlock` for
/// `redlock` and `redlocks`; `etcd` for `etcd` and `etcds`. `None` for `memory` (always built
/// in) and for unknown schemes.
///
/// ```
/// assert_eq!(locksmith::feature_for_scheme("rediss+cluster"), Some("redis"));
/// assert_eq!(locksmith::feature_for_scheme("gopher"), None);
/// ```
pub fn feature_for_scheme(scheme: &str) -> Option<&'static str> {
    crate::backend_for_scheme(scheme)?.feature
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords_in_user_info() {
        for (url, want) in [
            ("redis://:pw@host:6379", "redis://:***@host:6379"),
            (
                "redis://user:pw@host:6379/0",
                "redis://user:***@host:6379/0",
            ),
            ("rediss://user:p%40ss@host", "rediss://user:***@host"),
            ("postgres://u:pw@h:5432/db", "postgres://u:***@h:5432/db"),
            ("mysql://u:a:b:c@h/db", "mysql://u:***@h/db"),
            // No password: unchanged.
            ("postgres://u@h:5432/db", "postgres://u@h:5432/db"),
            ("redis://host:6379", "redis://host:6379"),
            ("zk://h1:2181,h2:2181/chroot", "zk://h1:2181,h2:2181/chroot"),
            ("sqlite:///tmp/a@b.db", "sqlite:///tmp/a@b.db"),
            ("sqlite:x.db", "sqlite:x.db"),
            ("memory://", "memory://"),
            ("", ""),
        ] {
            assert_eq!(redact_url(url), want, "{url}");
        }
    }

    #[test]
    fn redacts_urls_that_do_not_parse() {
        for (url, want) in [
            ("redis://:p@ss@host", "redis://:***@host"),
            ("zk://u:pw@h1:1,h2:2", "zk://u:***@h1:1,h2:2"),
            ("zk://u:pw@h1:1,h2:2/chroot", "zk://u:***@h1:1,h2:2/chroot"),
            ("redis://:pa/ss@host", "redis://:***@host"),
            ("redis://:a?b#c@host", "redis://:***@host"),
            ("redis://u:12/34@host", "redis://u:***@host"),
            (
                "redis+cluster://:pw@h1:1,h2:2",
                "redis+cluster://:***@h1:1,h2:2",
            ),
            ("not a url :pw@", "not a url :pw@"),
        ] {
            assert_eq!(redact_url(url), want, "{url}");
        }
        // Without `://` there is no user info, but the query is still redacted.
        assert_eq!(
            redact_url("sqlite:x.db?password=pw&mode=rwc"),
            "sqlite:x.db?password=***&mode=rwc"
        );
    }

    #[test]
    fn redacts_secret_query_parameters() {
        assert_eq!(
            redact_url("postgres://u:pw@h/db?strategy=lease&password=pw2&sslmode=require"),
            "postgres://u:***@h/db?strategy=lease&password=***&sslmode=require"
        );
        assert_eq!(
            redact_url("redis://h/?Auth_Token=t&db=1"),
            "redis://h/?Auth_Token=***&db=1"
        );
        // A query `@` hides more than needed rather than less.
        assert!(!redact_url("postgres://u:pw@h/db?app=a@b").contains("pw"));
    }

    #[test]
    fn never_leaks_a_password_marker() {
        let marker = "Zx9Q";
        for url in [
            format!("redis://:{marker}@h"),
            format!("redis://:{marker}@@h"),
            format!("redis://u:{marker}/x?y@h:1/2"),
            format!("zk://u:{marker}@h1:1,h2:2"),
            format!("postgres://u:{marker}@h/db?password={marker}"),
            format!("mysql://h/db?pwd={marker}&x=1"),
        ] {
            assert!(!redact_url(&url).contains(marker), "{url}");
        }
    }

    /// The crate docs' table of URL parameters lists, for every registered scheme, exactly the
    /// parameters the backend's code accepts.
    #[cfg(all(
        feature = "redis",
        feature = "postgres",
        feature = "mysql",
        feature = "sqlite",
        feature = "zk",
        feature = "redlock",
        feature = "etcd"
    ))]
    #[test]
    fn the_url_parameters_table_in_the_docs_matches_the_code() {
        let docs = include_str!("lib.rs");
        let table = docs
            .split("<!-- url-params -->")
            .nth(1)
            .and_then(|t| t.split("<!-- /url-params -->").next())
            .expect("the table's markers");
        let ticked = |cell: &str| -> Vec<String> {
            cell.split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect()
        };
        let mut rows = std::collections::BTreeMap::new();
        for line in table.lines().map(|l| l.trim_start_matches("//!").trim()) {
            let Some(row) = line.strip_prefix("| `") else {
                continue;
            };
            let (schemes, params) = row.split_once(" | ").expect(line);
            for scheme in ticked(&format!("`{schemes}")) {
                let scheme = scheme.trim_end_matches("://").to_owned();
                assert!(rows.insert(scheme, ticked(params)).is_none(), "{line}");
            }
        }
        let owned = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let mut n = 0;
        for backend in crate::backends() {
            for scheme in backend.schemes {
                n += 1;
                let want = match backend.name {
                    "memory" => Vec::new(),
                    "redis" => owned(lock_redis::Config::URL_PARAMS),
                    "postgres" | "mysql" | "sqlite" => {
                        let mut all = owned(lock_sql::Config::URL_PARAMS);
                        all.extend(owned(lock_sql::sqlx_params(scheme).unwrap()));
                        if backend.name == "postgres" {
                            all.push("options[NAME]".to_owned());
                        }
                        all
                    }
                    "zk" => owned(lock_zk::Config::URL_PARAMS),
                    "etcd" => owned(lock_etcd::Config::URL_PARAMS),
                    // A master's Redis parameters, but those Redlock refuses (no replicas to
                    // wait for, no peer speaking its quorum).
                    "redlock" => ["node_timeout_ms"]
                        .into_iter()
                        .chain(lock_redis::Config::URL_PARAMS.iter().copied().filter(|p| {
                            !["min_replicas", "replica_timeout_ms", "interop"].contains(p)
                        }))
                        .map(str::to_owned)
                        .collect(),
                    other => panic!("the table does not know backend {other}"),
                };
                assert_eq!(rows.get(*scheme), Some(&want), "{scheme}://");
            }
        }
        assert_eq!(
            rows.len(),
            n,
            "the table has a scheme the registry does not"
        );
    }

    #[test]
    fn schemes() {
        assert_eq!(scheme_of("REDIS+Cluster://x").unwrap(), "redis+cluster");
        assert_eq!(scheme_of("sqlite:x.db").unwrap(), "sqlite");
        for bad in ["", "x", "://h", "1ab://h", "a b://h", "é://h"] {
            assert_eq!(
                scheme_of(bad).unwrap_err().kind(),
                lockcore::ErrorKind::InvalidConfig,
                "{bad}"
            );
        }
        assert_eq!(feature_for_scheme("postgresql"), Some("postgres"));
        assert_eq!(feature_for_scheme("memory"), None);
    }
}
