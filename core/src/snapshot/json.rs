//! JSON snapshots (what memory_viz accepts besides pickles).
