//! A model check (stateright) of the server-side hand-over of the exclusive lock on one Redis
//! node (`handover=grant`, see the `queue` module of lock-redis): the release script gives the
//! lock to the queue's head with a short claim TTL and publishes the grant; the waiter holds
//! at once, its validity counted from the send of its last refused attempt.
//!
//! Every interleaving of: attempts (sent, served and answered as separate steps, so time passes
//! between them), the release and its grant, grants lost or delayed on the pub/sub connection,
//! waiters and holders crashing, a waiter cancelled (its clean-up takes its grant back), queue
//! entries expiring at any moment, renewals, and time passing (lock and claim expiry). One clock
//! for all: the client's validity and the server's TTL are on real time (drift is the
//! implementation's margin on top).
//!
//! Checked: **mutual exclusion** (never two clients that believe they hold, their validity
//! not yet over, at one instant) and **fencing order** (each new holder's fencing token is above
//! every earlier holder's). And that the check has teeth: two broken waiters are caught, one
//! counting its validity from the grant's arrival, one taking a grant that came before its last
//! refused attempt (the grant names the attempt it answers; see `Grant::attempt`).

use stateright::{Checker, Model, Property};

const CLIENTS: usize = 3;
/// The lock's TTL and the claim's (time units).
const LOCK_TTL: u8 = 3;
const CLAIM_TTL: u8 = 2;
/// Time stops here (bounded model).
const HORIZON: u8 = 4;

