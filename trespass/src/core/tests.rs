//! in-memory pair tests (to come)
