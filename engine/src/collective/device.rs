//! GPU collectives: NCCL on NVIDIA and RCCL on AMD, which share one C API (`ncclAllReduce`,
//! …), with the CUDA or HIP runtime for memory and streams. Both libraries are loaded at run
//! time with libloading, so the crate builds and its CI runs on machines with no GPU, and the
//! NCCL that ships in the torch wheel (`nvidia/nccl/lib`) or a system RCCL is used as found.
//!
//! Ranks exchange the 128-byte `ncclUniqueId` through a [`TcpGroup`] (torchrun's variables),
//! as torch.distributed does through its TCPStore. The [`Collective`] impl stages host
//! buffers through device memory; the `*_device` methods take device pointers directly for
//! device-resident engine buffers.
//!
//! The communicator is non-blocking (`ncclCommInitRankConfig` with `blocking = 0`), so no
//! NCCL call and no wait for a collective blocks the host: the [`watchdog`] polls the stream and
//! `ncclCommGetAsyncError`, and past the collective timeout aborts the communicator
//! (`ncclCommAbort`) — a rank whose peer stopped fails naming the collective rather than
//! hanging in the driver (torch's NCCL watchdog and `timeout`).

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use libloading::Library;

use super::watchdog::{self, Progress, Watched};
use super::{
    check_chunks, chunk, Collective, CollectiveError, Element, ElementKind, ReduceOp, TcpGroup,
};

/// Which vendor's libraries to load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vendor {
    /// NCCL + CUDA runtime.
    Nvidia,
    /// RCCL + HIP runtime.
    Amd,
}

impl Vendor {
    fn prefix(self) -> &'static str {
        match self {
            Vendor::Nvidia => "cuda",
            Vendor::Amd => "hip",
        }
    }

    /// Library paths tried in order: `ORTBENCH_NCCL_LIB` / `ORTBENCH_GPU_RUNTIME_LIB` (a full
    /// path), then the torch wheel's (`nvidia/nccl/lib`; `nvidia/cu13/lib`, or CUDA 12's
    /// `nvidia/cuda_runtime/lib`) wherever [`crate::torch_wheel`] finds torch, then the
    /// loader's path by file name.
    fn candidates(self) -> (Vec<PathBuf>, Vec<PathBuf>) {
        let mut coll = Vec::new();
        let mut rt = Vec::new();
        if let Some(p) = std::env::var_os("ORTBENCH_NCCL_LIB") {
            coll.push(PathBuf::from(p));
        }
        if let Some(p) = std::env::var_os("ORTBENCH_GPU_RUNTIME_LIB") {
            rt.push(PathBuf::from(p));
        }
        match self {
            Vendor::Nvidia => {
                if let Some(d) = crate::torch_wheel::nccl_lib_dir() {
                    coll.push(d.join("libnccl.so.2"));
                }
                for d in crate::torch_wheel::cuda_lib_dirs() {
                    rt.extend(
                        ["libcudart.so.13", "libcudart.so.12"]
                            .iter()
                            .map(|f| d.join(f))
                            .filter(|p| p.is_file()),
                    );
                }
                coll.push("libnccl.so.2".into());
                rt.extend(
                    ["libcudart.so.13", "libcudart.so.12", "libcudart.so"].map(PathBuf::from),
                );
            }
            Vendor::Amd => {
                coll.extend(["librccl.so.1", "librccl.so"].map(PathBuf::from));
                rt.extend(
                    ["libamdhip64.so.6", "libamdhip64.so.5", "libamdhip64.so"].map(PathBuf::from),
                );
            }
        }
        (coll, rt)
    }
}

type NcclComm = *mut c_void;
/// cudaStream_t / hipStream_t (null: the legacy default stream, which the engine's CUDA
/// device and libtorch queue on).
pub type Stream = *mut c_void;
/// ncclUniqueId: 128 opaque bytes.
#[repr(C)]
#[derive(Clone, Copy)]
struct UniqueId([c_char; 128]);

/// `ncclConfig_t` as NCCL 2.14 introduced it; NCCL reads `size` and `version` and takes this
/// prefix of its current layout, so newer libraries accept it.
#[repr(C)]
struct NcclConfig {
    size: usize,
    magic: c_uint,
    version: c_uint,
    blocking: c_int,
    cga_cluster_size: c_int,
    min_ctas: c_int,
    max_ctas: c_int,
    net_name: *const c_char,
}

impl NcclConfig {
    /// NCCL_CONFIG_INITIALIZER of NCCL 2.14 with `blocking = 0`.
    fn non_blocking() -> Self {
        const UNDEF: c_int = c_int::MIN; // NCCL_CONFIG_UNDEF_INT
        NcclConfig {
            size: std::mem::size_of::<NcclConfig>(),
            magic: 0xcafe_beef,
            version: 21400, // NCCL_VERSION(2, 14, 0)
            blocking: 0,
            cga_cluster_size: UNDEF,
            min_ctas: UNDEF,
            max_ctas: UNDEF,
            net_name: std::ptr::null(),
        }
    }
}

