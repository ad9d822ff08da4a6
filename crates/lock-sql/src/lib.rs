//! locksmith backend: sql (in progress)
