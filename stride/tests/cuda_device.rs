//! On a real GPU: with `STRIDE_TEST_CUDA` set to a GPU index, loads NVIDIA's driver library,
//! allocates on that GPU, copies a pattern in and out, and exports a dma-buf. Without the
//! variable it says it skipped; with it, a missing driver or GPU is a failure.

use std::os::fd::AsRawFd;

use stride::cuda::{Driver, GPU_PAGE, LIBCUDA};

#[test]
fn real_gpu_memory_round_trip_and_dma_buf_export() {
    let Some(index) = std::env::var_os("STRIDE_TEST_CUDA") else {
        println!("skipped: STRIDE_TEST_CUDA is not set (needs an NVIDIA GPU and driver)");
        return;
    };
    let index: u32 = index
        .to_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("STRIDE_TEST_CUDA={index:?} is not a GPU index"));
    // NVIDIA's own library, whatever STRIDE_LIBCUDA says: this test is about the real driver.
    let driver: &'static Driver =
        Box::leak(Box::new(Driver::load(LIBCUDA).unwrap_or_else(|e| {
            panic!("STRIDE_TEST_CUDA={index} is set but: {e}")
        })));
    let count = driver
        .device_count()
        .unwrap_or_else(|e| panic!("STRIDE_TEST_CUDA={index} is set but: {e}"));
    let gpu = driver
        .open_gpu(index)
        .unwrap_or_else(|e| panic!("STRIDE_TEST_CUDA={index} is set but: {e}"));
    println!("{count} GPU(s); testing {}", gpu.describe());
    println!(
        "CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: {}; the driver exports \
         cuMemGetHandleForAddressRange: {}",
        gpu.dma_buf_supported(),
        driver.can_export_dma_buf()
    );

    let mem = gpu.alloc((1 << 20) + 3).expect("cuMemAlloc");
    assert_eq!(mem.addr() % GPU_PAGE as u64, 0);
    assert!(mem.len() >= (1 << 20) + 3);
    mem.set_sync_memops().expect("SYNC_MEMOPS");
    let pattern: Vec<u8> = (0..mem.len()).map(|i| (i % 251) as u8).collect();
    mem.write(0, &pattern).expect("copy in");
    assert_eq!(mem.read(0..mem.len()).expect("copy out"), pattern);
    mem.fill(4096..8192, 0xee).expect("memset");
    let back = mem.read(4090..8200).expect("copy out");
    assert_eq!(back[..6], pattern[4090..4096]);
    assert!(back[6..4102].iter().all(|&b| b == 0xee));
    assert_eq!(back[4102..], pattern[8192..8200]);

    let exported = mem.export_dma_buf();
    match (&exported, gpu.check_dma_buf_export()) {
        (Ok(fd), _) => println!("dma-buf export: fd {}", fd.as_raw_fd()),
        (Err(e), Ok(())) => panic!("the driver says GPU {index} can export dma-buf, but: {e}"),
        (Err(e), Err(why)) => println!("dma-buf export not available here: {why} ({e})"),
    }
}
