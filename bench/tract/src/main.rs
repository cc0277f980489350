// A graph model's `dense.onnx` (inputs dense [B, n], sparse [B, s]) on tract, f32, one thread: ms a
// batch, the median of ROUNDS rounds of about 0.2 s (the batch dimension left symbolic, as the
// export writes it). Usage: tractbench FILE DENSE_IN SPARSE_W BATCH ROUNDS
use std::time::Instant;
use tract_onnx::prelude::*;

fn main() -> TractResult<()> {
    let a: Vec<String> = std::env::args().collect();
    let (file, n, s, b, rounds): (&str, usize, usize, usize, usize) = (
        &a[1],
        a[2].parse()?,
        a[3].parse()?,
        a[4].parse()?,
        a[5].parse()?,
    );
    let t0 = Instant::now();
    let model = tract_onnx::onnx()
        .model_for_path(file)?
        .into_optimized()?
        .into_runnable()?;
    eprintln!("load+optimize {:.1} s", t0.elapsed().as_secs_f64());
    let mut x = 0x12345678u32;
    let mut r = || {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        (x as f32 / u32::MAX as f32) - 0.5
    };
    let d: Vec<f32> = (0..b * n).map(|_| 2.0 * r()).collect();
    let sp: Vec<f32> = (0..b * s).map(|_| r()).collect();
    let dt = tract_ndarray::Array2::from_shape_vec((b, n), d)?;
    let st = tract_ndarray::Array2::from_shape_vec((b, s), sp)?;
    let inputs = || {
        tvec!(
            Tensor::from(dt.clone()).into(),
            Tensor::from(st.clone()).into()
        )
    };
    let out = model.run(inputs())?;
    eprintln!(
        "outputs {:?}",
        out.iter().map(|t| t.shape().to_vec()).collect::<Vec<_>>()
    );
    let t = Instant::now();
    model.run(inputs())?;
    let iters = ((0.2 / t.elapsed().as_secs_f64().max(1e-6)) as usize).clamp(1, 10_000);
    let mut ms: Vec<f64> = (0..rounds)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                model.run(inputs()).unwrap();
            }
            t.elapsed().as_secs_f64() * 1e3 / iters as f64
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    println!("{}", ms[ms.len() / 2]);
    Ok(())
}
