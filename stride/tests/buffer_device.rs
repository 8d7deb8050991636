//! Test buffers registered on an RDMA device: host memory, huge pages (when some are free),
//! and GPU memory through the CUDA driver test double (whose "GPU memory" is host memory, so
//! any NIC registers it with reg_mr, and no NIC takes its memfd as a dma-buf). Skips without a
//! device, unless `RDMA_TEST_DEVICE` is set.

mod support;

use sideway::memory_region::AccessFlags;
use stride::buffer::{
    BufferError, BufferKind, GpuRegistration, HugePagePool, Memory, MrLayout, QpBuffers, TestBuffer,
};
use stride::cuda::GPU_PAGE;
use support::{device_or_skip, fake_libcuda, in_child, Fake, FakeCounters};

const ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

/// What every kind of buffer must do alike.
fn exercise(buf: &mut TestBuffer, len: usize) {
    assert_eq!(buf.len(), len);
    let sge = buf.sge(0..len).expect("the whole buffer");
    assert_eq!(
        (sge.addr(), sge.length(), sge.lkey()),
        (buf.addr(), len as u32, buf.lkey())
    );
    let tail = buf.sge(len - 8..len).unwrap();
    assert_eq!(tail.addr(), buf.addr() + len as u64 - 8);
    assert!(buf.sge(0..len + 1).is_none());
    assert!(buf.read(0..len).unwrap().iter().all(|&b| b == 0), "zeroed");
    let pattern: Vec<u8> = (0..300u32).map(|i| (i * 13 + 1) as u8).collect();
    buf.write(len - 300, &pattern).unwrap();
    assert_eq!(buf.read(len - 300..len).unwrap(), pattern);
    buf.fill(0..64, 0x77).unwrap();
    assert_eq!(
        buf.read(60..68).unwrap(),
        [0x77, 0x77, 0x77, 0x77, 0, 0, 0, 0]
    );
    assert!(matches!(
        buf.write(len, &[1]),
        Err(BufferError::OutOfRange { .. })
    ));
    assert!(buf.read(len..len + 1).is_err());
}

#[test]
fn host_buffers() {
    let Some(ctx) = device_or_skip("host_buffers") else {
        return;
    };
    let pd = ctx.alloc_pd().unwrap();
    let memory = Memory::prepare(BufferKind::Host).unwrap();
    let len = 4096 + 100;
    let mut buf = memory.allocate(&pd, len, ACCESS).unwrap();
    assert_eq!(buf.description(), "host");
    assert!(buf.is_host());
    exercise(&mut buf, len);
    assert_eq!(buf.peek(0), Some(0x77));
    assert_eq!(buf.peek(len), None);
    buf.write(5, &[9]).unwrap();
    assert_eq!(buf.peek(5), Some(9));
    assert!(buf.inline(0..16).is_some(), "host bytes can be sent inline");
    assert!(buf.inline(0..len + 1).is_none());
}

#[test]
fn huge_page_buffers() {
    let Some(ctx) = device_or_skip("huge_page_buffers") else {
        return;
    };
    let pool = HugePagePool::read().expect("/proc/meminfo has huge page lines");
    if pool.free < 2 {
        println!(
            "huge page part skipped: {} huge pages free (reserve some: echo 8 > \
             /proc/sys/vm/nr_hugepages)",
            pool.free
        );
        return;
    }
    let pd = ctx.alloc_pd().unwrap();
    let memory = Memory::prepare(BufferKind::HugePages).unwrap();
    let len = pool.page_size + 1000;
    let mut buf = memory.allocate(&pd, len, ACCESS).unwrap();
    assert_eq!(buf.addr() % pool.page_size as u64, 0);
    assert_eq!(
        buf.description(),
        format!("huge pages ({} KiB)", pool.page_size / 1024)
    );
    exercise(&mut buf, len);
    assert_eq!(buf.peek(63), Some(0x77));
}