/// ncclInProgress: a non-blocking communicator's call is still running.
const NCCL_IN_PROGRESS: c_int = 7;
/// cudaErrorNotReady / hipErrorNotReady: the stream still has work.
const NOT_READY: c_int = 600;

/// How long a collective may take on a GPU unless told otherwise: torch's NCCL default.
pub const DEFAULT_DEVICE_TIMEOUT: Duration = Duration::from_secs(600);

/// The entry points we use, resolved once.
struct Api {
    get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> c_int,
    comm_init_rank_config:
        unsafe extern "C" fn(*mut NcclComm, c_int, UniqueId, c_int, *mut NcclConfig) -> c_int,
    comm_get_async_error: unsafe extern "C" fn(NcclComm, *mut c_int) -> c_int,
    comm_abort: unsafe extern "C" fn(NcclComm) -> c_int,
    comm_destroy: unsafe extern "C" fn(NcclComm) -> c_int,
    get_error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        NcclComm,
        Stream,
    ) -> c_int,
    reduce_scatter: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        NcclComm,
        Stream,
    ) -> c_int,
    all_gather:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, NcclComm, Stream) -> c_int,
    broadcast: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        NcclComm,
        Stream,
    ) -> c_int,
    // CUDA / HIP runtime (identical signatures).
    set_device: unsafe extern "C" fn(c_int) -> c_int,
    get_device_count: unsafe extern "C" fn(*mut c_int) -> c_int,
    malloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int,
    free: unsafe extern "C" fn(*mut c_void) -> c_int,
    memcpy: unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int) -> c_int,
    memset: unsafe extern "C" fn(*mut c_void, c_int, usize) -> c_int,
    stream_create: unsafe extern "C" fn(*mut Stream) -> c_int,
    stream_query: unsafe extern "C" fn(Stream) -> c_int,
    rt_error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    _libs: (Library, Library),
}

fn open_first(paths: &[PathBuf]) -> Result<Library, String> {
    let mut tried = Vec::new();
    for p in paths {
        // SAFETY: loading a vendor library runs its initialisers; these are the libraries we
        // mean to call, found at the documented paths.
        match unsafe { Library::new(p) } {
            Ok(l) => return Ok(l),
            Err(e) => tried.push(format!("{} ({e})", p.display())),
        }
    }
    Err(tried.join("; "))
}

impl Api {
    fn load(vendor: Vendor) -> Result<Api, CollectiveError> {
        let (coll_paths, rt_paths) = vendor.candidates();
        let name = if vendor == Vendor::Nvidia { "NCCL" } else { "RCCL" };
        // The runtime first: NCCL may need it resolved already.
        let rt = open_first(&rt_paths).map_err(|t| {
            CollectiveError::Unavailable(format!(
                "{} runtime not found; tried: {t}",
                vendor.prefix()
            ))
        })?;
        let coll = open_first(&coll_paths)
            .map_err(|t| CollectiveError::Unavailable(format!("{name} not found; tried: {t}")))?;
        macro_rules! sym {
            ($lib:expr, $name:expr) => {{
                // SAFETY: the symbol has the C signature of the field it is stored in (from
                // nccl.h / cuda_runtime_api.h / hip_runtime_api.h).
                let s = unsafe { $lib.get($name) }.map_err(|e| {
                    CollectiveError::Unavailable(format!(
                        "{}: {e}",
                        String::from_utf8_lossy(&$name[..$name.len() - 1])
                    ))
                })?;
                *s
            }};
        }
        let p = vendor.prefix();
        let rt_sym = |n: &str| format!("{p}{n}\0").into_bytes();
        let api = Api {
            get_unique_id: sym!(coll, b"ncclGetUniqueId\0"),
            // NCCL ≥ 2.14 (torch wheels ship 2.2x): an older library is refused by name here.
            comm_init_rank_config: sym!(coll, b"ncclCommInitRankConfig\0"),
            comm_get_async_error: sym!(coll, b"ncclCommGetAsyncError\0"),
            comm_abort: sym!(coll, b"ncclCommAbort\0"),
            comm_destroy: sym!(coll, b"ncclCommDestroy\0"),
            get_error_string: sym!(coll, b"ncclGetErrorString\0"),
            all_reduce: sym!(coll, b"ncclAllReduce\0"),
            reduce_scatter: sym!(coll, b"ncclReduceScatter\0"),
            all_gather: sym!(coll, b"ncclAllGather\0"),
            broadcast: sym!(coll, b"ncclBroadcast\0"),
            set_device: sym!(rt, &rt_sym("SetDevice")[..]),
            get_device_count: sym!(rt, &rt_sym("GetDeviceCount")[..]),
            malloc: sym!(rt, &rt_sym("Malloc")[..]),
            free: sym!(rt, &rt_sym("Free")[..]),
            memcpy: sym!(rt, &rt_sym("Memcpy")[..]),
            memset: sym!(rt, &rt_sym("Memset")[..]),
            stream_create: sym!(rt, &rt_sym("StreamCreate")[..]),
            stream_query: sym!(rt, &rt_sym("StreamQuery")[..]),
            rt_error_string: sym!(rt, &rt_sym("GetErrorString")[..]),
            _libs: (coll, rt),
        };
        Ok(api)
    }

