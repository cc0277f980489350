//! A CUDA device, its streams, and a cache of compiled modules.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::CUdevice_attribute as Attr;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr};
use cudarc::nvrtc::Ptx;

use crate::error::{CudaError, DriverCtx, Result};
use crate::nvrtc::{compile_cubin, nvrtc_available};

/// Whether a CUDA device can be used here; why not when not (tests print it and skip).
pub fn cuda_available() -> Result<()> {
    // SAFETY: only tries to dlopen libcuda by its candidate names.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(CudaError::Unavailable(
            "the CUDA driver library (libcuda.so) is not installed".into(),
        ));
    }
    if !nvrtc_available() {
        return Err(CudaError::NoNvrtc);
    }
    // cudarc's CUDA 13 bindings call entry points (e.g. cuEventElapsedTime_v2) that older
    // drivers lack; they would panic at the call rather than return an error.
    let mut version = 0;
    // SAFETY: the library is present (checked above); cuDriverGetVersion needs no cuInit.
    let r = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut version) };
    if r != cudarc::driver::sys::CUresult::CUDA_SUCCESS {
        return Err(CudaError::Driver {
            what: "asking the driver's version",
            source: cudarc::driver::DriverError(r),
        });
    }
    if version < 12080 {
        return Err(CudaError::Unavailable(format!(
            "the CUDA driver supports CUDA {}.{}; Ember needs 12.8 or later",
            version / 1000,
            version % 1000 / 10
        )));
    }
    match CudaContext::device_count() {
        Ok(n) if n > 0 => Ok(()),
        Ok(_) => Err(CudaError::Unavailable(
            "the CUDA driver reports no device".into(),
        )),
        Err(source) => Err(CudaError::Driver {
            what: "starting the driver",
            source,
        }),
    }
}

/// What the device is.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GpuInfo {
    pub ordinal: usize,
    pub name: String,
    pub compute_capability: (i32, i32),
    pub sms: i32,
    pub l2_bytes: usize,
    /// The most L2 that can be set aside for persisting accesses.
    pub max_persisting_l2_bytes: usize,
    /// The largest access-policy window.
    pub max_window_bytes: usize,
    /// Resident threads per SM at most (2048 on A100 / H100).
    pub max_threads_per_sm: usize,
    pub memory_bytes: usize,
}

/// One device: a context, a compute stream and a copy stream, and the modules compiled for it.
#[derive(Debug)]
pub struct Gpu {
    ctx: Arc<CudaContext>,
    compute: Arc<CudaStream>,
    copy: Arc<CudaStream>,
    info: GpuInfo,
    arch: String,
    modules: Mutex<HashMap<String, Arc<CudaModule>>>,
}

impl Gpu {
    /// Opens device `ordinal`. Fails, saying what is missing, where there is no CUDA.
    pub fn open(ordinal: usize) -> Result<Arc<Gpu>> {
        cuda_available()?;
        let n = CudaContext::device_count().ctx("counting devices")?;
        if ordinal >= n.max(0) as usize {
            return Err(CudaError::Unavailable(format!(
                "device {ordinal} asked for, the driver has {n}"
            )));
        }
        let ctx = CudaContext::new(ordinal).ctx("creating a context")?;
        // Ember orders its streams itself (events between the copy and compute streams), and
        // per-buffer event tracking would add two events to every launch argument.
        // SAFETY: every buffer is used on the compute stream, or on the copy stream with an
        // event the compute stream waits on before using it (see `model.rs`), and freed only
        // after both streams are synchronized.
        unsafe { ctx.disable_event_tracking() };
        let compute = ctx.new_stream().ctx("creating the compute stream")?;
        let copy = ctx.new_stream().ctx("creating the copy stream")?;
        let attr = |a: Attr| ctx.attribute(a).ctx("reading a device attribute");
        let cc = ctx
            .compute_capability()
            .ctx("reading the compute capability")?;
        let info = GpuInfo {
            ordinal,
            name: ctx.name().ctx("reading the device name")?,
            compute_capability: cc,
            sms: attr(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            l2_bytes: attr(Attr::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?.max(0) as usize,
            max_persisting_l2_bytes: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE)?
                .max(0) as usize,
            max_window_bytes: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE)?.max(0)
                as usize,
            max_threads_per_sm: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)?
                .max(0) as usize,
            memory_bytes: ctx.total_mem().ctx("reading the memory size")?,
        };
        Ok(Arc::new(Gpu {
            ctx,
            compute,
            copy,
            info,
            arch: format!("sm_{}{}", cc.0, cc.1),
            modules: Mutex::new(HashMap::new()),
        }))
    }

    pub fn info(&self) -> &GpuInfo {
        &self.info
    }

    /// The architecture kernels are compiled for (`sm_90` on an H100).
    pub fn arch(&self) -> &str {
        &self.arch
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream kernels run on.
    pub fn compute(&self) -> &Arc<CudaStream> {
        &self.compute
    }

    /// The stream host-device copies run on when they overlap compute.
    pub fn copy(&self) -> &Arc<CudaStream> {
        &self.copy
    }

    /// Function `func` of the module built from `src()` with `options`, compiled once per
    /// `name` (the cache key; it must name everything the source and options depend on).
    pub fn function(
        &self,
        name: &str,
        src: impl FnOnce() -> String,
        options: &[String],
        func: &str,
    ) -> Result<CudaFunction> {
        let module = {
            let mut m = self.modules.lock().unwrap_or_else(|e| e.into_inner());
            match m.get(name) {
                Some(module) => module.clone(),
                None => {
                    let cubin = compile_cubin(&src(), name, &self.arch, options)?;
                    let module = self
                        .ctx
                        .load_module(Ptx::from_binary(cubin))
                        .ctx("loading a compiled module")?;
                    m.insert(name.to_string(), module.clone());
                    module
                }
            }
        };
        module.load_function(func).ctx("finding a kernel")
    }

    /// A device-to-device copy of `bytes` (median of 7): GB/s of bytes read plus bytes written,
    /// as CUDA's bandwidthTest counts it.
    pub fn copy_bandwidth(&self, bytes: usize) -> Result<f64> {
        let s = &self.compute;
        let src = s.alloc_zeros::<u8>(bytes).ctx("allocating")?;
        let mut dst = s.alloc_zeros::<u8>(bytes).ctx("allocating")?;
        let mut times = Vec::new();
        for _ in 0..7 {
            let a = self.ctx.new_event(Some(TIMED)).ctx("creating an event")?;
            let b = self.ctx.new_event(Some(TIMED)).ctx("creating an event")?;
            a.record(s).ctx("recording an event")?;
            s.memcpy_dtod(&src, &mut dst).ctx("copying")?;
            b.record(s).ctx("recording an event")?;
            b.synchronize().ctx("copying")?;
            times.push(f64::from(a.elapsed_ms(&b).ctx("timing")?) / 1e3);
        }
        times.sort_by(f64::total_cmp);
        Ok(2.0 * bytes as f64 / times[times.len() / 2] / 1e9)
    }

    /// Waits for both streams.
    pub fn synchronize(&self) -> Result<()> {
        self.compute.synchronize().ctx("synchronizing")?;
        self.copy.synchronize().ctx("synchronizing")
    }
}

/// Flags of events that are timed (cudarc's default events do not record time).
pub(crate) const TIMED: cudarc::driver::sys::CUevent_flags =
    cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT;

/// The raw device address of a buffer (event tracking is off: see [`Gpu::open`]).
pub(crate) fn dptr<T>(s: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    let (p, _guard) = s.device_ptr(stream);
    p
}