#[test]
fn gpu_buffers_through_the_test_double() {
    let lib = fake_libcuda(Fake::Full);
    in_child(
        "gpu_buffers_through_the_test_double",
        &[("STRIDE_LIBCUDA", lib.as_os_str())],
        || {
            let Some(ctx) = device_or_skip("gpu_buffers_through_the_test_double") else {
                return;
            };
            let pd = ctx.alloc_pd().unwrap();
            let memory = Memory::prepare(BufferKind::Gpu {
                index: 0,
                registration: GpuRegistration::RegMr,
            })
            .unwrap();
            let len = 2 * 65536;
            let mut buf = memory.allocate(&pd, len, ACCESS).unwrap();
            assert!(!buf.is_host());
            assert!(
                buf.inline(0..16).is_none(),
                "GPU bytes cannot be sent inline"
            );
            assert_eq!(buf.peek(0), None);
            assert_eq!(buf.addr() % GPU_PAGE as u64, 0);
            assert!(buf.description().ends_with("), GPUDirect reg_mr"));
            exercise(&mut buf, len);

            let memory = Memory::prepare(BufferKind::Gpu {
                index: 0,
                registration: GpuRegistration::DmaBuf,
            })
            .unwrap();
            let e = memory.allocate(&pd, len, ACCESS).unwrap_err();
            let text = e.to_string();
            assert!(
                matches!(e, BufferError::GpuRegister { .. }),
                "a memfd is no dma-buf: {text}"
            );
            assert!(text.starts_with("ibv_reg_dmabuf_mr of "), "{text}");
            assert!(
                text.contains("the NIC driver does not support dma-buf registration"),
                "{text}"
            );
        },
    );
}

/// The QPs' slices, in one shared region or one region each: apart, bounded, each written
/// and read on its own.
fn exercise_slices(
    memory: &Memory,
    pd: &std::sync::Arc<sideway::protection_domain::ProtectionDomain>,
) {
    let (qps, slice) = (3, 4096 + 128);
    for layout in [MrLayout::Shared, MrLayout::PerQp] {
        let mut bufs = QpBuffers::allocate(memory, pd, layout, qps, slice, ACCESS).unwrap();
        assert_eq!(bufs.qps(), qps);
        assert_eq!(bufs.layout(), layout);
        let regions = if layout == MrLayout::Shared { 1 } else { qps };
        assert_eq!(bufs.regions(), regions);
        for q in 0..qps {
            bufs.qp_mut(q).fill(0..slice, q as u8 + 1).unwrap();
        }
        for q in 0..qps {
            let buf = bufs.qp(q);
            assert_eq!(buf.len(), slice);
            // Each slice kept its own QP's bytes: no two overlap.
            let bytes = buf.read(0..slice).unwrap();
            assert!(
                bytes.iter().all(|&b| b == q as u8 + 1),
                "{layout:?}, QP {q}"
            );
            let sge = buf.sge(slice - 8..slice).unwrap();
            assert_eq!(sge.addr(), buf.addr() + slice as u64 - 8);
            assert_eq!(sge.lkey(), buf.lkey());
            assert!(buf.sge(0..slice + 1).is_none());
            assert!(buf.read(0..slice + 1).is_err());
            if q > 0 {
                let prev = bufs.qp(q - 1);
                match layout {
                    MrLayout::Shared => {
                        assert_eq!(buf.addr(), prev.addr() + slice as u64);
                        assert_eq!(buf.rkey(), prev.rkey(), "one region, one key");
                    }
                    MrLayout::PerQp => assert_ne!(buf.rkey(), prev.rkey(), "a key per QP"),
                }
            }
            assert!(matches!(
                bufs.qp_mut(q).write(slice, &[1]),
                Err(BufferError::OutOfRange { .. })
            ));
        }
    }
}

