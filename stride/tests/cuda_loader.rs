//! The CUDA loader and GPU memory against the driver test double (`support/fake_libcuda.c`):
//! no GPU needed. The loader is process-global, so each driver setup runs in a child process.

mod support;

use std::ffi::OsStr;
use std::os::fd::AsRawFd;

use stride::buffer::{BufferKind, GpuRegistration, Memory};
use stride::cuda::{self, CudaError, GPU_PAGE};
use support::{fake_libcuda, in_child, Fake, FakeCounters};

fn with_fake(test: &str, variant: Fake, extra: &[(&str, &str)], body: impl FnOnce()) {
    let lib = fake_libcuda(variant);
    let mut envs: Vec<(&str, &OsStr)> = vec![("STRIDE_LIBCUDA", lib.as_os_str())];
    envs.extend(extra.iter().map(|(k, v)| (*k, OsStr::new(v))));
    in_child(test, &envs, body);
}

fn counters() -> FakeCounters {
    let path = std::env::var_os("STRIDE_LIBCUDA").expect("set by with_fake");
    FakeCounters::open(std::path::Path::new(&path))
}

#[test]
fn one_gpu_allocates_copies_fills_and_exports() {
    with_fake(
        "one_gpu_allocates_copies_fills_and_exports",
        Fake::Full,
        &[],
        || {
            let driver = cuda::driver().expect("the test double loads");
            assert!(driver.library().ends_with("libcuda.so.1"));
            assert!(driver.can_export_dma_buf());
            assert_eq!(driver.device_count().unwrap(), 1);
            let fake = counters();

            let gpu = cuda::open_gpu(0).unwrap();
            assert_eq!(gpu.name(), "Fake GPU 0 (stride test double)");
            assert_eq!(gpu.pci_bus_id(), "0000:1b:00.0");
            assert!(gpu.dma_buf_supported());
            assert_eq!(
                gpu.describe(),
                "GPU 0 (Fake GPU 0 (stride test double), PCI 0000:1b:00.0)"
            );
            assert!(gpu.check_dma_buf_export().is_ok());
            assert_eq!(fake.context_refs(), 1);

            // 100,000 bytes: two GPU pages, starting on a GPU page boundary although the
            // double hands out addresses 256 bytes past a page.
            let mem = gpu.alloc(100_000).unwrap();
            assert_eq!(mem.len(), 2 * GPU_PAGE);
            assert_eq!(mem.addr() % GPU_PAGE as u64, 0);
            assert_eq!(fake.live_allocations(), 1);
            assert_eq!(fake.sync_memops(mem.addr()), 0);
            mem.set_sync_memops().unwrap();
            assert_eq!(fake.sync_memops(mem.addr()), 1);

            let pattern: Vec<u8> = (0..5000u32).map(|i| (i * 7 + 3) as u8).collect();
            mem.write(1000, &pattern).unwrap();
            assert_eq!(mem.read(1000..6000).unwrap(), pattern);
            mem.fill(0..mem.len(), 0x5a).unwrap();
            assert!(mem.read(0..mem.len()).unwrap().iter().all(|&b| b == 0x5a));
            mem.fill(10..20, 0).unwrap();
            assert_eq!(mem.read(8..22).unwrap()[..4], [0x5a, 0x5a, 0, 0]);

            // Another thread: the loader makes the context current there itself.
            let seen = std::thread::scope(|s| s.spawn(|| mem.read(0..4)).join().unwrap());
            assert_eq!(seen.unwrap(), [0x5a; 4]);

            let e = mem.write(mem.len() - 2, &[1, 2, 3]).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!(
                    "bytes {}..{} lie outside the {}-byte GPU allocation",
                    mem.len() - 2,
                    mem.len() + 1,
                    mem.len()
                )
            );
            assert!(mem.read(0..mem.len() + 1).is_err());

            let fd = mem.export_dma_buf().unwrap();
            assert!(fd.as_raw_fd() >= 0);
            let exported = std::fs::File::from(fd).metadata().unwrap().len();
            assert_eq!(exported, mem.len() as u64);

            // Freed on drop; the context released with the last holder of the GPU.
            drop(mem);
            assert_eq!(fake.live_allocations(), 0);
            assert_eq!(fake.context_refs(), 1);
            drop(gpu);
            assert_eq!(fake.context_refs(), 0);
        },
    );
}

#[test]
fn gpu_memory_is_prepared_and_described() {
    with_fake(
        "gpu_memory_is_prepared_and_described",
        Fake::Full,
        &[],
        || {
            let memory = Memory::prepare(BufferKind::Gpu {
                index: 0,
                registration: GpuRegistration::DmaBuf,
            })
            .unwrap();
            assert!(!memory.is_host());
            assert_eq!(
                memory.description(),
                "GPU 0 (Fake GPU 0 (stride test double), PCI 0000:1b:00.0), dma-buf"
            );
            drop(memory);
            assert_eq!(counters().context_refs(), 0);
        },
    );
}

