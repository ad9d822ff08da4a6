//! When a scenario applies: predicates over the declared capabilities and what the harness can do.
//! An `Err` carries the reason the scenario is reported unsupported.

use lockcore::{Capabilities, RenewKind, WaitKind};

use crate::harness::Harness;

pub(super) fn always(_: &Capabilities, _: &dyn Harness) -> Result<(), &'static str> {
    Ok(())
}

pub(super) fn needs_fencing(c: &Capabilities, _: &dyn Harness) -> Result<(), &'static str> {
    if c.fencing {
        Ok(())
    } else {
        Err("the backend declares no fencing tokens")
    }
}

pub(super) fn needs_atomic_multi(c: &Capabilities, _: &dyn Harness) -> Result<(), &'static str> {
    if c.atomic_multi.is_yes() {
        Ok(())
    } else {
        Err("the backend takes a multi-lock as a sequence (atomic_multi not declared)")
    }
}

pub(super) fn needs_fair(c: &Capabilities, _: &dyn Harness) -> Result<(), &'static str> {
    if c.fair {
        Ok(())
    } else {
        Err("the backend does not declare FIFO fairness")
    }
}

pub(super) fn needs_counting(_: &Capabilities, h: &dyn Harness) -> Result<(), &'static str> {
    if h.can_count_requests() {
        Ok(())
    } else {
        Err("the harness cannot count a client's requests (no proxy can stand before this backend)")
    }
}

pub(super) fn needs_ttl_expiry(c: &Capabilities, _: &dyn Harness) -> Result<(), &'static str> {
    if c.expiry_after_ttl {
        Ok(())
    } else {
        Err(
            "leases are bound to a connection or session: a crashed holder's lock ends with it, not exactly after the TTL",
        )
    }
}

pub(super) fn needs_lost_detection(c: &Capabilities, h: &dyn Harness) -> Result<(), &'static str> {
    if c.loss_detection.bound().is_none() {
        Err(
            "the backend notices a lock deleted behind its holder only at the next renewal (loss_detection: at renewal)",
        )
    } else if !h.can_revoke() {
        Err("the harness cannot delete a lock behind its holder")
    } else {
        Ok(())
    }
}

pub(super) fn needs_extend_sets_ttl(c: &Capabilities, _: &dyn Harness) -> Result<(), &'static str> {
    if c.extend_sets_ttl {
        Ok(())
    } else {
        Err("the server fixes a lease's TTL when it grants it; extend keeps (and reports) that TTL")
    }
}

pub(super) fn needs_notify(c: &Capabilities, _: &dyn Harness) -> Result<(), &'static str> {
    if c.wait == WaitKind::Notify {
        Ok(())
    } else {
        Err("the backend polls; it does not declare notification")
    }
}

pub(super) fn needs_native_renewal(c: &Capabilities, _: &dyn Harness) -> Result<(), &'static str> {
    if c.renew == RenewKind::Native {
        Ok(())
    } else {
        Err("the backend does not declare native (session-bound) renewal")
    }
}

pub(super) fn needs_reply_delay(_: &Capabilities, h: &dyn Harness) -> Result<(), &'static str> {
    if h.can_delay_replies() {
        Ok(())
    } else {
        Err("the harness cannot delay a client's replies")
    }
}

pub(super) fn needs_lost_replies(_: &Capabilities, h: &dyn Harness) -> Result<(), &'static str> {
    if h.can_lose_replies() {
        Ok(())
    } else {
        Err("the harness cannot lose a client's replies")
    }
}

pub(super) fn needs_clock_skew(c: &Capabilities, h: &dyn Harness) -> Result<(), &'static str> {
    if c.expiry_on_client_clock {
        return Err(
            "expiry is judged on the clients' host clock (declared): a client whose clock runs \
             ahead steals a live lease, a documented violation (locksmith-cli's \
             report_processes test demonstrates it)",
        );
    }
    if h.can_skew_clock() || h.can_run_skewed_process() {
        Ok(())
    } else {
        Err("the harness cannot run a client with a skewed clock")
    }
}

