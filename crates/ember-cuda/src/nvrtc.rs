//! Run-time compilation with NVRTC, straight to a cubin for the device's architecture.
//!
//! A cubin rather than PTX: the NVRTC found at run time (often a PyTorch wheel's) can be newer
//! than the driver, and a driver refuses PTX of a newer ISA version, while it loads SASS of its
//! own major version.

use std::ffi::{CStr, CString, c_char};

use cudarc::nvrtc::sys;

use crate::error::{CudaError, Result};

/// Whether `libnvrtc` can be loaded.
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to dlopen the library by its candidate names.
    unsafe { sys::is_culib_present() }
}

/// NVRTC's version (major, minor).
pub fn nvrtc_version() -> Result<(i32, i32)> {
    if !nvrtc_available() {
        return Err(CudaError::NoNvrtc);
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present (checked above); both pointers are valid for writes.
    let r = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    check(r, "nvrtcVersion")?;
    Ok((major, minor))
}

fn check(r: sys::nvrtcResult, what: &str) -> Result<()> {
    if r == sys::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::Compile {
            kernel: what.into(),
            options: String::new(),
            log: format!("{r:?}"),
        })
    }
}

/// An NVRTC program, destroyed on drop.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program was created by nvrtcCreateProgram and is destroyed once.
        unsafe {
            sys::nvrtcDestroyProgram(&mut self.0);
        }
    }
}

impl Program {
    fn log(&self) -> String {
        let mut size = 0usize;
        // SAFETY: a live program; `size` is valid for writes.
        if unsafe { sys::nvrtcGetProgramLogSize(self.0, &mut size) }
            != sys::nvrtcResult::NVRTC_SUCCESS
        {
            return String::new();
        }
        let mut buf = vec![0 as c_char; size.max(1)];
        // SAFETY: `buf` holds `size` bytes, as NVRTC asked for.
        unsafe { sys::nvrtcGetProgramLog(self.0, buf.as_mut_ptr()) };
        // SAFETY: NVRTC writes a NUL-terminated string of `size` bytes (or `buf` stays zeroed).
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    }
}

/// Compiles `src` (named `name` in messages) for `arch` (e.g. `sm_90`) with extra `options`;
/// returns the cubin.
pub fn compile_cubin(src: &str, name: &str, arch: &str, options: &[String]) -> Result<Vec<u8>> {
    if !nvrtc_available() {
        return Err(CudaError::NoNvrtc);
    }
    let csrc = CString::new(src).map_err(|_| CudaError::Input("kernel source has a NUL".into()))?;
    let cname = CString::new(name).map_err(|_| CudaError::Input("kernel name has a NUL".into()))?;
    let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: both strings are NUL-terminated and outlive the program (it copies the source);
    // no headers are passed.
    let r = unsafe {
        sys::nvrtcCreateProgram(
            &mut prog,
            csrc.as_ptr(),
            cname.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    check(r, "nvrtcCreateProgram")?;
    let prog = Program(prog);
    let mut opts: Vec<String> = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".into(),
        "--fmad=true".into(),
    ];
    opts.extend(options.iter().cloned());
    let copts: Vec<CString> = opts
        .iter()
        .map(|o| CString::new(o.as_str()).expect("options have no NUL"))
        .collect();
    let ptrs: Vec<*const c_char> = copts.iter().map(|c| c.as_ptr()).collect();
    // SAFETY: a live program; `ptrs` points to `ptrs.len()` NUL-terminated strings that live
    // until the call returns.
    let r = unsafe { sys::nvrtcCompileProgram(prog.0, ptrs.len() as i32, ptrs.as_ptr()) };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(CudaError::Compile {
            kernel: name.into(),
            options: opts.join(" "),
            log: format!("{r:?}\n{}", prog.log()),
        });
    }
    let mut size = 0usize;
    check(
        // SAFETY: a compiled program; `size` is valid for writes.
        unsafe { sys::nvrtcGetCUBINSize(prog.0, &mut size) },
        "nvrtcGetCUBINSize",
    )?;
    if size == 0 {
        return Err(CudaError::Compile {
            kernel: name.into(),
            options: opts.join(" "),
            log: format!("no cubin for {arch} (a virtual architecture gives PTX only)"),
        });
    }
    let mut cubin = vec![0u8; size];
    check(
        // SAFETY: `cubin` holds the `size` bytes NVRTC reported.
        unsafe { sys::nvrtcGetCUBIN(prog.0, cubin.as_mut_ptr().cast()) },
        "nvrtcGetCUBIN",
    )?;
    Ok(cubin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_nvrtc_or_bad_source_is_an_error_not_a_panic() {
        let r = compile_cubin("this is not C++", "bad.cu", "sm_90", &[]);
        match r {
            // Without NVRTC the error path is what this checks; where build.rs found it, a
            // missing library now is a fault.
            Err(CudaError::NoNvrtc) => {
                if cfg!(ember_nvrtc) {
                    panic!("libnvrtc.so was found when this test was built and does not load now");
                }
            }
            Err(CudaError::Compile { kernel, log, .. }) => {
                assert_eq!(kernel, "bad.cu");
                assert!(log.contains("NVRTC_ERROR_COMPILATION"), "{log}");
            }
            other => panic!("expected a compile error, got {other:?}"),
        }
    }
}