#[test]
fn an_index_out_of_range_says_how_many_gpus_there_are() {
    with_fake(
        "an_index_out_of_range_says_how_many_gpus_there_are",
        Fake::Full,
        &[("FAKE_CUDA_GPUS", "2")],
        || {
            let second = cuda::open_gpu(1).unwrap();
            assert_eq!(second.name(), "Fake GPU 1 (stride test double)");
            assert_eq!(second.pci_bus_id(), "0000:1c:00.0");
            let e = cuda::open_gpu(2).unwrap_err();
            assert_eq!(e, CudaError::NoSuchGpu { index: 2, count: 2 });
            assert_eq!(
                e.to_string(),
                "there is no GPU 2: this machine has 2 GPUs (indices 0 to 1); pass one of those"
            );
            let e = Memory::prepare(BufferKind::Gpu {
                index: 7,
                registration: GpuRegistration::RegMr,
            })
            .unwrap_err();
            assert!(e.to_string().starts_with("there is no GPU 7"), "{e}");
        },
    );
}

#[test]
fn no_gpu_at_all_is_a_clear_error() {
    with_fake(
        "no_gpu_at_all_is_a_clear_error",
        Fake::Full,
        &[("FAKE_CUDA_GPUS", "0")],
        || {
            let e = cuda::open_gpu(0).unwrap_err();
            assert_eq!(
                e.to_string(),
                "the CUDA driver found no GPU (cuInit returned CUDA_ERROR_NO_DEVICE): run \
                 without --use-cuda"
            );
        },
    );
}

#[test]
fn a_missing_driver_library_is_named() {
    let missing = OsStr::new("/nonexistent/stride-test/libcuda.so.1");
    in_child(
        "a_missing_driver_library_is_named",
        &[("STRIDE_LIBCUDA", missing)],
        || {
            let e = cuda::driver().unwrap_err();
            let text = e.to_string();
            assert!(
                text.starts_with(
                    "the CUDA driver library /nonexistent/stride-test/libcuda.so.1 was not found"
                ),
                "{text}"
            );
            assert!(text.ends_with("install the NVIDIA driver, or run without --use-cuda"));
            // Loaded once: a second use gives the same answer without trying again.
            assert_eq!(cuda::driver().unwrap_err(), e);
            let e = Memory::prepare(BufferKind::Gpu {
                index: 0,
                registration: GpuRegistration::RegMr,
            })
            .unwrap_err();
            assert_eq!(e.to_string(), text);
        },
    );
}

#[test]
fn an_old_driver_cannot_export_dma_buf() {
    with_fake(
        "an_old_driver_cannot_export_dma_buf",
        Fake::NoDmaBufExport,
        &[],
        || {
            let driver = cuda::driver().unwrap();
            assert!(!driver.can_export_dma_buf());
            let gpu = cuda::open_gpu(0).unwrap();
            let e = gpu.check_dma_buf_export().unwrap_err();
            assert!(
                e.to_string()
                    .starts_with("this driver cannot export dma-buf (needs CUDA 11.7+ driver)"),
                "{e}"
            );
            let mem = gpu.alloc(4096).unwrap();
            assert!(matches!(
                mem.export_dma_buf(),
                Err(CudaError::NoDmaBufExport { .. })
            ));
            let e = Memory::prepare(BufferKind::Gpu {
                index: 0,
                registration: GpuRegistration::DmaBuf,
            })
            .unwrap_err();
            assert!(e.to_string().contains("needs CUDA 11.7+ driver"), "{e}");
            // Plain registration needs no export.
            let memory = Memory::prepare(BufferKind::Gpu {
                index: 0,
                registration: GpuRegistration::RegMr,
            })
            .unwrap();
            assert!(memory.description().ends_with(", GPUDirect reg_mr"));
        },
    );
}

#[test]
fn a_gpu_without_dma_buf_support_is_refused_for_dma_buf() {
    with_fake(
        "a_gpu_without_dma_buf_support_is_refused_for_dma_buf",
        Fake::Full,
        &[("FAKE_CUDA_DMABUF", "0")],
        || {
            let gpu = cuda::open_gpu(0).unwrap();
            assert!(!gpu.dma_buf_supported());
            let e = gpu.check_dma_buf_export().unwrap_err();
            assert!(
                e.to_string().starts_with(
                    "GPU 0 (Fake GPU 0 (stride test double)) cannot export dma-buf: the driver \
                     reports CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 0"
                ),
                "{e}"
            );
        },
    );
}

#[test]
fn driver_errors_carry_the_call_and_the_drivers_name_for_the_code() {
    with_fake(
        "driver_errors_carry_the_call_and_the_drivers_name_for_the_code",
        Fake::Full,
        &[],
        || {
            let gpu = cuda::open_gpu(0).unwrap();
            // More than any address space holds: the double's allocation fails.
            let e = gpu.alloc(1 << 50).unwrap_err();
            let text = e.to_string();
            assert!(
                text.starts_with("cuMemAlloc_v2 of "),
                "the call is named: {text}"
            );
            assert!(
                text.ends_with(" bytes on GPU 0 failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory)"),
                "{text}"
            );
            assert_eq!(counters().live_allocations(), 0);
        },
    );
}