    fn nccl(&self, rc: c_int, what: &str) -> Result<(), CollectiveError> {
        if rc == 0 {
            return Ok(());
        }
        // SAFETY: ncclGetErrorString returns a static NUL-terminated string.
        let msg = unsafe { CStr::from_ptr((self.get_error_string)(rc)) }.to_string_lossy();
        Err(CollectiveError::Device(format!("{what}: {msg} (nccl error {rc})")))
    }

    fn rt(&self, rc: c_int, what: &str) -> Result<(), CollectiveError> {
        if rc == 0 {
            return Ok(());
        }
        // SAFETY: cudaGetErrorString / hipGetErrorString return static strings.
        let msg = unsafe { CStr::from_ptr((self.rt_error_string)(rc)) }.to_string_lossy();
        Err(CollectiveError::Device(format!("{what}: {msg} (runtime error {rc})")))
    }
}

// ncclDataType_t and ncclRedOp_t values (nccl.h).
fn nccl_dtype(k: ElementKind) -> c_int {
    match k {
        ElementKind::U8 => 1,   // ncclUint8
        ElementKind::F16 => 6,  // ncclFloat16
        ElementKind::F32 => 7,  // ncclFloat32
        ElementKind::F64 => 8,  // ncclFloat64
        ElementKind::Bf16 => 9, // ncclBfloat16
    }
}
fn kind_size(k: ElementKind) -> usize {
    match k {
        ElementKind::U8 => 1,
        ElementKind::F16 | ElementKind::Bf16 => 2,
        ElementKind::F32 => 4,
        ElementKind::F64 => 8,
    }
}
fn nccl_op(op: ReduceOp) -> c_int {
    match op {
        ReduceOp::Sum => 0, // ncclSum
        ReduceOp::Max => 2, // ncclMax
        ReduceOp::Avg => 4, // ncclAvg (NCCL ≥ 2.10, RCCL ≥ 2.10)
    }
}
const H2D: c_int = 1;
const D2H: c_int = 2;

/// One rank of a NCCL/RCCL communicator.
pub struct DeviceGroup {
    api: Api,
    comm: NcclComm,
    stream: Stream,
    rank: usize,
    world: usize,
    /// A device staging buffer for host collectives, grown on demand.
    staging: Mutex<(*mut c_void, usize)>,
    /// How long the watchdog lets a collective run before aborting the communicator.
    timeout: Duration,
    /// Set once the watchdog aborted the communicator (it is then not destroyed again).
    aborted: AtomicBool,
}

/// What the watchdog polls for one of our collectives: the communicator's asynchronous error,
/// and with a stream, whether the stream's work (the collective and what precedes it) is done.
struct InFlight<'a> {
    group: &'a DeviceGroup,
    stream: Option<Stream>,
}

impl Watched for InFlight<'_> {
    fn poll(&self) -> Result<Progress, CollectiveError> {
        let (g, a) = (self.group, &self.group.api);
        let mut state: c_int = 0;
        // SAFETY: our own communicator, a valid out-pointer.
        a.nccl(unsafe { (a.comm_get_async_error)(g.comm, &mut state) }, "ncclCommGetAsyncError")?;
        if state == NCCL_IN_PROGRESS {
            return Ok(Progress::Pending);
        }
        a.nccl(state, "the communicator's asynchronous error")?;
        let Some(stream) = self.stream else { return Ok(Progress::Done) };
        // SAFETY: a stream of this device, live while the group is.
        match unsafe { (a.stream_query)(stream) } {
            0 => Ok(Progress::Done),
            NOT_READY => Ok(Progress::Pending),
            rc => a.rt(rc, "querying the stream").map(|()| Progress::Done),
        }
    }

    fn abort(&self) {
        let g = self.group;
        if !g.aborted.swap(true, Ordering::SeqCst) {
            // SAFETY: our own communicator, aborted once; nothing uses it afterwards.
            unsafe { (g.api.comm_abort)(g.comm) };
        }
    }
}

// SAFETY: the communicator and stream are used by one thread at a time, as NCCL requires per
// communicator: the group is Send but not Sync, so only its owning thread calls it (the
// staging mutex guards the staging buffer; the `queue_*` calls on the caller's stream need
// none).
unsafe impl Send for DeviceGroup {}

impl DeviceGroup {
    /// Joins a communicator of `world` ranks on device `local_rank`; ranks exchange the
    /// unique id through `store` (rank 0 creates it). Collectives time out after 600 s.
    pub fn new(
        vendor: Vendor,
        store: &TcpGroup,
        local_rank: usize,
    ) -> Result<Self, CollectiveError> {
        Self::with_timeout(vendor, store, local_rank, DEFAULT_DEVICE_TIMEOUT)
    }

