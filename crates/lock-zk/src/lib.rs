//! locksmith backend: zk (in progress)
