//! locksmith backend: redis (in progress)