    /// As [`DeviceGroup::new`], with `timeout` for the join and for every collective
    /// (`--collective-timeout-s`).
    pub fn with_timeout(
        vendor: Vendor,
        store: &TcpGroup,
        local_rank: usize,
        timeout: Duration,
    ) -> Result<Self, CollectiveError> {
        let api = Api::load(vendor)?;
        let mut n: c_int = 0;
        // SAFETY: plain runtime calls with valid out-pointers.
        unsafe {
            api.rt((api.get_device_count)(&mut n), "counting GPUs")?;
            if local_rank >= n as usize {
                return Err(CollectiveError::Device(format!(
                    "LOCAL_RANK {local_rank} but {n} GPU(s) visible"
                )));
            }
            api.rt((api.set_device)(local_rank as c_int), "selecting the GPU")?;
        }
        let mut id = UniqueId([0; 128]);
        if store.rank() == 0 {
            // SAFETY: valid out-pointer to a 128-byte id.
            api.nccl(unsafe { (api.get_unique_id)(&mut id) }, "ncclGetUniqueId")?;
        }
        // SAFETY: c_char and u8 have the same layout.
        let bytes: &mut [u8] =
            unsafe { std::slice::from_raw_parts_mut(id.0.as_mut_ptr().cast(), 128) };
        store.broadcast(bytes, 0)?;
        let (mut comm, mut stream): (NcclComm, Stream) =
            (std::ptr::null_mut(), std::ptr::null_mut());
        let (rank, world) = (store.rank(), store.world_size());
        let mut config = NcclConfig::non_blocking();
        // SAFETY: valid out-pointers; every rank passes the same id and world size.
        let rc = unsafe {
            (api.comm_init_rank_config)(&mut comm, world as c_int, id, rank as c_int, &mut config)
        };
        if rc != NCCL_IN_PROGRESS {
            api.nccl(rc, "ncclCommInitRankConfig")?;
        }
        // SAFETY: a valid out-pointer.
        unsafe { api.rt((api.stream_create)(&mut stream), "creating a stream")? };
        let group = DeviceGroup {
            api,
            comm,
            stream,
            rank,
            world,
            staging: Mutex::new((std::ptr::null_mut(), 0)),
            timeout,
            aborted: AtomicBool::new(false),
        };
        // The non-blocking init runs on: wait for it under the watchdog (a peer that never
        // joins is a timeout, not a hang).
        group.watch(None, "ncclCommInitRankConfig")?;
        Ok(group)
    }

    /// Waits under the watchdog for `stream`'s work (None: for the communicator's pending
    /// call only); past the timeout, or on an asynchronous error, the communicator is aborted
    /// and the error names `collective`.
    pub fn watch(&self, stream: Option<Stream>, collective: &str) -> Result<(), CollectiveError> {
        if self.aborted.load(Ordering::SeqCst) {
            return Err(CollectiveError::Device(format!(
                "{collective}: the communicator was aborted by an earlier collective"
            )));
        }
        watchdog::watch(&InFlight { group: self, stream }, collective, self.timeout)
    }

    /// The result of a queuing call: a non-blocking communicator may still be queuing
    /// (ncclInProgress), which the watchdog waits for.
    fn queued(&self, rc: c_int, what: &str) -> Result<(), CollectiveError> {
        match rc {
            NCCL_IN_PROGRESS => self.watch(None, what),
            rc => self.api.nccl(rc, what),
        }
    }

    /// Queues an in-place all-reduce of `count` elements of `kind` at device address `buf` on
    /// `stream` (the caller's: ordered with its kernels; nothing is waited for).
    ///
    /// # Safety
    /// `buf` addresses `count` elements of `kind` in this rank's device memory, live until the
    /// stream has run the collective.
    pub unsafe fn queue_all_reduce(
        &self,
        buf: u64,
        count: usize,
        kind: ElementKind,
        op: ReduceOp,
        stream: Stream,
    ) -> Result<(), CollectiveError> {
        let (a, p) = (&self.api, buf as *mut c_void);
        self.queued(
            (a.all_reduce)(p, p, count, nccl_dtype(kind), nccl_op(op), self.comm, stream),
            "ncclAllReduce",
        )
    }

    /// Queues NCCL's in-place reduce-scatter over world·`k` elements at `buf`: chunk r of rank
    /// r becomes the reduction (`ncclReduceScatter(buf, buf + r·k, k)`).
    ///
    /// # Safety
    /// `buf` addresses world·k elements of `kind` in this rank's device memory.
    pub unsafe fn queue_reduce_scatter(
        &self,
        buf: u64,
        k: usize,
        kind: ElementKind,
        op: ReduceOp,
        stream: Stream,
    ) -> Result<(), CollectiveError> {
        let (a, p) = (&self.api, buf as *mut c_void);
        let mine = p.cast::<u8>().add(self.rank * k * kind_size(kind)).cast();
        self.queued(
            (a.reduce_scatter)(p, mine, k, nccl_dtype(kind), nccl_op(op), self.comm, stream),
            "ncclReduceScatter",
        )
    }

