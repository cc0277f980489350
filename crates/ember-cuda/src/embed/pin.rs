//! L2 pinning (the [`super::Variant::L2Pin`] and [`super::Variant::Combined`] variants): a
//! persisting access-policy window over the region of renumbered hot rows, set on the compute
//! stream when a runner is made and cleared when it is dropped.

use cudarc::driver::sys;

use super::{EmbedRun, GpuEmbeddings, PinInfo};
use crate::device::{Gpu, dptr};
use crate::error::{CudaError, DriverCtx, Result};

impl GpuEmbeddings {
    /// Sets a persisting access-policy window over the hot region on the compute stream.
    pub(super) fn pin_l2(&self) -> Result<PinInfo> {
        let gpu = &self.gpu;
        let info = gpu.info();
        let hot = self.hot.as_ref().expect("checked by the caller");
        let persisting = info.max_persisting_l2_bytes.min(self.hot_bytes);
        if persisting == 0 || info.max_window_bytes == 0 {
            return Err(CudaError::Unavailable(format!(
                "{} does not support persisting L2 accesses",
                info.name
            )));
        }
        gpu.context()
            .set_limit(
                sys::CUlimit::CU_LIMIT_PERSISTING_L2_CACHE_SIZE,
                info.max_persisting_l2_bytes,
            )
            .ctx("setting the persisting L2 size")?;
        let window = self.hot_bytes.min(info.max_window_bytes);
        let hit_ratio = (info.max_persisting_l2_bytes as f64 / window as f64).min(1.0) as f32;
        set_window(gpu, dptr(hot, gpu.compute()), window, hit_ratio)?;
        Ok(PinInfo {
            window_bytes: window,
            hit_ratio,
            persisting_bytes: info.max_persisting_l2_bytes,
        })
    }
}

/// Sets (or with `bytes == 0` clears) the compute stream's access-policy window.
pub(super) fn set_window(gpu: &Gpu, base: u64, bytes: usize, hit_ratio: f32) -> Result<()> {
    // SAFETY: a zeroed launch-attribute value is a valid (empty) union; we then set the
    // access-policy member, the one the attribute id below reads.
    let mut v: sys::CUstreamAttrValue = unsafe { std::mem::zeroed() };
    v.accessPolicyWindow = sys::CUaccessPolicyWindow {
        base_ptr: base as *mut std::ffi::c_void,
        num_bytes: bytes,
        hitRatio: hit_ratio,
        hitProp: sys::CUaccessProperty::CU_ACCESS_PROPERTY_PERSISTING,
        missProp: sys::CUaccessProperty::CU_ACCESS_PROPERTY_STREAMING,
    };
    gpu.context().bind_to_thread().ctx("binding the context")?;
    // SAFETY: a live stream of the bound context and a fully initialised value.
    unsafe {
        sys::cuStreamSetAttribute(
            gpu.compute().cu_stream(),
            sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW,
            &v,
        )
    }
    .result()
    .ctx("setting the L2 access-policy window")
}

impl Drop for EmbedRun {
    fn drop(&mut self) {
        if self.pin.is_some() {
            // Clear the window so that later work on the stream is not steered, and release
            // the persisting lines.
            let _ = set_window(&self.gpu, 0, 0, 0.0);
            // SAFETY: a plain driver call on the bound context.
            let _ = unsafe { sys::cuCtxResetPersistingL2Cache() };
            let _ = self
                .gpu
                .context()
                .set_limit(sys::CUlimit::CU_LIMIT_PERSISTING_L2_CACHE_SIZE, 0);
        }
    }
}
