//! What the GPU tests share.

use std::sync::Arc;

use ember_cuda::{Gpu, cuda_available};

/// The device; a test that needs one and finds none fails saying so (it is built as ignored
/// where no device node was, and runs anyway with --include-ignored).
pub fn gpu() -> Arc<Gpu> {
    if let Err(why) = cuda_available() {
        match cfg!(ember_cuda_device) {
            true => panic!("a CUDA device was present when this test was built, and now: {why}"),
            false => panic!("this test needs a CUDA device: {why}"),
        }
    }
    Gpu::open(0).expect("a CUDA device is present")
}