    /// Queues NCCL's in-place all-gather over world·`k` elements at `buf` (chunk q from rank q:
    /// `ncclAllGather(buf + r·k, buf, k)`).
    ///
    /// # Safety
    /// As [`DeviceGroup::queue_reduce_scatter`].
    pub unsafe fn queue_all_gather(
        &self,
        buf: u64,
        k: usize,
        kind: ElementKind,
        stream: Stream,
    ) -> Result<(), CollectiveError> {
        let (a, p) = (&self.api, buf as *mut c_void);
        let mine = p.cast::<u8>().add(self.rank * k * kind_size(kind)).cast();
        self.queued(
            (a.all_gather)(mine, p, k, nccl_dtype(kind), self.comm, stream),
            "ncclAllGather",
        )
    }

    /// Stages `bytes` of host data on the device, runs `op(device ptr)`, copies `back` bytes
    /// of the result to `out`.
    fn staged(
        &self,
        input: &[u8],
        size: usize,
        out: &mut [u8],
        out_offset: usize,
        op: impl FnOnce(*mut c_void) -> Result<(), CollectiveError>,
    ) -> Result<(), CollectiveError> {
        let st = self.staging(size)?;
        self.upload(st.0, 0, input)?;
        op(st.0)?;
        self.finish()?;
        self.download(out, st.0, out_offset)
    }

    /// The device staging buffer, grown to at least `size` bytes, locked for one collective.
    fn staging(
        &self,
        size: usize,
    ) -> Result<std::sync::MutexGuard<'_, (*mut c_void, usize)>, CollectiveError> {
        let a = &self.api;
        let mut st =
            self.staging.lock().map_err(|_| CollectiveError::Poisoned("device collective"))?;
        if st.1 < size {
            // SAFETY: runtime calls on our own allocation.
            unsafe {
                if !st.0.is_null() {
                    a.rt((a.free)(st.0), "freeing staging memory")?;
                }
                *st = (std::ptr::null_mut(), 0);
                let mut p = std::ptr::null_mut();
                a.rt((a.malloc)(&mut p, size), "allocating staging memory")?;
                *st = (p, size);
            }
        }
        Ok(st)
    }

    /// Copies `host` to the staging buffer `dev` at byte offset `at` (within its size: the
    /// callers size the staging buffer for their layout first).
    fn upload(&self, dev: *mut c_void, at: usize, host: &[u8]) -> Result<(), CollectiveError> {
        let a = &self.api;
        // SAFETY: `dev` is the staging allocation, at least `at + host.len()` bytes.
        a.rt(
            unsafe {
                (a.memcpy)(dev.cast::<u8>().add(at).cast(), host.as_ptr().cast(), host.len(), H2D)
            },
            "copying to the GPU",
        )
    }

    /// Copies bytes `at..at + host.len()` of the staging buffer `dev` to `host`.
    fn download(
        &self,
        host: &mut [u8],
        dev: *mut c_void,
        at: usize,
    ) -> Result<(), CollectiveError> {
        let a = &self.api;
        // SAFETY: as in `upload`.
        a.rt(
            unsafe {
                (a.memcpy)(
                    host.as_mut_ptr().cast(),
                    dev.cast::<u8>().add(at).cast(),
                    host.len(),
                    D2H,
                )
            },
            "copying from the GPU",
        )
    }

    /// Zeroes bytes `range` of the staging buffer `dev`.
    fn zero(&self, dev: *mut c_void, range: std::ops::Range<usize>) -> Result<(), CollectiveError> {
        let a = &self.api;
        if range.is_empty() {
            return Ok(());
        }
        // SAFETY: as in `upload`.
        a.rt(
            unsafe { (a.memset)(dev.cast::<u8>().add(range.start).cast(), 0, range.len()) },
            "zeroing staging memory",
        )
    }

    /// Waits for the collective queued on our stream, under the watchdog.
    fn finish(&self) -> Result<(), CollectiveError> {
        self.watch(Some(self.stream), "a host-staged collective")
    }

    /// Runs an in-place collective over the host buffer `buf` through a staging buffer that
    /// holds the padded N·k elements, laid out by `layout` (so NCCL's in-place form applies
    /// as on a device-resident padded buffer); `op(staging)` queues the NCCL call.
    fn staged_in_place<T: Element>(
        &self,
        buf: &mut [T],
        layout: &InPlaceLayout,
        op: impl FnOnce(*mut c_void) -> Result<(), CollectiveError>,
    ) -> Result<(), CollectiveError> {
        let esz = std::mem::size_of::<T>();
        let b = |r: &std::ops::Range<usize>| r.start * esz..r.end * esz;
        let st = self.staging(layout.padded * esz)?;
        // Host and device offsets coincide: the staging buffer mirrors the padded flat buffer.
        let up = b(&layout.upload);
        self.upload(st.0, up.start, &bytes(buf)[up])?;
        self.zero(st.0, b(&layout.zero))?;
        op(st.0)?;
        self.finish()?;
        let down = b(&layout.download);
        self.download(&mut bytes_mut(buf)[down.clone()], st.0, down.start)
    }
}

