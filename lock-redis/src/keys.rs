//! The key layout of one lock name on locksmith's own layout: the exclusive lock's keys
//! ([`Keys`]) and, beside them under the same hash tag, the keys of its shares and of its
//! exclusive waiters' queue ([`ShareKeys`]). Every script of the name gets its keys from here.

use lockcore::LockName;

/// The keys and channel of one lock name: `<namespace>:{<escaped name>}:lock`,
/// `<namespace>:{<escaped name>}:fence` and the channel `<namespace>:{<escaped name>}:released`.
/// The hash tag is [`LockName::escaped`], which never contains `{` or `}`.
#[derive(Clone, Debug)]
pub struct Keys {
    /// The lock key (value: the owner token; TTL: the lease).
    pub lock: String,
    /// The holder metadata key (`"<token> <metadata>"`, the lock's TTL).
    pub holder: String,
    /// The fencing counter key (no TTL).
    pub fence: String,
    /// The pub/sub channel a release publishes on.
    pub channel: String,
    /// The hash tag (the escaped name).
    pub tag: String,
}

impl Keys {
    /// The keys of `name` under `namespace`.
    pub fn new(namespace: &str, name: &LockName) -> Keys {
        let tag = name.escaped();
        Keys {
            lock: format!("{namespace}:{{{tag}}}:lock"),
            holder: format!("{namespace}:{{{tag}}}:holder"),
            fence: format!("{namespace}:{{{tag}}}:fence"),
            channel: format!("{namespace}:{{{tag}}}:released"),
            tag,
        }
    }
}

/// Appends the key `<namespace>:{<escaped name>}:<suffix>` of [`Keys::new`]'s layout to `out`
/// (`suffix`: `lock`, `holder`, ...): for a batch deriving many keys into one reused buffer.
pub(crate) fn push_key(out: &mut String, namespace: &str, name: &LockName, suffix: &str) {
    out.push_str(namespace);
    out.push_str(":{");
    name.escape_into(out);
    out.push_str("}:");
    out.push_str(suffix);
}

/// The share and queue keys beside a lock's keys (same hash tag).
#[derive(Clone, Debug)]
pub(crate) struct ShareKeys {
    pub(crate) shares: String,
    pub(crate) info: String,
    pub(crate) writer: String,
    /// The exclusive waiters' queue: owner token → arrival (server µs).
    pub(crate) queue: String,
    /// The same waiters: owner token → when the entry expires (server ms).
    pub(crate) queue_exp: String,
    /// What a release needs to grant the lock to a queued waiter (`handover=grant`): owner
    /// token → `"<attempt> <claim ms> <fencing 0|1> <holder metadata>"` (see `queue`).
    pub(crate) grants: String,
}

impl ShareKeys {
    pub(crate) fn of(keys: &Keys) -> ShareKeys {
        let base = keys.lock.strip_suffix(":lock").unwrap_or(&keys.lock);
        ShareKeys {
            shares: format!("{base}:shares"),
            info: format!("{base}:shareinfo"),
            writer: format!("{base}:writer"),
            queue: format!("{base}:queue"),
            queue_exp: format!("{base}:queuexp"),
            grants: format!("{base}:grants"),
        }
    }

    /// The eight keys of the share scripts and of the exclusive scripts behind the writer
    /// check (the queue's two last): lock, holder, fence, shares, share info, waiting writer,
    /// queue, queue expiries.
    pub(crate) fn with<'a>(&'a self, keys: &'a Keys) -> [&'a str; 8] {
        [
            &keys.lock,
            &keys.holder,
            &keys.fence,
            &self.shares,
            &self.info,
            &self.writer,
            &self.queue,
            &self.queue_exp,
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_a_slot_and_ignore_user_braces() {
        let k = Keys::new("ns", &LockName::new("{a}x").unwrap());
        assert_eq!(k.lock, "ns:{%7Ba%7Dx}:lock");
        assert_eq!(k.fence, "ns:{%7Ba%7Dx}:fence");
        let plain = Keys::new("ns", &LockName::new("a").unwrap());
        assert_eq!(plain.lock, "ns:{a}:lock");
        assert_ne!(k.lock, plain.lock);
    }

    #[test]
    fn share_keys_keep_the_lock_hash_tag() {
        let keys = Keys::new("ns", &LockName::new("a/b").unwrap());
        let s = ShareKeys::of(&keys);
        let tag = format!("{{{}}}", keys.tag);
        for k in [
            &s.shares,
            &s.info,
            &s.writer,
            &s.queue,
            &s.queue_exp,
            &s.grants,
        ] {
            assert!(k.contains(&tag), "{k}");
        }
    }
}
