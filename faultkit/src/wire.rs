//! Just enough of the client side of a few wire protocols for a [`Proxy`](crate::Proxy) to
//! count a client's requests and to answer its keepalives: where one message ends, whether it
//! is a request, and the reply to a keepalive.

/// A protocol a [`Proxy`](crate::Proxy) started with [`Proxy::start_with_wire`] parses on the
/// client-to-server direction. The client must speak it in the clear (no TLS).
///
/// [`Proxy::start_with_wire`]: crate::Proxy::start_with_wire
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wire {
    /// PostgreSQL frontend messages (the URL must say `sslmode=disable`): a request (a round
    /// trip) ends with `Sync` (`S`) or is a simple `Query` (`Q`). No keepalives.
    Postgres,
    /// MySQL/MariaDB client packets (the URL must say `ssl-mode=disabled`): a request is a
    /// packet with sequence id 0 (a command). No keepalives.
    MySql,
    /// ZooKeeper client frames (4-byte length, then xid and opcode): a request is any frame
    /// after the connect request except pings (the session's keepalive, answered by
    /// [`ProxyMode::AnswerKeepalives`](crate::ProxyMode::AnswerKeepalives)) and syncs (a
    /// client's heartbeat to the leader, as lock-zk sends while it holds leases).
    ZooKeeper,
}

/// One complete client message, as far as the proxy cares.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Message {
    /// A request (counted).
    Request,
    /// A keepalive, and what the server would answer.
    Keepalive(Vec<u8>),
    /// Anything else (start-up, authentication, a message inside a request).
    Other,
}

const ZK_PING_XID: i32 = -2;
const ZK_PING_OP: i32 = 11;
const ZK_SYNC_OP: i32 = 9;

/// The reply to a ZooKeeper ping: length 16, xid -2, zxid 0 (ignored by clients on pings),
/// error 0.
fn zk_ping_reply() -> Vec<u8> {
    let mut r = Vec::with_capacity(20);
    r.extend_from_slice(&16u32.to_be_bytes());
    r.extend_from_slice(&ZK_PING_XID.to_be_bytes());
    r.extend_from_slice(&0i64.to_be_bytes());
    r.extend_from_slice(&0i32.to_be_bytes());
    r
}

fn be_i32(b: &[u8]) -> i32 {
    i32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// Splits one connection's client byte stream into messages (a message may span reads, a
/// read may hold several).
#[derive(Debug)]
pub(crate) struct Parser {
    wire: Wire,
    pending: Vec<u8>,
    /// Messages seen so far (the first is a start-up message in PostgreSQL and ZooKeeper).
    seen: u64,
}

impl Parser {
    pub(crate) fn new(wire: Wire) -> Self {
        Parser {
            wire,
            pending: Vec::new(),
            seen: 0,
        }
    }

    /// Feeds the bytes of one read; returns the messages they completed.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Vec<Message> {
        self.pending.extend_from_slice(bytes);
        let mut out = Vec::new();
        loop {
            let p = &self.pending;
            let first = self.seen == 0;
            let (len, kind) = match self.wire {
                Wire::Postgres if first => {
                    if p.len() < 4 {
                        break;
                    }
                    (be_i32(p) as usize, Message::Other)
                }
                Wire::Postgres => {
                    if p.len() < 5 {
                        break;
                    }
                    let kind = if p[0] == b'S' || p[0] == b'Q' {
                        Message::Request
                    } else {
                        Message::Other
                    };
                    (be_i32(&p[1..]) as usize + 1, kind)
                }
                Wire::MySql => {
                    if p.len() < 4 {
                        break;
                    }
                    let len = (p[0] as usize) | (p[1] as usize) << 8 | (p[2] as usize) << 16;
                    let kind = if p[3] == 0 {
                        Message::Request
                    } else {
                        Message::Other
                    };
                    (len + 4, kind)
                }
                Wire::ZooKeeper => {
                    if p.len() < 4 {
                        break;
                    }
                    let len = be_i32(p) as usize + 4;
                    let kind = if first {
                        Message::Other
                    } else if p.len() >= 12
                        && be_i32(&p[4..]) == ZK_PING_XID
                        && be_i32(&p[8..]) == ZK_PING_OP
                    {
                        Message::Keepalive(zk_ping_reply())
                    } else if p.len() >= 12 && be_i32(&p[8..]) == ZK_SYNC_OP {
                        Message::Other
                    } else {
                        Message::Request
                    };
                    (len, kind)
                }
            };
            if self.pending.len() < len {
                break;
            }
            self.pending.drain(..len);
            self.seen += 1;
            out.push(kind);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zookeeper_frames_split_over_reads() {
        let mut p = Parser::new(Wire::ZooKeeper);
        let frame = |xid: i32, op: i32| {
            let mut f = 8u32.to_be_bytes().to_vec();
            f.extend_from_slice(&xid.to_be_bytes());
            f.extend_from_slice(&op.to_be_bytes());
            f
        };
        let mut all = frame(0, 0); // connect
        all.extend(frame(ZK_PING_XID, ZK_PING_OP));
        all.extend(frame(1, ZK_SYNC_OP));
        all.extend(frame(2, 8)); // getChildren
        let (a, b) = all.split_at(7);
        let mut got = p.feed(a);
        got.extend(p.feed(b));
        assert_eq!(
            got,
            vec![
                Message::Other,
                Message::Keepalive(zk_ping_reply()),
                Message::Other,
                Message::Request
            ]
        );
    }

    #[test]
    fn postgres_counts_sync_and_query() {
        let mut p = Parser::new(Wire::Postgres);
        let mut all = 8u32.to_be_bytes().to_vec(); // start-up message, 8 bytes
        all.extend_from_slice(&[0, 3, 0, 0]);
        for t in [b'P', b'B', b'E', b'S', b'Q'] {
            all.push(t);
            all.extend_from_slice(&4u32.to_be_bytes());
        }
        let requests = p
            .feed(&all)
            .into_iter()
            .filter(|m| *m == Message::Request)
            .count();
        assert_eq!(requests, 2);
    }
}