/// Where an in-place collective over a host buffer of `len` elements in chunks of `k` puts
/// things in the device staging buffer of `padded` = N·k elements; element offsets, the same
/// on the host and the device.
#[derive(Clone, Debug, PartialEq, Eq)]
struct InPlaceLayout {
    padded: usize,
    /// Host elements copied to the device before the collective.
    upload: std::ops::Range<usize>,
    /// Device elements the collective reads that have no host counterpart (the padding):
    /// zeroed, so the collective never reads stale staging memory.
    zero: std::ops::Range<usize>,
    /// Elements copied back to the host after it.
    download: std::ops::Range<usize>,
}

impl InPlaceLayout {
    /// Reduce-scatter: every rank's whole buffer goes up, the padded tail is zero, rank r's
    /// chunk comes back.
    fn reduce_scatter(len: usize, k: usize, world: usize, rank: usize) -> Self {
        InPlaceLayout {
            padded: world * k,
            upload: 0..len,
            zero: len..world * k,
            download: chunk(len, k, rank),
        }
    }

    /// All-gather: rank r's chunk goes up (its padded part zeroed), the stored `len` elements
    /// come back.
    fn all_gather(len: usize, k: usize, world: usize, rank: usize) -> Self {
        let mine = chunk(len, k, rank);
        InPlaceLayout {
            padded: world * k,
            zero: mine.end.max(rank * k)..(rank + 1) * k,
            upload: mine,
            download: 0..len,
        }
    }
}

impl Drop for DeviceGroup {
    fn drop(&mut self) {
        // SAFETY: our own communicator and allocation; errors at teardown are ignored.
        unsafe {
            if let Ok(st) = self.staging.lock() {
                if !st.0.is_null() {
                    (self.api.free)(st.0);
                }
            }
            // An aborted communicator is already freed.
            if !self.aborted.load(Ordering::SeqCst) {
                (self.api.comm_destroy)(self.comm);
            }
        }
    }
}

fn bytes<T: Element>(x: &[T]) -> &[u8] {
    // SAFETY: Elements are plain old data.
    unsafe { std::slice::from_raw_parts(x.as_ptr().cast(), std::mem::size_of_val(x)) }
}
fn bytes_mut<T: Element>(x: &mut [T]) -> &mut [u8] {
    // SAFETY: as above; every bit pattern is valid.
    unsafe { std::slice::from_raw_parts_mut(x.as_mut_ptr().cast(), std::mem::size_of_val(x)) }
}

