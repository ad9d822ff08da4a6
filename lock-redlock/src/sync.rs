//! The one way this crate takes a std mutex: a poisoned lock is taken anyway (every critical
//! section leaves its data consistent, and a panic elsewhere must not stop the client).

use std::sync::Mutex;

pub(crate) fn lock_mutex<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