#[test]
fn qp_slices_in_host_memory() {
    let Some(ctx) = device_or_skip("qp_slices_in_host_memory") else {
        return;
    };
    let pd = ctx.alloc_pd().unwrap();
    exercise_slices(&Memory::prepare(BufferKind::Host).unwrap(), &pd);
    let pool = HugePagePool::read().expect("/proc/meminfo has huge page lines");
    if pool.free >= 4 {
        exercise_slices(&Memory::prepare(BufferKind::HugePages).unwrap(), &pd);
    } else {
        println!(
            "huge page part skipped: {} huge pages free (reserve some: echo 8 > \
             /proc/sys/vm/nr_hugepages)",
            pool.free
        );
    }
}

#[test]
fn qp_slices_in_gpu_memory_through_the_test_double() {
    let lib = fake_libcuda(Fake::Full);
    in_child(
        "qp_slices_in_gpu_memory_through_the_test_double",
        &[("STRIDE_LIBCUDA", lib.as_os_str())],
        || {
            let Some(ctx) = device_or_skip("qp_slices_in_gpu_memory_through_the_test_double")
            else {
                return;
            };
            let pd = ctx.alloc_pd().unwrap();
            let memory = Memory::prepare(BufferKind::Gpu {
                index: 0,
                registration: GpuRegistration::RegMr,
            })
            .unwrap();
            exercise_slices(&memory, &pd);
        },
    );
}

#[test]
fn staged_gpu_buffers_copy_through_host_memory() {
    let lib = fake_libcuda(Fake::Full);
    in_child(
        "staged_gpu_buffers_copy_through_host_memory",
        &[("STRIDE_LIBCUDA", lib.as_os_str())],
        || {
            let Some(ctx) = device_or_skip("staged_gpu_buffers_copy_through_host_memory") else {
                return;
            };
            let pd = ctx.alloc_pd().unwrap();
            let memory = Memory::prepare(BufferKind::Gpu {
                index: 0,
                registration: GpuRegistration::Staged,
            })
            .unwrap();
            assert!(memory.is_host() && memory.is_staged());
            let len = 2 * 4096;
            let mut buf = memory.allocate(&pd, len, ACCESS).unwrap();
            assert!(buf.is_host() && buf.is_staged());
            assert!(buf.inline(0..16).is_some(), "the NIC side is host memory");
            assert!(buf
                .description()
                .ends_with("), staging through host memory"));
            // The NIC works in host memory (no GPU page alignment needed).
            assert_eq!(buf.addr() % sideway::memory_region::page_size() as u64, 0);
            exercise(&mut buf, len);
            buf.fill(64..128, 0x77).unwrap();
            let fake = FakeCounters::open(&lib);
            let before = fake.copies();
            // The host side changed alone (as the NIC would change it)...
            buf.poke(100, 0xab).unwrap();
            assert_eq!(buf.peek(100), Some(0xab));
            assert_eq!(buf.read(100..101).unwrap(), [0x77], "the GPU kept its byte");
            // ...is put back from the GPU before a send,
            buf.stage_from_gpu(64..128).unwrap();
            assert_eq!(buf.peek(100), Some(0x77));
            // and goes to the GPU after a receive.
            buf.poke(4097, 0xcd).unwrap();
            buf.stage_to_gpu(4096..4096 + 300).unwrap();
            assert_eq!(buf.read(4097..4098).unwrap(), [0xcd]);
            let after = fake.copies();
            // Besides the reads above (DtoH, 1 byte each and 1 after), one copy each way.
            assert_eq!(
                after[0] - before[0],
                3,
                "DtoH calls: {before:?} -> {after:?}"
            );
            assert_eq!(after[1] - before[1], 64 + 2, "DtoH bytes");
            assert_eq!(after[2] - before[2], 1, "HtoD calls");
            assert_eq!(after[3] - before[3], 300, "HtoD bytes");
            assert!(buf.stage_to_gpu(len - 8..len + 1).is_err());
            // Other kinds stage nothing.
            let host = Memory::prepare(BufferKind::Host).unwrap();
            let plain = host.allocate(&pd, 4096, ACCESS).unwrap();
            plain.stage_from_gpu(0..64).unwrap();
            plain.stage_to_gpu(0..64).unwrap();
            assert_eq!(fake.copies(), after);
        },
    );
}