impl Collective for DeviceGroup {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
    }

    fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<(), CollectiveError> {
        let (n, dt) = (buf.len(), nccl_dtype(T::KIND));
        let input = bytes(buf).to_vec();
        let a = &self.api;
        self.staged(&input, input.len(), bytes_mut(buf), 0, |p| {
            // SAFETY: p holds n elements of T on the device.
            self.queued(
                unsafe { (a.all_reduce)(p, p, n, dt, nccl_op(op), self.comm, self.stream) },
                "ncclAllReduce",
            )
        })
    }

    fn reduce_scatter<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        let k = recv.len();
        if send.len() != self.world * k {
            return Err(CollectiveError::Size {
                op: "reduce_scatter",
                rank: self.rank,
                expected: self.world * k,
                got: send.len(),
            });
        }
        let (dt, esz) = (nccl_dtype(T::KIND), std::mem::size_of::<T>());
        let a = &self.api;
        // Layout on the device: [send (N·k) | recv (k)].
        let total = (send.len() + k) * esz;
        self.staged(bytes(send), total, bytes_mut(recv), send.len() * esz, |p| {
            // SAFETY: p holds N·k + k elements; recv starts after send.
            self.queued(
                unsafe {
                    (a.reduce_scatter)(
                        p,
                        p.cast::<u8>().add(send.len() * esz).cast(),
                        k,
                        dt,
                        nccl_op(op),
                        self.comm,
                        self.stream,
                    )
                },
                "ncclReduceScatter",
            )
        })
    }

    fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<(), CollectiveError> {
        let k = send.len();
        if recv.len() != self.world * k {
            return Err(CollectiveError::Size {
                op: "all_gather",
                rank: self.rank,
                expected: self.world * k,
                got: recv.len(),
            });
        }
        let (dt, esz) = (nccl_dtype(T::KIND), std::mem::size_of::<T>());
        let a = &self.api;
        // Layout on the device: [send (k) | recv (N·k)].
        self.staged(bytes(send), (k + recv.len()) * esz, bytes_mut(recv), k * esz, |p| {
            // SAFETY: p holds k + N·k elements; recv starts after send.
            self.queued(
                unsafe {
                    (a.all_gather)(
                        p,
                        p.cast::<u8>().add(k * esz).cast(),
                        k,
                        dt,
                        self.comm,
                        self.stream,
                    )
                },
                "ncclAllGather",
            )
        })
    }

    fn reduce_scatter_in_place<T: Element>(
        &self,
        buf: &mut [T],
        k: usize,
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        check_chunks("reduce_scatter_in_place", self.rank, buf.len(), k, self.world)?;
        let layout = InPlaceLayout::reduce_scatter(buf.len(), k, self.world, self.rank);
        let (dt, esz, a) = (nccl_dtype(T::KIND), std::mem::size_of::<T>(), &self.api);
        self.staged_in_place(buf, &layout, |p| {
            // SAFETY: p holds N·k elements; recv = p + r·k (NCCL's in-place reduce-scatter).
            self.queued(
                unsafe {
                    (a.reduce_scatter)(
                        p,
                        p.cast::<u8>().add(self.rank * k * esz).cast(),
                        k,
                        dt,
                        nccl_op(op),
                        self.comm,
                        self.stream,
                    )
                },
                "ncclReduceScatter",
            )
        })
    }

    fn all_gather_in_place<T: Element>(
        &self,
        buf: &mut [T],
        k: usize,
    ) -> Result<(), CollectiveError> {
        check_chunks("all_gather_in_place", self.rank, buf.len(), k, self.world)?;
        let layout = InPlaceLayout::all_gather(buf.len(), k, self.world, self.rank);
        let (dt, esz, a) = (nccl_dtype(T::KIND), std::mem::size_of::<T>(), &self.api);
        self.staged_in_place(buf, &layout, |p| {
            // SAFETY: p holds N·k elements; send = p + r·k (NCCL's in-place all-gather).
            self.queued(
                unsafe {
                    (a.all_gather)(
                        p.cast::<u8>().add(self.rank * k * esz).cast(),
                        p,
                        k,
                        dt,
                        self.comm,
                        self.stream,
                    )
                },
                "ncclAllGather",
            )
        })
    }

    fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<(), CollectiveError> {
        if root >= self.world {
            return Err(CollectiveError::Root { root, world: self.world });
        }
        let (n, dt) = (buf.len(), nccl_dtype(T::KIND));
        let input = bytes(buf).to_vec();
        let a = &self.api;
        self.staged(&input, input.len(), bytes_mut(buf), 0, |p| {
            // SAFETY: p holds n elements.
            self.queued(
                unsafe { (a.broadcast)(p, p, n, dt, root as c_int, self.comm, self.stream) },
                "ncclBroadcast",
            )
        })
    }

    fn barrier(&self) -> Result<(), CollectiveError> {
        // NCCL has no barrier: an all-reduce of one byte synchronises every rank.
        let mut x = [0u8];
        self.all_reduce(&mut x, ReduceOp::Max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_libraries_are_a_clear_error() {
        // RCCL is not installed on the CI machines: the error names what was tried.
        match Api::load(Vendor::Amd) {
            Ok(_) => eprintln!("note: RCCL and HIP are installed here; nothing to check"),
            Err(e) => {
                let m = e.to_string();
                assert!(m.contains("hip runtime not found") || m.contains("RCCL not found"), "{m}");
                assert!(m.contains("libamdhip64") || m.contains("librccl"), "{m}");
            }
        }
    }

    #[test]
    fn nccl_from_the_torch_wheel_loads_and_without_a_gpu_says_so() {
        // The venv's torch wheel ships libnccl.so.2 and libcudart: the API must resolve every
        // symbol; joining then fails cleanly where there is no GPU (CI), or works on one GPU.
        let api = match Api::load(Vendor::Nvidia) {
            Ok(a) => a,
            Err(e) => panic!(
                "NCCL from the torch wheel should load (VIRTUAL_ENV={:?}): {e}",
                std::env::var("VIRTUAL_ENV")
            ),
        };
        let mut n: c_int = -1;
        // SAFETY: valid out-pointer.
        let rc = unsafe { (api.get_device_count)(&mut n) };
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let store = TcpGroup::root(listener, 1, std::time::Duration::from_secs(5)).unwrap();
        let joined = DeviceGroup::new(Vendor::Nvidia, &store, 0);
        if rc != 0 || n == 0 {
            let e = joined.err().expect("no GPU: joining must fail").to_string();
            assert!(e.contains("GPU") || e.contains("runtime error"), "{e}");
        } else {
            // One rank on one GPU: all-reduce is the identity, all-gather a copy.
            let g = joined.unwrap();
            let mut x = vec![1.5f32, -2.0, 3.25];
            g.all_reduce(&mut x, ReduceOp::Sum).unwrap();
            assert_eq!(x, [1.5, -2.0, 3.25]);
            let mut out = vec![0f32; 3];
            g.all_gather(&x, &mut out).unwrap();
            assert_eq!(out, x);
            // In place on a buffer shorter than its one chunk of 16 (the padding staged).
            g.reduce_scatter_in_place(&mut x, 16, ReduceOp::Sum).unwrap();
            g.all_gather_in_place(&mut x, 16).unwrap();
            assert_eq!(x, [1.5, -2.0, 3.25]);
        }
    }

    /// NCCL's in-place semantics over each rank's staging buffer (padded N·k elements), the
    /// GPU part of `staged_in_place`, simulated on the host for all ranks at once.
    fn simulate(
        layouts: &[InPlaceLayout],
        hosts: &mut [Vec<f32>],
        k: usize,
        scatter: bool,
    ) -> Vec<Vec<f32>> {
        // Stale staging memory: whatever the collective reads without it being uploaded or
        // zeroed shows up as NaN.
        let mut dev: Vec<Vec<f32>> = layouts.iter().map(|l| vec![f32::NAN; l.padded]).collect();
        for ((d, l), h) in dev.iter_mut().zip(layouts).zip(hosts.iter()) {
            d[l.upload.clone()].copy_from_slice(&h[l.upload.clone()]);
            d[l.zero.clone()].fill(0.0);
        }
        let world = hosts.len();
        let before = dev.clone();
        for (r, d) in dev.iter_mut().enumerate() {
            for q in 0..world {
                let own = q * k..(q + 1) * k;
                if scatter && q == r {
                    // ncclReduceScatter(buf, buf + r·k, k): rank r's chunk = Σ ranks' chunk r.
                    for i in own {
                        d[i] = before.iter().map(|b| b[i]).sum();
                    }
                } else if !scatter {
                    // ncclAllGather(buf + q·k, buf, k): chunk q comes from rank q.
                    d[own.clone()].copy_from_slice(&before[q][own]);
                }
            }
        }
        for ((d, l), h) in dev.iter().zip(layouts).zip(hosts.iter_mut()) {
            h[l.download.clone()].copy_from_slice(&d[l.download.clone()]);
        }
        dev
    }

    #[test]
    fn in_place_staging_layouts_give_local_group_results_and_never_read_stale_memory() {
        for world in 1..=4 {
            for (len, k) in [(17, 16), (37, 16), (64, 16), (5, 2), (0, 4)] {
                if len > world * k {
                    continue;
                }
                let data = |r: usize| {
                    (0..len)
                        .map(|i| ((i * 7 + r * 13) % 17) as f32 * 0.1 - 0.77)
                        .collect::<Vec<f32>>()
                };
                let mut hosts: Vec<Vec<f32>> = (0..world).map(data).collect();
                let rs: Vec<_> =
                    (0..world).map(|r| InPlaceLayout::reduce_scatter(len, k, world, r)).collect();
                let dev = simulate(&rs, &mut hosts, k, true);
                for (r, d) in dev.iter().enumerate() {
                    assert!(
                        d[r * k..(r + 1) * k].iter().all(|x| x.is_finite()),
                        "world {world} len {len}: reduce-scatter read stale memory"
                    );
                }
                let scattered = hosts.clone();
                let ag: Vec<_> =
                    (0..world).map(|r| InPlaceLayout::all_gather(len, k, world, r)).collect();
                let dev = simulate(&ag, &mut hosts, k, false);
                assert!(
                    dev.iter().all(|d| d.iter().all(|x| x.is_finite())),
                    "world {world} len {len}: all-gather read stale memory"
                );
                // The same program on in-process ranks.
                let local: Vec<(Vec<f32>, Vec<f32>)> = std::thread::scope(|s| {
                    let hs: Vec<_> = super::super::LocalGroup::new(world)
                        .into_iter()
                        .map(|g| {
                            s.spawn(move || {
                                let mut b = data(g.rank());
                                g.reduce_scatter_in_place(&mut b, k, ReduceOp::Sum).unwrap();
                                let scattered = b.clone();
                                g.all_gather_in_place(&mut b, k).unwrap();
                                (scattered, b)
                            })
                        })
                        .collect();
                    hs.into_iter().map(|h| h.join().unwrap()).collect()
                });
                for (r, (ls, lg)) in local.iter().enumerate() {
                    let mine = chunk(len, k, r);
                    // LocalGroup sums in f64 and rounds once; the simulation sums in f32.
                    for (a, b) in scattered[r][mine.clone()].iter().zip(&ls[mine.clone()]) {
                        assert!(
                            (a - b).abs() <= 1e-6,
                            "world {world} len {len} rank {r}: {a} vs {b}"
                        );
                    }
                    for (a, b) in hosts[r].iter().zip(lg) {
                        assert!(
                            (a - b).abs() <= 1e-6,
                            "world {world} len {len} rank {r}: {a} vs {b}"
                        );
                    }
                }
            }
        }
    }
}