/// How the waiter judges a grant: the implementation's rule, or a broken one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Waiter {
    /// Valid from the send of the refused attempt the grant names; older grants ignored.
    Sound,
    /// Broken: valid from the grant's arrival.
    FromArrival,
    /// Broken: any grant counts from the last refused attempt's send, whichever it answers.
    AnyGrant,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Phase {
    Idle,
    Waiting,
    Holding,
    Done,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Req {
    /// Attempt number `n`, sent at `sent`.
    Acquire {
        n: u8,
        sent: u8,
    },
    Release,
    /// A cancelled waiter's clean-up: out of the queue, and its grant given back.
    Leave,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Reply {
    Won { sent: u8, fence: u32 },
    Held { n: u8, sent: u8 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Client {
    phase: Phase,
    /// Attempts sent.
    n: u8,
    req: Option<Req>,
    reply: Option<Reply>,
    /// The last refused attempt: its number and send time.
    refused: Option<(u8, u8)>,
    /// A grant received and not yet judged: the attempt it answers, its fence.
    slot: Option<(u8, u32)>,
    /// Believed held: valid until, fence.
    hold: Option<(u8, u32)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Grant {
    to: u8,
    attempt: u8,
    fence: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    now: u8,
    /// The lock key: owner and the instant it expires.
    lock: Option<(u8, u8)>,
    fence: u32,
    /// The queue, head first: waiter and the attempt that last refreshed its entry.
    queue: Vec<(u8, u8)>,
    /// Grants published and not yet delivered (or lost).
    grants: Vec<Grant>,
    clients: [Client; CLIENTS],
    /// The highest fence a client began to hold with.
    max_fence_held: u32,
    fence_out_of_order: bool,
    /// A waiter began to hold by a grant (the model reaches the hand-over at all).
    held_by_grant: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Action {
    Tick,
    Ask(u8),
    Poll(u8),
    Serve(u8),
    Receive(u8),
    Deliver(usize),
    Release(u8),
    Cancel(u8),
    Expire(u8),
}

struct Handover {
    waiter: Waiter,
}

impl State {
    fn live_lock(&self) -> Option<u8> {
        self.lock
            .filter(|(_, expires)| *expires > self.now)
            .map(|(owner, _)| owner)
    }

    fn dequeue(&mut self, c: u8) {
        self.queue.retain(|(w, _)| *w != c);
    }

    fn enqueue(&mut self, c: u8, n: u8) {
        match self.queue.iter_mut().find(|(w, _)| *w == c) {
            Some(entry) => entry.1 = n,
            None => self.queue.push((c, n)),
        }
    }

    /// The acquire script (`ACQUIRE_QUEUED`).
    fn serve_acquire(&mut self, c: u8, n: u8, sent: u8) -> Reply {
        match self.live_lock() {
            // A re-sent attempt, or a grant whose message was lost: its own token holds.
            Some(owner) if owner == c => {
                self.lock = Some((c, self.now + LOCK_TTL));
                self.dequeue(c);
                Reply::Won {
                    sent,
                    fence: self.fence,
                }
            }
            Some(_) => {
                self.enqueue(c, n);
                Reply::Held { n, sent }
            }
            None if self.queue.first().is_some_and(|(h, _)| *h != c) => {
                self.enqueue(c, n);
                Reply::Held { n, sent }
            }
            None => {
                self.fence += 1;
                self.lock = Some((c, self.now + LOCK_TTL));
                self.dequeue(c);
                Reply::Won {
                    sent,
                    fence: self.fence,
                }
            }
        }
    }

    /// The release script: compare-and-delete, then the grant to the queue's head.
    fn serve_release(&mut self, c: u8) {
        if self.live_lock() != Some(c) {
            return;
        }
        self.lock = None;
        if let Some(&(head, attempt)) = self.queue.first() {
            self.queue.remove(0);
            self.fence += 1;
            self.lock = Some((head, self.now + CLAIM_TTL));
            self.grants.push(Grant {
                to: head,
                attempt,
                fence: self.fence,
            });
        }
    }

    fn begin_hold(&mut self, c: u8, until: u8, fence: u32) {
        let client = &mut self.clients[usize::from(c)];
        client.phase = Phase::Holding;
        client.hold = Some((until, fence));
        client.slot = None;
        if until > self.now {
            if fence <= self.max_fence_held {
                self.fence_out_of_order = true;
            }
            self.max_fence_held = self.max_fence_held.max(fence);
        }
    }

    /// A waiter judges the grant in its slot against its last refused attempt.
    fn judge_grant(&mut self, c: u8, waiter: Waiter) {
        let client = self.clients[usize::from(c)];
        let (Some((attempt, fence)), Some((refused, sent))) = (client.slot, client.refused) else {
            return;
        };
        if client.phase != Phase::Waiting || client.req.is_some() {
            // An attempt in flight decides (it wins on its own token if the claim is there).
            return;
        }
        let until = match waiter {
            Waiter::Sound if attempt == refused => sent + CLAIM_TTL,
            Waiter::Sound if attempt < refused => {
                // A grant older than a refused attempt: its claim is gone.
                self.clients[usize::from(c)].slot = None;
                return;
            }
            // The refused reply of the attempt it names has not come back yet.
            Waiter::Sound => return,
            Waiter::FromArrival => self.now + CLAIM_TTL,
            Waiter::AnyGrant => sent + CLAIM_TTL,
        };
        if until > self.now {
            self.begin_hold(c, until, fence);
            self.held_by_grant = true;
        } else {
            // Useless (too old): the waiter attempts again, which wins if the claim is there.
            self.clients[usize::from(c)].slot = None;
        }
    }
}

impl Model for Handover {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let idle = Client {
            phase: Phase::Idle,
            n: 0,
            req: None,
            reply: None,
            refused: None,
            slot: None,
            hold: None,
        };
        vec![State {
            now: 0,
            lock: None,
            fence: 0,
            queue: Vec::new(),
            grants: Vec::new(),
            clients: [idle; CLIENTS],
            max_fence_held: 0,
            fence_out_of_order: false,
            held_by_grant: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        if s.now < HORIZON {
            actions.push(Action::Tick);
        }
        for (i, cl) in s.clients.iter().enumerate() {
            let c = u8::try_from(i).unwrap();
            let quiet = cl.req.is_none() && cl.reply.is_none();
            match cl.phase {
                // Clients ask in order (they are alike: the other orders add nothing).
                Phase::Idle if i == 0 || s.clients[i - 1].phase != Phase::Idle => {
                    actions.push(Action::Ask(c));
                }
                // Roles bound the model: client 0 takes the lock first, client 1 waits for it
                // (polls up to twice, may give up), client 2 comes in later and tries once
                // or twice (the intruder a wrongly held grant would overlap with).
                Phase::Waiting if quiet && c == 1 => {
                    if cl.n < 3 {
                        actions.push(Action::Poll(c));
                    }
                    actions.push(Action::Cancel(c));
                }
                Phase::Waiting if quiet && c == 2 && cl.n < 2 => actions.push(Action::Poll(c)),
                Phase::Holding if quiet => {
                    actions.push(Action::Release(c));
                }
                _ => {}
            }
            if cl.req.is_some() {
                actions.push(Action::Serve(c));
            }
            if cl.reply.is_some() {
                actions.push(Action::Receive(c));
            }
            // A crashed client is one that takes no step any more, which every path that
            // stops choosing its steps covers (and it believes nothing, so its own state does
            // not matter); its queue entry then expires, which may come at any moment.
            if s.queue.iter().any(|(w, _)| *w == c) {
                actions.push(Action::Expire(c));
            }
        }
        // A lost grant is one never delivered: the paths that never choose its delivery.
        for i in 0..s.grants.len() {
            actions.push(Action::Deliver(i));
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Tick => s.now += 1,
            Action::Ask(c) | Action::Poll(c) => {
                let cl = &mut s.clients[usize::from(c)];
                cl.n += 1;
                cl.req = Some(Req::Acquire {
                    n: cl.n,
                    sent: s.now,
                });
                cl.phase = Phase::Waiting;
            }
            Action::Serve(c) => {
                let req = s.clients[usize::from(c)].req.take()?;
                let reply = match req {
                    Req::Acquire { n, sent } => Some(s.serve_acquire(c, n, sent)),
                    Req::Release => {
                        s.serve_release(c);
                        None
                    }
                    Req::Leave => {
                        s.dequeue(c);
                        if s.live_lock() == Some(c) {
                            s.lock = None;
                        }
                        None
                    }
                };
                s.clients[usize::from(c)].reply = reply;
            }
            Action::Receive(c) => {
                let reply = s.clients[usize::from(c)].reply.take()?;
                let phase = s.clients[usize::from(c)].phase;
                match reply {
                    Reply::Won { sent, fence } if phase == Phase::Waiting => {
                        s.begin_hold(c, sent + LOCK_TTL, fence);
                    }
                    Reply::Held { n, sent } if phase == Phase::Waiting => {
                        s.clients[usize::from(c)].refused = Some((n, sent));
                        s.judge_grant(c, self.waiter);
                    }
                    _ => {}
                }
            }
            Action::Deliver(i) => {
                let g = s.grants.remove(i);
                if s.clients[usize::from(g.to)].phase == Phase::Waiting {
                    s.clients[usize::from(g.to)].slot = Some((g.attempt, g.fence));
                    s.judge_grant(g.to, self.waiter);
                }
            }
            Action::Release(c) => {
                let cl = &mut s.clients[usize::from(c)];
                cl.phase = Phase::Done;
                cl.hold = None;
                cl.req = Some(Req::Release);
            }
            Action::Cancel(c) => {
                let cl = &mut s.clients[usize::from(c)];
                cl.phase = Phase::Done;
                cl.slot = None;
                cl.req = Some(Req::Leave);
            }
            Action::Expire(c) => s.dequeue(c),
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("mutual exclusion", |_, s: &State| {
                s.clients
                    .iter()
                    .filter(|c| {
                        c.phase == Phase::Holding && c.hold.is_some_and(|(until, _)| until > s.now)
                    })
                    .count()
                    <= 1
            }),
            Property::always("fencing order", |_, s: &State| !s.fence_out_of_order),
            // The model reaches a hand-over by grant at all (else the check proves nothing).
            Property::sometimes("held by a grant", |_, s: &State| s.held_by_grant),
        ]
    }
}

fn check(waiter: Waiter) -> impl Checker<Handover> {
    let checker = Handover { waiter }.checker().threads(2);
    match waiter {
        Waiter::Sound => checker.spawn_bfs().join(),
        // A counterexample is enough.
        _ => checker
            .finish_when(stateright::HasDiscoveries::AnyFailures)
            .spawn_bfs()
            .join(),
    }
}

#[test]
fn the_grant_keeps_mutual_exclusion_and_fencing_order() {
    let checker = check(Waiter::Sound);
    checker.assert_properties();
    eprintln!("{} states", checker.unique_state_count());
    assert!(
        checker.unique_state_count() > 10_000,
        "the model is too small to say much"
    );
}

#[test]
fn validity_counted_from_the_grants_arrival_is_caught() {
    check(Waiter::FromArrival).assert_any_discovery("mutual exclusion");
}

#[test]
fn a_grant_older_than_the_last_refused_attempt_is_caught() {
    check(Waiter::AnyGrant).assert_any_discovery("mutual exclusion");
}