pub(super) fn needs_revoke(_: &Capabilities, h: &dyn Harness) -> Result<(), &'static str> {
    if h.can_revoke() {
        Ok(())
    } else {
        Err("the harness cannot delete a lock behind its holder")
    }
}

pub(super) fn needs_other_namespace(_: &Capabilities, h: &dyn Harness) -> Result<(), &'static str> {
    if h.can_open_other_namespace() {
        Ok(())
    } else {
        Err("the harness cannot open a client in another namespace")
    }
}

pub(super) fn needs_lease_loss(c: &Capabilities, h: &dyn Harness) -> Result<(), &'static str> {
    if c.expiry_after_ttl || h.can_revoke() {
        Ok(())
    } else {
        Err("leases neither expire by time nor can be revoked by the harness")
    }
}

pub(super) fn needs_inspect(c: &Capabilities, _: &dyn Harness) -> Result<(), &'static str> {
    if !c.inspect {
        Err("the backend cannot inspect locks (inspect not declared)")
    } else if !c.force_release {
        Err("the backend cannot force-release locks")
    } else {
        Ok(())
    }
}

pub(super) fn needs_permits(c: &Capabilities, _: &dyn Harness) -> Result<(), &'static str> {
    if c.permits.is_yes() {
        Ok(())
    } else {
        Err("the backend declares no semaphore permits (its capabilities say why)")
    }
}

pub(super) fn needs_permit_expiry(c: &Capabilities, h: &dyn Harness) -> Result<(), &'static str> {
    needs_permits(c, h)?;
    needs_ttl_expiry(c, h)
}

pub(super) fn needs_shared(c: &Capabilities, _: &dyn Harness) -> Result<(), &'static str> {
    if c.shared.is_yes() {
        Ok(())
    } else {
        Err("the backend declares no shared (read-write) locks (its capabilities say why)")
    }
}

pub(super) fn needs_shared_expiry(c: &Capabilities, h: &dyn Harness) -> Result<(), &'static str> {
    needs_shared(c, h)?;
    needs_ttl_expiry(c, h)
}

pub(super) fn needs_shared_fencing(c: &Capabilities, h: &dyn Harness) -> Result<(), &'static str> {
    needs_shared(c, h)?;
    needs_fencing(c, h)
}

pub(super) fn needs_notified_permits(
    c: &Capabilities,
    h: &dyn Harness,
) -> Result<(), &'static str> {
    needs_permits(c, h)?;
    needs_notify(c, h)
}

pub(super) fn needs_notified_shared(c: &Capabilities, h: &dyn Harness) -> Result<(), &'static str> {
    needs_shared(c, h)?;
    needs_notify(c, h)
}

pub(super) fn needs_notified_revoke(c: &Capabilities, h: &dyn Harness) -> Result<(), &'static str> {
    needs_revoke(c, h)?;
    needs_notify(c, h)
}

pub(super) fn needs_shared_notify(c: &Capabilities, h: &dyn Harness) -> Result<(), &'static str> {
    needs_shared(c, h)?;
    needs_notify(c, h)
}

pub(super) fn needs_skewed_client(c: &Capabilities, h: &dyn Harness) -> Result<(), &'static str> {
    if c.expiry_on_client_clock {
        Err(
            "expiry is judged on the clients' host clock (declared): a client whose clock runs ahead frees live leases, a documented violation",
        )
    } else if h.can_skew_clock() {
        Ok(())
    } else {
        Err(
            "the harness cannot skew an in-process client's clock (a holder process takes locks and permits, it does not campaign)",
        )
    }
}

pub(super) fn needs_skewed_permits(c: &Capabilities, h: &dyn Harness) -> Result<(), &'static str> {
    needs_permits(c, h)?;
    needs_clock_skew(c, h)
}
