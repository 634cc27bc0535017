//! The arena's own tests; every model's property suite checks it too.

use super::*;
use crate::models::common::{FreeKey, device_bytes};

fn arena_with_segment(size: u64) -> (Arena, u32, u32) {
    let mut a = Arena::new();
    let (s, b) = a.add_segment(
        0x1000_0000,
        size,
        device_bytes(size),
        0,
        false,
        false,
        0,
        State::Free,
    );
    a.insert_free(b, FreeKey::new(0, size, 0x1000_0000));
    (a, s, b)
}

#[test]
#[allow(clippy::many_single_char_names)]
fn split_allocate_free_and_merge_keep_the_invariants() {
    let (mut a, s, b) = arena_with_segment(4096);
    let mut out = Vec::new();
    a.remove_free(b);
    let t = a.split(b, 1024);
    a.insert_free(t, FreeKey::new(0, 3072, a.b(t).addr));
    a.allocate(b, 1000, 7, &mut out);
    a.check(|_, _| false).unwrap();
    assert_eq!(a.stats().allocated_bytes, 1024);
    assert_eq!(a.stats().requested_bytes, 1000);
    assert_eq!(a.largest_free(), 3072);
    let i = a.release(0x1000_0000, false, &mut out).unwrap().unwrap();
    // Freed but not yet merged or indexed: the check must notice.
    assert!(a.check(|_, _| false).is_err());
    let m = a.coalesce(i, |_| true);
    a.insert_free(m, FreeKey::new(0, a.b(m).size, a.b(m).addr));
    a.check(|_, _| false).unwrap();
    assert_eq!(a.free_count(), 1);
    assert_eq!(a.largest_free(), 4096);
    a.remove_segment(s).unwrap();
    a.check(|_, _| false).unwrap();
    assert_eq!(a.reserved_bytes(), 0);
}

#[test]
fn adjacent_free_blocks_are_flagged_unless_the_model_allows_them() {
    let (mut a, _, b) = arena_with_segment(4096);
    a.remove_free(b);
    let t = a.split(b, 1024);
    a.insert_free(b, FreeKey::new(0, 1024, a.b(b).addr));
    a.insert_free(t, FreeKey::new(0, 3072, a.b(t).addr));
    assert!(
        a.check(|_, _| false)
            .unwrap_err()
            .contains("should have been merged")
    );
    a.check(|_, _| true).unwrap();
}

#[test]
fn deferred_frees_stay_live_until_completion() {
    let (mut a, _, b) = arena_with_segment(4096);
    let mut out = Vec::new();
    a.remove_free(b);
    a.allocate(b, 4096, 0, &mut out);
    assert_eq!(a.release(0x1000_0000, true, &mut out).unwrap(), None);
    assert_eq!(a.allocated_bytes(), 0);
    assert_eq!(a.stats().requested_bytes, 4096);
    assert!(a.release(0x1000_0000, false, &mut out).is_err());
    let i = a.complete(0x1000_0000, &mut out).unwrap();
    a.insert_free(i, FreeKey::new(0, 4096, 0x1000_0000));
    a.check(|_, _| false).unwrap();
    assert!(a.complete(0x1000_0000, &mut out).is_err());
}
