//! A pickle decoder for the subset snapshots use; it never executes anything.
