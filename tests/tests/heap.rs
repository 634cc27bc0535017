//! The counting global allocator (`allocsim_app::heap`) counts what is allocated, freed
//! and grown in place, and keeps the highest mark until it is restarted. It is installed
//! here as the test binary's allocator, as the browser build, the probe and
//! `bench_memory` install it. One test: the harness's other threads stay idle.

use allocsim_app::heap;

#[global_allocator]
static A: heap::Counting = heap::Counting;

const MIB: usize = 1 << 20;

/// Within the few bytes another thread of the harness may allocate meanwhile.
fn near(got: isize, want: isize) -> bool {
    (got - want).abs() < 64 << 10
}

#[test]
fn the_counting_allocator_counts_allocations_frees_and_growth_and_keeps_the_highest_mark() {
    let base = heap::live();
    let _ = heap::restart_peak();
    let mut v: Vec<u8> = Vec::with_capacity(4 * MIB);
    v.push(1);
    assert!(near(
        heap::live() as isize - base as isize,
        4 * MIB as isize
    ));
    // Grown in place or moved: the live bytes are the new size.
    v.reserve_exact(12 * MIB - v.len());
    let grown = heap::live() as isize - base as isize;
    assert!(
        near(grown, v.capacity() as isize),
        "{grown} vs {}",
        v.capacity()
    );
    // Shrunk.
    v.shrink_to(MIB);
    assert!(near(
        heap::live() as isize - base as isize,
        v.capacity() as isize
    ));
    assert!(heap::peak() >= base + 12 * MIB);
    drop(v);
    assert!(near(heap::live() as isize, base as isize));
    // The mark stays until restarted, then starts from what is live.
    let peak = heap::restart_peak();
    assert!(peak >= base + 12 * MIB);
    assert!(near(heap::peak() as isize, heap::live() as isize));
}
