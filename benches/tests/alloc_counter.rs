//! The counting allocator sees allocations when there are some, and none when there are none.

use std::hint::black_box;

use benches::alloc_counter::{count_allocations, CountingAllocator};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

#[test]
fn counts_allocations_of_this_thread() {
    // black_box: an optimised build may otherwise remove the Box (its value is known) and
    // leave one allocation where two were written.
    let (v, n) = count_allocations(|| {
        let mut v: Vec<u64> = Vec::with_capacity(black_box(4));
        v.push(1);
        let b = black_box(Box::new(7u64));
        v.push(*b);
        v
    });
    assert_eq!(v, [1, 7]);
    assert_eq!(n, 2, "one Vec buffer and one Box");
}

#[test]
fn counts_growth_as_an_allocation() {
    let mut v: Vec<u8> = Vec::with_capacity(1);
    let ((), n) = count_allocations(|| v.extend_from_slice(black_box(&[0; 4096])));
    assert_eq!(n, 1, "growing the buffer reallocates once");
}

#[test]
fn allocation_free_code_counts_zero() {
    let mut buf = [0u64; 64];
    let (sum, n) = count_allocations(|| {
        for (i, x) in buf.iter_mut().enumerate() {
            *x = i as u64 * 3;
        }
        buf.iter().sum::<u64>()
    });
    assert_eq!(sum, 3 * 63 * 64 / 2);
    assert_eq!(n, 0);
}

#[test]
fn other_threads_do_not_count() {
    let ((), n) = count_allocations(|| {
        std::thread::scope(|s| {
            s.spawn(|| drop(black_box(vec![0u8; 1024]))).join().unwrap();
        });
    });
    // Spawning allocates on this thread (the thread handle); the 1 KiB Vec on the other
    // thread must not appear. Count what spawning alone costs, then compare.
    let ((), spawn_only) = count_allocations(|| {
        std::thread::scope(|s| {
            s.spawn(|| ()).join().unwrap();
        });
    });
    assert_eq!(n, spawn_only);
}
