//! A model check (stateright) of Redlock's hand-over by grants (`handover=grant`, see the crate
//! docs, "Waiting"): every master's release script gives the lock to its own queue's head with
//! a short claim TTL and publishes the grant naming the waiter's vote; a waiter that numbers
//! its votes (one number for all masters) holds on a majority of grants for its last refused
//! vote, counting only masters that refused that vote (not those whose answer was lost or late:
//! its undo may follow), valid from that vote's send for the claim.
//!
//! Three masters (quorum 2); client 0 holds on all three at the start, client 1 comes to wait
//! (two votes), and client 0 comes back after its release as a `try_lock` (one vote: the
//! intruder a wrongly held lease would overlap with). Interleavings of:
//! votes (sent to all masters at once, each master serving it as a separate step, each
//! connection in order), a vote decided on all answers or given up on missing ones (its undo
//! then queued behind it on those masters), releases granting on each master apart, grants
//! lost or delayed, waiters crashing (a client that takes no more steps), and time passing
//! (keys expire, claims before locks). A depth-first search with the masters' symmetry reduced,
//! bounded at [`MAX_DEPTH`] steps: not exhaustive (a queue entry expiring and a cancelled
//! waiter's clean-up are left to the single-node model, lock-redis's `handover_model.rs`, and
//! the fault tests of `tests/handover.rs`). One clock: the client's validity and
//! the masters' TTLs are on real time (drift is the implementation's margin on top).
//!
//! Checked: **mutual exclusion** (never two clients that believe they hold, their validity not
//! yet over, at one instant) and **a belief is backed by a majority** (whoever believes it
//! holds has its key on a majority of the masters, each lasting at least as long as the
//! belief: the ordering property that stands in for fencing tokens, which Redlock does not
//! offer). And that the check has teeth: three broken waiters are caught, one counting grants
//! across different vote numbers, one counting its validity from the grant's arrival, and one
//! counting a grant from a master whose vote it gave up on (and undid).

use stateright::{Checker, Model, Property};

const MASTERS: usize = 3;
const QUORUM: u32 = 2;
const CLIENTS: usize = 2;
/// The lock's TTL and the claim's (time units).
const LOCK_TTL: u8 = 2;
const CLAIM_TTL: u8 = 1;
/// Time stops here (bounded model).
const HORIZON: u8 = 2;
/// The longest path explored (steps; `MODEL_DEPTH` sets another): the whole space is tens of
/// millions of states, this bound about 700,000 (20 s in a debug build on a loaded 2-core
/// machine, 50 MB). Every hand-over above fits in it (a vote is 4 steps, a release 4 and its
/// grants 3; the broken waiters are caught within 15).
const MAX_DEPTH: usize = 15;
/// How many votes each client may send: client 0 holds from the start and comes back once
/// after its release as a `try_lock` (the intruder a wrongly held lease would overlap with),
/// client 1 waits.
const VOTES: [u8; CLIENTS] = [1, 2];

/// How the waiter counts grants: the implementation's rule, or a broken one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Waiter {
    /// Grants naming its last refused vote, from masters that refused it; valid from that
    /// vote's send.
    Sound,
    /// Broken: grants for any of its votes count together.
    AcrossVotes,
    /// Broken: valid from the arrival of the grant that made the majority.
    FromArrival,
    /// Broken: a grant from a master whose answer it did not wait for counts too.
    UndoneMasters,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Phase {
    Idle,
    Waiting,
    Holding,
    Done,
}

/// A request on one master's connection, served in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Req {
    Vote {
        n: u8,
    },
    /// A lost vote's undo (owner-checked, silent).
    Undo,
    Release,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Answer {
    Won,
    Held,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Client {
    phase: Phase,
    /// Votes sent; the current (or last) one's number.
    n: u8,
    /// When the current (or last) vote was sent.
    sent: u8,
    /// Waiting for the answers of vote `n`.
    voting: bool,
    answers: [Option<Answer>; MASTERS],
    /// Requests not yet served, per master connection.
    pipes: [Vec<Req>; MASTERS],
    /// The last refused vote: number, send time, the masters that refused it (bit mask).
    refused: Option<(u8, u8, u8)>,
    /// The last grant received from each master: the vote it names.
    slots: [Option<u8>; MASTERS],
    /// Masters whose grant counts (bit mask).
    granted: u8,
    /// Believed held until.
    hold: Option<u8>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Master {
    /// The lock key: owner and the instant it expires.
    lock: Option<(u8, u8)>,
    /// The queue, head first: waiter and the vote that last refreshed its entry.
    queue: Vec<(u8, u8)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Grant {
    to: u8,
    vote: u8,
    master: u8,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    now: u8,
    masters: [Master; MASTERS],
    /// Grants published and not yet delivered (a lost one is never delivered).
    grants: Vec<Grant>,
    clients: [Client; CLIENTS],
    /// A waiter began to hold by grants (the model reaches the hand-over at all).
    held_by_grant: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Action {
    Tick,
    Vote(u8),
    Serve(u8, u8),
    /// Give up on the answers still missing (decide the vote on those there are).
    Timeout(u8),
    Deliver(usize),
    Release(u8),
}

struct Handover {
    waiter: Waiter,
}

impl Master {
    fn live(&self, now: u8) -> Option<u8> {
        self.lock.filter(|(_, exp)| *exp > now).map(|(o, _)| o)
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
}

/// The masters are alike: a state and the same state with its masters renumbered are one
/// (symmetry reduction). The representative orders the masters by what each holds and what
/// every client has in flight to, from and about it.
fn representative(s: &State) -> State {
    let bit = |mask: u8, m: usize| mask & (1 << m) != 0;
    let key = |m: usize| {
        let clients: Vec<_> = s
            .clients
            .iter()
            .map(|c| {
                (
                    c.answers[m],
                    c.pipes[m].clone(),
                    c.slots[m],
                    c.refused.map(|(_, _, on)| bit(on, m)),
                    bit(c.granted, m),
                )
            })
            .collect();
        let grants: Vec<_> = s
            .grants
            .iter()
            .filter(|g| usize::from(g.master) == m)
            .map(|g| (g.to, g.vote))
            .collect();
        (s.masters[m].clone(), clients, grants)
    };
    let mut order: Vec<usize> = (0..MASTERS).collect();
    order.sort_by_key(|m| key(*m));
    // New index i holds old master order[i].
    let mut new_index = [0u8; MASTERS];
    for (i, m) in order.iter().enumerate() {
        new_index[*m] = i as u8;
    }
    let remask = |mask: u8| {
        (0..MASTERS)
            .filter(|m| bit(mask, *m))
            .fold(0u8, |acc, m| acc | (1 << new_index[m]))
    };
    let mut out = s.clone();
    out.masters = std::array::from_fn(|i| s.masters[order[i]].clone());
    for (c, old) in out.clients.iter_mut().zip(&s.clients) {
        c.answers = std::array::from_fn(|i| old.answers[order[i]]);
        c.pipes = std::array::from_fn(|i| old.pipes[order[i]].clone());
        c.slots = std::array::from_fn(|i| old.slots[order[i]]);
        c.refused = old.refused.map(|(n, sent, on)| (n, sent, remask(on)));
        c.granted = remask(old.granted);
    }
    for g in &mut out.grants {
        g.master = new_index[usize::from(g.master)];
    }
    out.grants
        .sort_unstable_by_key(|g| (g.to, g.vote, g.master));
    out
}

fn count(mask: u8) -> u32 {
    mask.count_ones()
}

impl State {
    /// Master `m` serves the next request of client `c` (the master's scripts).
    fn serve(&mut self, c: u8, m: usize) -> Option<()> {
        let req = {
            let pipe = &mut self.clients[usize::from(c)].pipes[m];
            if pipe.is_empty() {
                return None;
            }
            pipe.remove(0)
        };
        let now = self.now;
        let master = &mut self.masters[m];
        match req {
            // ACQUIRE_WAITING: its own key is extended (a re-sent vote, or a grant whose
            // message was lost); a free lock goes to a queued waiter only while any queue.
            // Client 0 comes back as a `try_lock` (it never queues), client 1 waits.
            Req::Vote { n } => {
                let waits = c == 1;
                let answer = match master.live(now) {
                    Some(o) if o == c => {
                        master.lock = Some((c, now + LOCK_TTL));
                        master.dequeue(c);
                        Answer::Won
                    }
                    Some(_) => {
                        if waits {
                            master.enqueue(c, n);
                        }
                        Answer::Held
                    }
                    None if !master.queue.is_empty()
                        && !master.queue.iter().any(|(w, _)| *w == c) =>
                    {
                        if waits {
                            master.enqueue(c, n);
                        }
                        Answer::Held
                    }
                    None => {
                        master.lock = Some((c, now + LOCK_TTL));
                        master.dequeue(c);
                        Answer::Won
                    }
                };
                let cl = &mut self.clients[usize::from(c)];
                if cl.voting && cl.n == n {
                    cl.answers[m] = Some(answer);
                }
            }
            Req::Undo => {
                if master.live(now) == Some(c) {
                    master.lock = None;
                }
            }
            // RELEASE_NAMED_GRANTING: compare-and-delete, then the grant to the queue's head.
            Req::Release => {
                master.dequeue(c);
                if master.live(now) != Some(c) {
                    return Some(());
                }
                master.lock = None;
                if !master.queue.is_empty() {
                    let (head, vote) = master.queue.remove(0);
                    master.lock = Some((head, now + CLAIM_TTL));
                    self.grants.push(Grant {
                        to: head,
                        vote,
                        master: m as u8,
                    });
                    // In flight as a set: the order they were published in adds no state.
                    self.grants
                        .sort_unstable_by_key(|g| (g.to, g.vote, g.master));
                }
            }
        }
        Some(())
    }

    /// The vote of `c` is decided on the answers it has (missing ones count as failed).
    fn decide(&mut self, c: u8, waiter: Waiter) {
        let now = self.now;
        let cl = &mut self.clients[usize::from(c)];
        cl.voting = false;
        let answers = std::mem::take(&mut cl.answers);
        let won = answers.iter().filter(|a| **a == Some(Answer::Won)).count();
        if won as u32 >= QUORUM {
            if cl.sent + LOCK_TTL > now {
                cl.hold_from(cl.sent + LOCK_TTL);
            }
            return;
        }
        // Lost: undone on every master that did not refuse it (won, or answer missing).
        let mut refused_on = 0u8;
        for (m, (answer, pipe)) in answers.iter().zip(&mut cl.pipes).enumerate() {
            if *answer == Some(Answer::Held) {
                refused_on |= 1 << m;
            } else {
                pipe.push(Req::Undo);
            }
        }
        cl.refused = Some((cl.n, cl.sent, refused_on));
        if waiter != Waiter::AcrossVotes {
            cl.granted = 0;
        }
        self.judge(c, waiter);
    }

    /// A waiter between votes counts the grants in its slots.
    fn judge(&mut self, c: u8, waiter: Waiter) {
        let now = self.now;
        let cl = &mut self.clients[usize::from(c)];
        let Some((n, sent, refused_on)) = cl.refused else {
            return;
        };
        if cl.phase != Phase::Waiting || cl.voting {
            return;
        }
        for m in 0..MASTERS {
            let Some(vote) = cl.slots[m] else { continue };
            let counts = match waiter {
                Waiter::Sound | Waiter::FromArrival => vote == n && refused_on & (1 << m) != 0,
                Waiter::AcrossVotes => true,
                Waiter::UndoneMasters => vote == n,
            };
            if counts {
                cl.granted |= 1 << m;
            }
            if vote <= n {
                cl.slots[m] = None;
            }
        }
        if count(cl.granted) < QUORUM {
            return;
        }
        let until = match waiter {
            Waiter::FromArrival => now + CLAIM_TTL,
            _ => sent + CLAIM_TTL,
        };
        if until > now {
            cl.hold_from(until);
            self.held_by_grant = true;
        }
    }
}

impl Client {
    /// Believes it holds until `until`; what it kept for waiting is gone.
    fn hold_from(&mut self, until: u8) {
        self.phase = Phase::Holding;
        self.hold = Some(until);
        self.refused = None;
        self.slots = [None; MASTERS];
        self.granted = 0;
    }
}

impl Model for Handover {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let client = |phase, hold| Client {
            phase,
            n: 0,
            sent: 0,
            voting: false,
            answers: [None; MASTERS],
            pipes: Default::default(),
            refused: None,
            slots: [None; MASTERS],
            granted: 0,
            hold,
        };
        let master = Master {
            lock: Some((0, LOCK_TTL)),
            queue: Vec::new(),
        };
        // Client 0 holds on every master; client 1 comes to wait for it.
        vec![State {
            now: 0,
            masters: [master.clone(), master.clone(), master],
            grants: Vec::new(),
            clients: [
                client(Phase::Holding, Some(LOCK_TTL)),
                client(Phase::Idle, None),
            ],
            held_by_grant: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        if s.now < HORIZON {
            actions.push(Action::Tick);
        }
        for (i, cl) in s.clients.iter().enumerate() {
            let c = i as u8;
            let can_vote = cl.n < VOTES[i] && !cl.voting;
            match cl.phase {
                Phase::Idle | Phase::Waiting if can_vote => actions.push(Action::Vote(c)),
                Phase::Holding if !cl.voting => actions.push(Action::Release(c)),
                _ => {}
            }
            // A vote is decided as its last answer comes in (or a majority of wins: `Serve`),
            // or given up on the answers still missing.
            if cl.voting && cl.answers.iter().any(Option::is_some) {
                actions.push(Action::Timeout(c));
            }
            for m in 0..MASTERS {
                if !cl.pipes[m].is_empty() {
                    actions.push(Action::Serve(c, m as u8));
                }
            }
        }
        for i in 0..s.grants.len() {
            actions.push(Action::Deliver(i));
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Tick => s.now += 1,
            Action::Vote(c) => {
                let now = s.now;
                let cl = &mut s.clients[usize::from(c)];
                cl.n += 1;
                cl.sent = now;
                cl.voting = true;
                cl.answers = [None; MASTERS];
                if cl.phase == Phase::Idle {
                    cl.phase = Phase::Waiting;
                }
                let n = cl.n;
                for pipe in &mut cl.pipes {
                    pipe.push(Req::Vote { n });
                }
            }
            Action::Serve(c, m) => {
                s.serve(c, usize::from(m))?;
                let cl = &s.clients[usize::from(c)];
                let won = cl
                    .answers
                    .iter()
                    .filter(|a| **a == Some(Answer::Won))
                    .count();
                if cl.voting && (cl.answers.iter().all(Option::is_some) || won as u32 >= QUORUM) {
                    s.decide(c, self.waiter);
                }
            }
            Action::Timeout(c) => s.decide(c, self.waiter),
            Action::Deliver(i) => {
                let g = s.grants.remove(i);
                let cl = &mut s.clients[usize::from(g.to)];
                if cl.phase == Phase::Waiting {
                    cl.slots[usize::from(g.master)] = Some(g.vote);
                    s.judge(g.to, self.waiter);
                }
            }
            Action::Release(c) => {
                let cl = &mut s.clients[usize::from(c)];
                cl.phase = if cl.n < VOTES[usize::from(c)] {
                    Phase::Idle
                } else {
                    Phase::Done
                };
                cl.hold = None;
                cl.sent = 0;
                for pipe in &mut cl.pipes {
                    pipe.push(Req::Release);
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("mutual exclusion", |_, s: &State| {
                s.clients
                    .iter()
                    .filter(|c| c.phase == Phase::Holding && c.hold.is_some_and(|u| u > s.now))
                    .count()
                    <= 1
            }),
            Property::always("a belief is backed by a majority", |_, s: &State| {
                s.clients.iter().enumerate().all(|(i, c)| {
                    let Some(until) = c.hold.filter(|u| *u > s.now) else {
                        return true;
                    };
                    let backing = s
                        .masters
                        .iter()
                        .filter(|m| {
                            m.lock
                                .is_some_and(|(o, exp)| usize::from(o) == i && exp >= until)
                        })
                        .count();
                    backing as u32 >= QUORUM
                })
            }),
            // The model reaches a hand-over by grants at all (else the check proves nothing).
            Property::sometimes("held by grants", |_, s: &State| s.held_by_grant),
        ]
    }
}

/// The checker of `waiter`'s model; a broken one stops once `expected` (the property it must
/// break) is found (not at another failure first: the threads race to their discoveries).
fn check(waiter: Waiter, expected: Option<&'static str>) -> impl Checker<Handover> {
    let depth: usize = std::env::var("MODEL_DEPTH")
        .ok()
        .and_then(|d| d.parse().ok())
        .unwrap_or(MAX_DEPTH);
    let checker = Handover { waiter }
        .checker()
        .threads(2)
        .symmetry_fn(representative)
        .target_max_depth(depth);
    match expected {
        None => checker.spawn_dfs().join(),
        Some(name) => checker
            .finish_when(stateright::HasDiscoveries::AnyOf([name].into()))
            .spawn_dfs()
            .join(),
    }
}

/// The broken `waiter` breaks `property` within the bound.
fn assert_caught(waiter: Waiter, property: &'static str) {
    check(waiter, Some(property)).assert_any_discovery(property);
}

#[test]
fn a_majority_of_grants_keeps_mutual_exclusion() {
    let checker = check(Waiter::Sound, None);
    eprintln!(
        "{} states, depth {}",
        checker.unique_state_count(),
        checker.max_depth()
    );
    checker.assert_properties();
    assert!(
        checker.unique_state_count() > 10_000,
        "the model is too small to say much"
    );
}

#[test]
fn grants_counted_across_votes_are_caught() {
    assert_caught(Waiter::AcrossVotes, "a belief is backed by a majority");
}

#[test]
fn validity_counted_from_the_grants_arrival_is_caught() {
    assert_caught(Waiter::FromArrival, "mutual exclusion");
}

#[test]
fn a_grant_from_a_master_whose_vote_was_undone_is_caught() {
    assert_caught(Waiter::UndoneMasters, "a belief is backed by a majority");
}
